package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

// The List checks. What they hold every backend to is the contract on
// dedup.Store.List: live records only, of the one namespace, filtered,
// each key present throughout returned at least once, pages no larger than
// the limit, and a bad cursor refused. Unless Harness.ListUnordered, they
// also check key order and that no key comes twice.

// ListAll follows every page of s's listing of namespace with opts, from
// the start, and returns the entries in the order listed. It fails t on
// an error, a page larger than the limit, a Next that does not move on, or
// more pages than the keyspace could need. Backends' own List tests use it
// as the suite does.
func ListAll(t testing.TB, s dedup.Store, namespace string, opts dedup.ListOptions) []dedup.ListEntry {
	t.Helper()
	var entries []dedup.ListEntry
	opts.Cursor = ""
	for pages := 0; ; pages++ {
		if pages > 10_000 {
			t.Fatalf("List(%q): still no last page after %d pages", namespace, pages)
		}
		page, err := s.List(context.Background(), namespace, opts)
		if err != nil {
			t.Fatalf("List(%q, %+v): got error %v, want nil", namespace, opts, err)
		}
		if n, limit := len(page.Entries), opts.PageLimit(); n > limit {
			t.Fatalf("List(%q): got a page of %d entries, want at most %d", namespace, n, limit)
		}
		entries = append(entries, page.Entries...)
		if page.Next == "" {
			return entries
		}
		if page.Next == opts.Cursor {
			t.Fatalf("List(%q): got Next %q, the cursor it was given: the listing would never end", namespace, page.Next)
		}
		opts.Cursor = page.Next
	}
}

// listAll is ListAll on e's store, as the IDs in the order listed and the
// records by ID.
func listAll(t *testing.T, e *env, namespace string, opts dedup.ListOptions) ([]string, map[string]dedup.Record) {
	t.Helper()
	var ids []string
	recs := make(map[string]dedup.Record)
	for _, en := range ListAll(t, e.s, namespace, opts) {
		ids = append(ids, en.ID)
		recs[en.ID] = en.Record
	}
	return ids, recs
}

// checkListed fails t unless ids holds exactly the keys of want, once each
// and in key order unless the backend lists unordered (then at least once).
func checkListed(t *testing.T, e *env, what string, ids []string, want []string) {
	t.Helper()
	got := slices.Clone(ids)
	if e.h.ListUnordered {
		slices.Sort(got)
		got = slices.Compact(got)
	} else if !slices.IsSorted(got) {
		t.Errorf("%s: got IDs in the order %q, want key order", what, ids)
	}
	want = slices.Clone(want)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: got IDs %q, want %q", what, got, want)
	}
}

// listFixture makes keys in every state in namespace "list" and returns
// them by state. processed: committed at Epoch+2s; failed: released at
// Epoch+3s; retried: failed at Epoch+1s, claimed again and committed at
// Epoch+30s (FirstSeen Epoch); inflight: claimed at Epoch+30s. The clock
// stands at Epoch+30s.
func listFixture(t *testing.T, e *env) map[string]dedup.Key {
	ns := "list"
	k := func(id string) dedup.Key { return dedup.Key{Namespace: ns, ID: id} }
	keys := map[string]dedup.Key{
		"processed": k("evt_processed"),
		"failed":    k("evt_failed"),
		"retried":   k("evt_retried"),
		"inflight":  k("evt_inflight"),
	}
	p := mustClaim(t, e.s, keys["processed"], dedup.Claimed)
	f := mustClaim(t, e.s, keys["failed"], dedup.Claimed)
	r := mustClaim(t, e.s, keys["retried"], dedup.Claimed)
	e.clk.Advance(time.Second)
	mustRelease(t, e.s, keys["retried"], r.Token, dedup.ReleaseOptions{Retain: retain, Status: 500})
	e.clk.Advance(time.Second)
	mustCommit(t, e.s, keys["processed"], p.Token, &dedup.Response{Status: 200, Body: []byte("stored body")})
	e.clk.Advance(time.Second)
	mustRelease(t, e.s, keys["failed"], f.Token, dedup.ReleaseOptions{Retain: retain, Status: 503, Error: "upstream said no"})
	e.clk.Advance(27 * time.Second)
	r = mustClaim(t, e.s, keys["retried"], dedup.Claimed)
	mustCommit(t, e.s, keys["retried"], r.Token, nil)
	mustClaim(t, e.s, keys["inflight"], dedup.Claimed)
	return keys
}

func testListStates(t *testing.T, e *env) {
	keys := listFixture(t, e)
	id := func(names ...string) []string {
		var out []string
		for _, n := range names {
			out = append(out, keys[n].ID)
		}
		return out
	}
	tests := []struct {
		name   string
		states []dedup.State
		want   []string
	}{
		{"all", nil, id("processed", "failed", "retried", "inflight")},
		{"processed", []dedup.State{dedup.StateProcessed}, id("processed", "retried")},
		{"failed", []dedup.State{dedup.StateFailed}, id("failed")},
		{"processing", []dedup.State{dedup.StateProcessing}, id("inflight")},
		{"processed or failed", []dedup.State{dedup.StateFailed, dedup.StateProcessed}, id("processed", "failed", "retried")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids, recs := listAll(t, e, "list", dedup.ListOptions{States: tt.states})
			checkListed(t, e, "List", ids, tt.want)
			for _, id := range ids {
				rec := recs[id]
				// The entry is the key's record as Get shows it, minus the
				// stored response.
				checkRecord(t, "listed "+id, rec, mustGet(t, e.s, dedup.Key{Namespace: "list", ID: id}))
				if rec.Owner != "" || rec.Response != nil {
					t.Errorf("listed %s: got Owner %q and Response %v, want neither", id, rec.Owner, rec.Response)
				}
			}
		})
	}
}

func testListTimeRange(t *testing.T, e *env) {
	keys := listFixture(t, e)
	at := func(d time.Duration) time.Time { return Epoch.Add(d * time.Second) }
	tests := []struct {
		name         string
		since, until time.Time
		states       []dedup.State
		want         []string
	}{
		{"unbounded", time.Time{}, time.Time{}, nil, []string{"processed", "failed", "retried", "inflight"}},
		// Settled records are placed by CompletedAt: retried was first
		// seen at Epoch but processed at +30s.
		{"since +10s", at(10), time.Time{}, nil, []string{"retried", "inflight"}},
		{"until +10s", time.Time{}, at(10), nil, []string{"processed", "failed"}},
		{"since is inclusive", at(2), at(3), nil, []string{"processed"}},
		{"until is exclusive", at(1), at(2), nil, nil},
		{"processed in [+2s, +31s)", at(2), at(31), []dedup.State{dedup.StateProcessed}, []string{"processed", "retried"}},
		{"processed before +30s", time.Time{}, at(30), []dedup.State{dedup.StateProcessed}, []string{"processed"}},
		// A processing record is placed by FirstSeen, its only time.
		{"processing since +30s", at(30), time.Time{}, []dedup.State{dedup.StateProcessing}, []string{"inflight"}},
		{"processing until +30s", time.Time{}, at(30), []dedup.State{dedup.StateProcessing}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var want []string
			for _, n := range tt.want {
				want = append(want, keys[n].ID)
			}
			ids, _ := listAll(t, e, "list", dedup.ListOptions{States: tt.states, Since: tt.since, Until: tt.until})
			checkListed(t, e, "List", ids, want)
		})
	}
}

func testListPages(t *testing.T, e *env) {
	const n = 57
	var all, failed []string
	for i := range n {
		k := dedup.Key{Namespace: "pages", ID: fmt.Sprintf("evt_%03d", i)}
		res := mustClaim(t, e.s, k, dedup.Claimed)
		if i%10 == 3 {
			mustRelease(t, e.s, k, res.Token, dedup.ReleaseOptions{Retain: retain, Status: 500})
			failed = append(failed, k.ID)
		} else {
			mustCommit(t, e.s, k, res.Token, nil)
		}
		all = append(all, k.ID)
	}
	tests := []struct {
		name   string
		limit  int
		states []dedup.State
		want   []string
	}{
		{"limit 1", 1, nil, all},
		{"limit 5", 5, nil, all},
		{"limit 56", n - 1, nil, all},
		{"limit 57", n, nil, all},
		{"default limit", 0, nil, all},
		{"limit over the cap", dedup.MaxListLimit + 1, nil, all},
		{"limit 2, failed only", 2, []dedup.State{dedup.StateFailed}, failed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids, _ := listAll(t, e, "pages", dedup.ListOptions{Limit: tt.limit, States: tt.states})
			checkListed(t, e, "List", ids, tt.want)
		})
	}
}

func testListExpired(t *testing.T, e *env) {
	k := func(id string) dedup.Key { return dedup.Key{Namespace: "expiry", ID: id} }
	// Each record below outlives the one before it by a step of the clock.
	lapsed := mustClaim(t, e.s, k("lease_lapsed"), dedup.Claimed) // lease ends at +10s
	_ = lapsed
	a := mustClaim(t, e.s, k("window_over"), dedup.Claimed)
	mustCommit(t, e.s, k("window_over"), a.Token, nil) // window ends at +60s
	b := mustClaim(t, e.s, k("retention_over"), dedup.Claimed)
	if err := e.s.Release(context.Background(), k("retention_over"), b.Token, dedup.ReleaseOptions{Retain: 2 * window, Status: 500}); err != nil {
		t.Fatal(err)
	}
	c := mustClaim(t, e.s, k("live"), dedup.Claimed)
	if err := e.s.Commit(context.Background(), k("live"), c.Token, dedup.CommitOptions{Window: 4 * window, Status: 200}); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		advance time.Duration
		want    []string
	}{
		{0, []string{"lease_lapsed", "window_over", "retention_over", "live"}},
		{lease + time.Second, []string{"window_over", "retention_over", "live"}},
		{window, []string{"retention_over", "live"}},
		{window, []string{"live"}},
		{2 * window, nil},
	}
	for i, st := range steps {
		e.clk.Advance(st.advance)
		var want []string
		for _, id := range st.want {
			want = append(want, k(id).ID)
		}
		ids, _ := listAll(t, e, "expiry", dedup.ListOptions{Limit: 2})
		checkListed(t, e, fmt.Sprintf("List after step %d", i), ids, want)
	}
}

func testListNamespaces(t *testing.T, e *env) {
	// Namespaces that are prefixes of one another, and glob characters
	// (Redis MATCH patterns) in a namespace.
	namespaces := []string{"ns", "ns-b", "nsx", "n*", "n?", "n[s]", `n\`, "other"}
	for _, ns := range namespaces {
		for _, id := range []string{"evt_1", "evt_2"} {
			k := dedup.Key{Namespace: ns, ID: id + "_" + ns}
			mustCommit(t, e.s, k, mustClaim(t, e.s, k, dedup.Claimed).Token, nil)
		}
	}
	for _, ns := range namespaces {
		t.Run(ns, func(t *testing.T) {
			ids, _ := listAll(t, e, ns, dedup.ListOptions{Limit: 1})
			checkListed(t, e, "List", ids, []string{"evt_1_" + ns, "evt_2_" + ns})
		})
	}
	ids, _ := listAll(t, e, "absent", dedup.ListOptions{})
	checkListed(t, e, "List of a namespace without keys", ids, nil)
}

// testListForgotten checks that a forgotten key, and a key released with
// Retain 0, are not listed, and that a key forgotten and claimed again is
// listed as its new claim.
func testListForgotten(t *testing.T, e *env) {
	k := func(id string) dedup.Key { return dedup.Key{Namespace: "gone", ID: id} }
	for _, id := range []string{"forgotten", "reclaimed", "kept"} {
		mustCommit(t, e.s, k(id), mustClaim(t, e.s, k(id), dedup.Claimed).Token, nil)
	}
	mustRelease(t, e.s, k("released"), mustClaim(t, e.s, k("released"), dedup.Claimed).Token, dedup.ReleaseOptions{})
	for _, id := range []string{"forgotten", "reclaimed"} {
		if _, err := e.s.Forget(context.Background(), k(id), dedup.ForgetOptions{}); err != nil {
			t.Fatalf("Forget(%s): got %v, want nil", id, err)
		}
	}
	mustClaim(t, e.s, k("reclaimed"), dedup.Claimed)
	ids, recs := listAll(t, e, "gone", dedup.ListOptions{})
	checkListed(t, e, "List", ids, []string{"kept", "reclaimed"})
	if got := recs["reclaimed"].State; got != dedup.StateProcessing {
		t.Errorf("reclaimed: got state %q, want processing", got)
	}
}

func testListBadCursor(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "cursor", ID: "evt_1"}
	mustCommit(t, e.s, k, mustClaim(t, e.s, k, dedup.Claimed).Token, nil)
	for _, cursor := range []string{"not-a-cursor", "k@@@", "r@@@", "\x00", strings.Repeat("z", 300)} {
		t.Run(fmt.Sprintf("%q", cursor), func(t *testing.T) {
			page, err := e.s.List(context.Background(), "cursor", dedup.ListOptions{Cursor: cursor})
			if !errors.Is(err, dedup.ErrBadCursor) {
				t.Errorf("List with cursor %q: got (%+v, %v), want an error wrapping ErrBadCursor", cursor, page, err)
			}
		})
	}
}
