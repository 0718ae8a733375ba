// Package storetest is the conformance suite every dedup.Store backend runs,
// in the spirit of testing/fstest. A backend's test calls Run with a Harness
// that opens a fresh, empty store on the suite's clock:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{
//			New: func(t testing.TB, now dedup.Clock) dedup.Store {
//				return memstore.New(memstore.Options{Now: now})
//			},
//		})
//	}
//
// The suite drives time with a FakeClock that starts at Epoch and moves only
// by whole seconds; a store must take every time it compares or records
// (lease, window, retention, FirstSeen, CompletedAt) from the clock it was
// given. Times are compared with time.Time.Equal, so any location and any
// precision down to one second passes.
//
// Contract points the suite pins down beyond the dedup.Store comments:
//   - a record is expired when now is past its ExpiresAt; the suite never
//     tests the exact boundary instant;
//   - a processing record whose lease expired reads as absent (Get returns
//     ErrNotFound), but the next Claim keeps its FirstSeen and increments
//     Attempts, as a Claim of a failed record does, and marks the record
//     MaybeProcessed. A background sweeper must
//     therefore not run during the suite (give the store a long sweep
//     interval in the Harness);
//   - a processed record past its window, a failed record past its retention,
//     a Release with Retain 0 and a Forget all leave the key truly absent: the
//     next Claim starts over with Attempts 1 and FirstSeen now;
//   - operations with an already cancelled context fail with an error that
//     wraps context.Canceled and change nothing;
//   - operations after Close fail with a non-nil error (ErrClosed preferred);
//   - List shows each key's record as Get does (without Owner and
//     Response), places settled records in time by CompletedAt and
//     processing ones by FirstSeen, and in key order with each key once
//     unless Harness.ListUnordered.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

// Harness tells the suite how to make a store of the backend under test.
type Harness struct {
	// New returns a fresh, empty store whose clock is now. Every time the store
	// compares or records must come from now. The suite closes the store (it
	// may call Close twice; the second call's error is ignored). New should
	// fail t (t.Fatal) if the store cannot be made.
	New func(t testing.TB, now dedup.Clock) dedup.Store
	// ListUnordered says the backend's List follows no order and may return
	// a key on two pages (Redis SCAN). False means the suite checks that
	// listings come in key order with each key once.
	ListUnordered bool
}

// Durations the suite uses. Whole seconds, so second-precision stores pass.
const (
	lease  = 10 * time.Second
	window = 60 * time.Second
	retain = time.Hour
)

type env struct {
	s   dedup.Store
	clk *FakeClock
	h   Harness
}

func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	clk := NewFakeClock(Epoch)
	s := h.New(t, clk.Now)
	if s == nil {
		t.Fatal("Harness.New returned a nil store")
	}
	t.Cleanup(func() { _ = s.Close() })
	return &env{s: s, clk: clk, h: h}
}

// Run runs the conformance suite against the backend h makes, each check in
// its own subtest with its own fresh store and clock.
func Run(t *testing.T, h Harness) {
	if h.New == nil {
		t.Fatal("storetest: Harness.New is nil")
	}
	tests := []struct {
		name string
		fn   func(t *testing.T, e *env)
	}{
		{"ClaimAbsent", testClaimAbsent},
		{"DuplicateAfterCommit", testDuplicateAfterCommit},
		{"DuplicateWithoutResponse", testDuplicateWithoutResponse},
		{"InFlightWhileLeased", testInFlight},
		{"ClaimRace", testClaimRace},
		{"ConcurrentCommits", testConcurrentCommits},
		{"WrongToken", testWrongToken},
		{"LateFinisherAfterTakeover", testLateFinisher},
		{"LateFinisherWithoutTakeover", testLateFinisherNoTakeover},
		{"LeaseExpiry", testLeaseExpiry},
		{"WindowExpiry", testWindowExpiry},
		{"WindowFixedAtCommit", testWindowFixed},
		{"FailedIsClaimable", testFailedClaimable},
		{"MaybeProcessed", testMaybeProcessed},
		{"BindFingerprint", testBindFingerprint},
		{"FailedRetentionExpiry", testFailedRetentionExpiry},
		{"ReleaseRetainZero", testRetainZero},
		{"Forget", testForget},
		{"ForgetIf", testForgetIf},
		{"Get", testGet},
		{"MillisecondTimes", testMillisecondTimes},
		{"NamespacesIsolate", testNamespaces},
		{"UnusualIDs", testUnusualIDs},
		{"ListStates", testListStates},
		{"ListTimeRange", testListTimeRange},
		{"ListPages", testListPages},
		{"ListExpired", testListExpired},
		{"ListNamespaces", testListNamespaces},
		{"ListForgotten", testListForgotten},
		{"ListBadCursor", testListBadCursor},
		{"Ping", testPing},
		{"CancelledContext", testCancelled},
		{"AfterClose", testAfterClose},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newEnv(t, h))
		})
	}
}

// --- helpers ---------------------------------------------------------------

func mustClaim(t *testing.T, s dedup.Store, k dedup.Key, want dedup.Outcome) dedup.ClaimResult {
	t.Helper()
	res, err := s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: lease})
	if err != nil {
		t.Fatalf("Claim(%q): got error %v, want nil", k, err)
	}
	if res.Outcome != want {
		t.Fatalf("Claim(%q): got outcome %v, want %v", k, res.Outcome, want)
	}
	if want == dedup.Claimed && res.Token == "" {
		t.Fatalf("Claim(%q): got empty token for a claimed key", k)
	}
	if want != dedup.Claimed && res.Token != "" {
		t.Fatalf("Claim(%q): got token %q for outcome %v, want empty", k, res.Token, want)
	}
	return res
}

// checkTookOver checks a Claimed result's TookOver: whether it took the key
// over from a lapsed lease.
func checkTookOver(t *testing.T, what string, res dedup.ClaimResult, want bool) {
	t.Helper()
	if res.TookOver != want {
		t.Errorf("%s: got TookOver %v, want %v", what, res.TookOver, want)
	}
}

func mustCommit(t *testing.T, s dedup.Store, k dedup.Key, token string, resp *dedup.Response) {
	t.Helper()
	status := 200
	if resp != nil {
		status = resp.Status
	}
	err := s.Commit(context.Background(), k, token, dedup.CommitOptions{Window: window, Status: status, Response: resp})
	if err != nil {
		t.Fatalf("Commit(%q): got error %v, want nil", k, err)
	}
}

func mustRelease(t *testing.T, s dedup.Store, k dedup.Key, token string, opts dedup.ReleaseOptions) {
	t.Helper()
	if err := s.Release(context.Background(), k, token, opts); err != nil {
		t.Fatalf("Release(%q): got error %v, want nil", k, err)
	}
}

func mustGet(t *testing.T, s dedup.Store, k dedup.Key) dedup.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), k)
	if err != nil {
		t.Fatalf("Get(%q): got error %v, want nil", k, err)
	}
	return rec
}

func mustAbsent(t *testing.T, s dedup.Store, k dedup.Key) {
	t.Helper()
	rec, err := s.Get(context.Background(), k)
	if !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Get(%q): got (%+v, %v), want ErrNotFound", k, rec, err)
	}
}

func wantErr(t *testing.T, op string, got, want error) {
	t.Helper()
	if !errors.Is(got, want) {
		t.Fatalf("%s: got error %v, want %v", op, got, want)
	}
}

func sameTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

func checkRecord(t *testing.T, what string, got dedup.Record, want dedup.Record) {
	t.Helper()
	if got.State != want.State {
		t.Errorf("%s: got State %q, want %q", what, got.State, want.State)
	}
	sameTime(t, what+" FirstSeen", got.FirstSeen, want.FirstSeen)
	sameTime(t, what+" CompletedAt", got.CompletedAt, want.CompletedAt)
	sameTime(t, what+" LeaseUntil", got.LeaseUntil, want.LeaseUntil)
	sameTime(t, what+" ExpiresAt", got.ExpiresAt, want.ExpiresAt)
	if got.Attempts != want.Attempts {
		t.Errorf("%s: got Attempts %d, want %d", what, got.Attempts, want.Attempts)
	}
	if got.LastStatus != want.LastStatus {
		t.Errorf("%s: got LastStatus %d, want %d", what, got.LastStatus, want.LastStatus)
	}
	if got.LastError != want.LastError {
		t.Errorf("%s: got LastError %q, want %q", what, got.LastError, want.LastError)
	}
	if got.MaybeProcessed != want.MaybeProcessed {
		t.Errorf("%s: got MaybeProcessed %v, want %v", what, got.MaybeProcessed, want.MaybeProcessed)
	}
}

// race runs n concurrent Claims of k released together and returns how many
// of each outcome came back.
func race(t *testing.T, s dedup.Store, k dedup.Key, n int) map[dedup.Outcome]int {
	t.Helper()
	start := make(chan struct{})
	var (
		mu     sync.Mutex
		counts = map[dedup.Outcome]int{}
		errs   []error
		wg     sync.WaitGroup
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: lease})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			counts[res.Outcome]++
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent Claim: got %d errors (first %v), want none", len(errs), errs[0])
	}
	return counts
}

var testResponse = &dedup.Response{
	Status: 201,
	Header: map[string][]string{
		"Content-Type": {"application/json"},
		"X-Multi":      {"a", "b, c", ""},
	},
	Body: append([]byte(`{"ok":true}`), 0x00, 0xff, '\n', '\r', 0x7f),
}

// --- tests -----------------------------------------------------------------

// testBindFingerprint: with BindFingerprint a live record bound to another
// fingerprint answers Conflict in every state and changes nothing; the same
// fingerprint, no fingerprint on either side, or an expired record behave
// as without it.
func testBindFingerprint(t *testing.T, e *env) {
	ctx := context.Background()
	fpA, fpB := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	claim := func(k dedup.Key, body, fp string, bind bool, want dedup.Outcome) dedup.ClaimResult {
		t.Helper()
		res, err := e.s.Claim(ctx, k, dedup.ClaimOptions{Lease: lease, BodySHA256: body, Fingerprint: fp, BindFingerprint: bind})
		if err != nil || res.Outcome != want {
			t.Fatalf("Claim(%q, fingerprint %.8q, bind %v): got (%v, %v), want (%v, nil)", k, fp, bind, res.Outcome, err, want)
		}
		if want == dedup.Conflict && res.Token != "" {
			t.Errorf("Claim(%q) conflict: got token %q, want none", k, res.Token)
		}
		return res
	}
	k := dedup.Key{Namespace: "api", ID: "key-1"}
	body := strings.Repeat("cd", 32)

	first := claim(k, body, fpA, true, dedup.Claimed)
	if res := claim(k, body, fpB, true, dedup.Conflict); res.Record.Fingerprint != fpA || res.Record.State != dedup.StateProcessing {
		t.Errorf("conflict while in flight: got record %q %.8q, want processing %.8q", res.Record.State, res.Record.Fingerprint, fpA)
	}
	claim(k, body, fpA, true, dedup.InFlight)
	claim(k, body, fpB, false, dedup.InFlight) // not binding: as before

	if err := e.s.Release(ctx, k, first.Token, dedup.ReleaseOptions{Retain: retain, Status: 500}); err != nil {
		t.Fatal(err)
	}
	if res := claim(k, body, fpB, true, dedup.Conflict); res.Record.State != dedup.StateFailed {
		t.Errorf("conflict on a failed key: got record %q, want failed", res.Record.State)
	}
	if rec := mustGet(t, e.s, k); rec.State != dedup.StateFailed || rec.Attempts != 1 || rec.Fingerprint != fpA {
		t.Errorf("failed key after a conflict: got %q, %d attempts, fingerprint %.8q; want failed, 1, %.8q (unchanged)", rec.State, rec.Attempts, rec.Fingerprint, fpA)
	}
	second := claim(k, body, fpA, true, dedup.Claimed)
	if second.Record.Attempts != 2 {
		t.Errorf("retry with the bound fingerprint: got %d attempts, want 2", second.Record.Attempts)
	}
	if err := e.s.Commit(ctx, k, second.Token, dedup.CommitOptions{Window: window, Status: 200}); err != nil {
		t.Fatal(err)
	}
	claim(k, body, fpB, true, dedup.Conflict)
	claim(k, body, fpA, true, dedup.Duplicate)

	// A lapsed lease stays bound.
	lapsed := dedup.Key{Namespace: "api", ID: "key-2"}
	claim(lapsed, body, fpA, true, dedup.Claimed)
	e.clk.Advance(lease + time.Second)
	claim(lapsed, body, fpB, true, dedup.Conflict)
	claim(lapsed, body, fpA, true, dedup.Claimed)

	// Fingerprints and bodies that are not hex digests.
	raw := dedup.Key{Namespace: "api", ID: "key-3"}
	claim(raw, "a body id that is not hex", "fp raw one", true, dedup.Claimed)
	claim(raw, "", "fp raw two", true, dedup.Conflict)
	claim(raw, "", "fp raw one", true, dedup.InFlight)

	// A record without a fingerprint binds nothing; an expired one is absent.
	none := dedup.Key{Namespace: "api", ID: "key-4"}
	claim(none, body, "", true, dedup.Claimed)
	claim(none, body, fpB, true, dedup.InFlight)
	e.clk.Advance(window + time.Second) // key-1's window is over
	claim(k, body, fpB, true, dedup.Claimed)
}

func testClaimAbsent(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	opts := dedup.ClaimOptions{Lease: lease, BodySHA256: strings.Repeat("ab", 32), Fingerprint: strings.Repeat("cd", 32)}
	res, err := e.s.Claim(context.Background(), k, opts)
	if err != nil {
		t.Fatalf("Claim: got error %v, want nil", err)
	}
	if res.Outcome != dedup.Claimed {
		t.Fatalf("Claim: got outcome %v, want claimed", res.Outcome)
	}
	if len(res.Token) < 16 {
		t.Errorf("Claim: got token %q, want at least 16 characters", res.Token)
	}
	want := dedup.Record{State: dedup.StateProcessing, FirstSeen: Epoch, LeaseUntil: Epoch.Add(lease), ExpiresAt: Epoch.Add(lease), Attempts: 1}
	checkRecord(t, "claim result", res.Record, want)
	checkRecord(t, "Get", mustGet(t, e.s, k), want)
	rec := mustGet(t, e.s, k)
	if rec.BodySHA256 != opts.BodySHA256 || rec.Fingerprint != opts.Fingerprint {
		t.Errorf("Get: got BodySHA256 %q Fingerprint %q, want %q %q", rec.BodySHA256, rec.Fingerprint, opts.BodySHA256, opts.Fingerprint)
	}

	// A second key is independent.
	res2 := mustClaim(t, e.s, dedup.Key{Namespace: "stripe", ID: "evt_2"}, dedup.Claimed)
	if res2.Token == res.Token {
		t.Errorf("two claims: got the same token %q twice, want distinct tokens", res.Token)
	}
}

func testDuplicateAfterCommit(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	body := strings.Repeat("ef", 32)
	res, err := e.s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: lease, BodySHA256: body})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
	committed := e.clk.Advance(2 * time.Second)
	mustCommit(t, e.s, k, res.Token, testResponse)

	e.clk.Advance(3 * time.Second)
	dup := mustClaim(t, e.s, k, dedup.Duplicate)
	want := dedup.Record{State: dedup.StateProcessed, FirstSeen: Epoch, CompletedAt: committed, ExpiresAt: committed.Add(window), Attempts: 1, LastStatus: 201}
	checkRecord(t, "duplicate claim", dup.Record, want)
	if dup.Record.BodySHA256 != body {
		t.Errorf("duplicate claim: got BodySHA256 %q, want %q", dup.Record.BodySHA256, body)
	}
	if !reflect.DeepEqual(dup.Record.Response, testResponse) {
		t.Errorf("duplicate claim: got Response %#v, want %#v", dup.Record.Response, testResponse)
	}
	checkRecord(t, "Get", mustGet(t, e.s, k), want)

	// Still a duplicate on every further claim.
	for i := range 3 {
		if got := mustClaim(t, e.s, k, dedup.Duplicate); got.Record.Attempts != 1 {
			t.Errorf("duplicate claim %d: got Attempts %d, want 1", i, got.Record.Attempts)
		}
	}
}

func testDuplicateWithoutResponse(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "gh", ID: "delivery-1"}
	res := mustClaim(t, e.s, k, dedup.Claimed)
	mustCommit(t, e.s, k, res.Token, nil)
	dup := mustClaim(t, e.s, k, dedup.Duplicate)
	if dup.Record.Response != nil {
		t.Errorf("duplicate claim: got Response %#v, want nil (none stored)", dup.Record.Response)
	}
	if dup.Record.LastStatus != 200 {
		t.Errorf("duplicate claim: got LastStatus %d, want 200", dup.Record.LastStatus)
	}
}

func testInFlight(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	first := mustClaim(t, e.s, k, dedup.Claimed)
	e.clk.Advance(lease - time.Second)
	got := mustClaim(t, e.s, k, dedup.InFlight)
	want := dedup.Record{State: dedup.StateProcessing, FirstSeen: Epoch, LeaseUntil: Epoch.Add(lease), ExpiresAt: Epoch.Add(lease), Attempts: 1}
	checkRecord(t, "in-flight claim", got.Record, want)
	// The in-flight probe did not take the key: the first owner can commit.
	mustCommit(t, e.s, k, first.Token, nil)
	mustClaim(t, e.s, k, dedup.Duplicate)
}

func testClaimRace(t *testing.T, e *env) {
	const n = 64
	tests := []struct {
		name  string
		setup func(t *testing.T, k dedup.Key) // leaves k claimable
	}{
		{"absent", func(t *testing.T, k dedup.Key) {}},
		{"failed", func(t *testing.T, k dedup.Key) {
			res := mustClaim(t, e.s, k, dedup.Claimed)
			mustRelease(t, e.s, k, res.Token, dedup.ReleaseOptions{Retain: retain, Status: 500})
		}},
		{"lease expired", func(t *testing.T, k dedup.Key) {
			mustClaim(t, e.s, k, dedup.Claimed)
			e.clk.Advance(lease + time.Second)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := dedup.Key{Namespace: "race", ID: tt.name}
			tt.setup(t, k)
			counts := race(t, e.s, k, n)
			if counts[dedup.Claimed] != 1 || counts[dedup.InFlight] != n-1 {
				t.Errorf("%d concurrent claims: got %d claimed, %d in-flight, %d duplicate; want 1, %d, 0",
					n, counts[dedup.Claimed], counts[dedup.InFlight], counts[dedup.Duplicate], n-1)
			}
		})
	}
}

func testConcurrentCommits(t *testing.T, e *env) {
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			k := dedup.Key{Namespace: "many", ID: "evt_" + strconv.Itoa(i)}
			res, err := e.s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: lease})
			if err != nil {
				errs <- err
				return
			}
			if res.Outcome != dedup.Claimed {
				errs <- errors.New("claim of " + k.String() + ": got " + res.Outcome.String() + ", want claimed")
				return
			}
			if err := e.s.Commit(context.Background(), k, res.Token, dedup.CommitOptions{Window: window, Status: 200}); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent claim+commit: got error %v, want nil", err)
	}
	for i := range n {
		mustClaim(t, e.s, dedup.Key{Namespace: "many", ID: "evt_" + strconv.Itoa(i)}, dedup.Duplicate)
	}
}

func testWrongToken(t *testing.T, e *env) {
	ctx := context.Background()
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	absent := dedup.Key{Namespace: "stripe", ID: "never_claimed"}
	res := mustClaim(t, e.s, k, dedup.Claimed)
	want := res.Record

	tests := []struct {
		name string
		call func() error
	}{
		{"commit wrong token", func() error {
			return e.s.Commit(ctx, k, "not-the-token", dedup.CommitOptions{Window: window, Status: 200})
		}},
		{"release wrong token", func() error {
			return e.s.Release(ctx, k, "not-the-token", dedup.ReleaseOptions{Retain: retain, Status: 500})
		}},
		{"commit empty token", func() error {
			return e.s.Commit(ctx, k, "", dedup.CommitOptions{Window: window, Status: 200})
		}},
		{"release empty token", func() error {
			return e.s.Release(ctx, k, "", dedup.ReleaseOptions{Retain: retain})
		}},
		{"commit absent key", func() error {
			return e.s.Commit(ctx, absent, res.Token, dedup.CommitOptions{Window: window, Status: 200})
		}},
		{"release absent key", func() error {
			return e.s.Release(ctx, absent, res.Token, dedup.ReleaseOptions{Retain: retain})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, tt.name, tt.call(), dedup.ErrNotOwner)
			checkRecord(t, "Get after "+tt.name, mustGet(t, e.s, k), want)
			mustAbsent(t, e.s, absent)
		})
	}
	// The real owner still owns the key.
	mustCommit(t, e.s, k, res.Token, nil)
	mustClaim(t, e.s, k, dedup.Duplicate)
}

func testLateFinisher(t *testing.T, e *env) {
	ctx := context.Background()
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	a := mustClaim(t, e.s, k, dedup.Claimed)
	e.clk.Advance(lease + time.Second)
	b := mustClaim(t, e.s, k, dedup.Claimed)
	if a.Token == b.Token {
		t.Fatalf("takeover: got the old token %q again, want a fresh one", a.Token)
	}
	want := b.Record

	wantErr(t, "late Commit", e.s.Commit(ctx, k, a.Token, dedup.CommitOptions{Window: window, Status: 200, Response: testResponse}), dedup.ErrNotOwner)
	checkRecord(t, "Get after late Commit", mustGet(t, e.s, k), want)
	wantErr(t, "late Release", e.s.Release(ctx, k, a.Token, dedup.ReleaseOptions{Retain: retain, Status: 500}), dedup.ErrNotOwner)
	checkRecord(t, "Get after late Release", mustGet(t, e.s, k), want)
	mustClaim(t, e.s, k, dedup.InFlight)

	// The new owner finishes normally.
	mustRelease(t, e.s, k, b.Token, dedup.ReleaseOptions{Retain: retain, Status: 502})
	if got := mustGet(t, e.s, k); got.State != dedup.StateFailed || got.LastStatus != 502 {
		t.Errorf("Get after new owner's Release: got %q/%d, want failed/502", got.State, got.LastStatus)
	}
	// And the old owner still cannot touch the failed record.
	wantErr(t, "late Commit on failed", e.s.Commit(ctx, k, a.Token, dedup.CommitOptions{Window: window, Status: 200}), dedup.ErrNotOwner)
	// Nor the new owner, whose claim ended with the release.
	wantErr(t, "Commit after own Release", e.s.Commit(ctx, k, b.Token, dedup.CommitOptions{Window: window, Status: 200}), dedup.ErrNotOwner)
	if got := mustGet(t, e.s, k); got.State != dedup.StateFailed {
		t.Errorf("Get after refused commits: got state %q, want failed", got.State)
	}
}

// testLateFinisherNoTakeover: an owner whose lease ran out but whose key
// nobody claimed since still commits (the upstream did answer 2xx), and
// still releases; the token, not the lease, decides (dedup.LeaseGrace).
func testLateFinisherNoTakeover(t *testing.T, e *env) {
	ctx := context.Background()
	k := dedup.Key{Namespace: "stripe", ID: "evt_late"}
	a := mustClaim(t, e.s, k, dedup.Claimed)
	e.clk.Advance(lease + time.Second)
	if err := e.s.Commit(ctx, k, a.Token, dedup.CommitOptions{Window: window, Status: 200}); err != nil {
		t.Fatalf("late Commit by the owner nobody replaced: got %v, want nil", err)
	}
	if got := mustGet(t, e.s, k); got.State != dedup.StateProcessed {
		t.Errorf("Get after late Commit: got state %q, want processed", got.State)
	}
	mustClaim(t, e.s, k, dedup.Duplicate)

	k2 := dedup.Key{Namespace: "stripe", ID: "evt_late_fail"}
	b := mustClaim(t, e.s, k2, dedup.Claimed)
	e.clk.Advance(lease + time.Second)
	if err := e.s.Release(ctx, k2, b.Token, dedup.ReleaseOptions{Retain: retain, Status: 503}); err != nil {
		t.Fatalf("late Release by the owner nobody replaced: got %v, want nil", err)
	}
	if got := mustGet(t, e.s, k2); got.State != dedup.StateFailed || got.LastStatus != 503 {
		t.Errorf("Get after late Release: got %q/%d, want failed/503", got.State, got.LastStatus)
	}
	mustClaim(t, e.s, k2, dedup.Claimed)
}

func testLeaseExpiry(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	checkTookOver(t, "first claim", mustClaim(t, e.s, k, dedup.Claimed), false)
	e.clk.Advance(lease - time.Second)
	mustClaim(t, e.s, k, dedup.InFlight)
	now := e.clk.Advance(2 * time.Second)
	mustAbsent(t, e.s, k)
	res := mustClaim(t, e.s, k, dedup.Claimed)
	checkTookOver(t, "claim after lease expiry", res, true)
	// The lapsed attempt ended unseen (its owner crashed or hung): the
	// application may have processed it.
	want := dedup.Record{State: dedup.StateProcessing, FirstSeen: Epoch, LeaseUntil: now.Add(lease), ExpiresAt: now.Add(lease), Attempts: 2, MaybeProcessed: true}
	checkRecord(t, "claim after lease expiry", res.Record, want)
	checkRecord(t, "Get", mustGet(t, e.s, k), want)

	// A failed attempt's history stays beside the mark.
	k2 := dedup.Key{Namespace: "stripe", ID: "evt_2"}
	first := e.clk.Now()
	mustRelease(t, e.s, k2, mustClaim(t, e.s, k2, dedup.Claimed).Token, dedup.ReleaseOptions{Retain: retain, Status: 502, Error: strings.Repeat("refused ", 20)})
	checkTookOver(t, "claim of a failed key", mustClaim(t, e.s, k2, dedup.Claimed), false)
	now = e.clk.Advance(lease + time.Second)
	want = dedup.Record{State: dedup.StateProcessing, FirstSeen: first, LeaseUntil: now.Add(lease), ExpiresAt: now.Add(lease), Attempts: 3,
		LastStatus: 502, LastError: strings.Repeat("refused ", 20), MaybeProcessed: true}
	res = mustClaim(t, e.s, k2, dedup.Claimed)
	checkTookOver(t, "claim after a failure and a lapsed lease", res, true)
	checkRecord(t, "claim after a failure and a lapsed lease", res.Record, want)
	checkRecord(t, "Get after a failure and a lapsed lease", mustGet(t, e.s, k2), want)
}

func testWindowExpiry(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	res := mustClaim(t, e.s, k, dedup.Claimed)
	committed := e.clk.Advance(time.Second)
	mustCommit(t, e.s, k, res.Token, nil)
	e.clk.Advance(window - time.Second)
	mustClaim(t, e.s, k, dedup.Duplicate)
	now := e.clk.Advance(2 * time.Second)
	if !now.After(committed.Add(window)) {
		t.Fatalf("test bug: clock %v not past window end %v", now, committed.Add(window))
	}
	mustAbsent(t, e.s, k)
	again := mustClaim(t, e.s, k, dedup.Claimed)
	want := dedup.Record{State: dedup.StateProcessing, FirstSeen: now, LeaseUntil: now.Add(lease), ExpiresAt: now.Add(lease), Attempts: 1}
	checkRecord(t, "claim after window expiry", again.Record, want)
}

func testWindowFixed(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	res := mustClaim(t, e.s, k, dedup.Claimed)
	mustCommit(t, e.s, k, res.Token, nil)
	end := Epoch.Add(window)
	for e.clk.Now().Add(10 * time.Second).Before(end) {
		e.clk.Advance(10 * time.Second)
		dup := mustClaim(t, e.s, k, dedup.Duplicate)
		sameTime(t, "duplicate ExpiresAt", dup.Record.ExpiresAt, end)
	}
	e.clk.Advance(end.Sub(e.clk.Now()) + time.Second)
	mustClaim(t, e.s, k, dedup.Claimed)
}

func testFailedClaimable(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	a := mustClaim(t, e.s, k, dedup.Claimed)
	t1 := e.clk.Advance(2 * time.Second)
	mustRelease(t, e.s, k, a.Token, dedup.ReleaseOptions{Retain: retain, Status: 503})
	checkRecord(t, "Get after Release(503)", mustGet(t, e.s, k),
		dedup.Record{State: dedup.StateFailed, FirstSeen: Epoch, CompletedAt: t1, ExpiresAt: t1.Add(retain), Attempts: 1, LastStatus: 503})

	t2 := e.clk.Advance(5 * time.Second)
	b := mustClaim(t, e.s, k, dedup.Claimed)
	checkRecord(t, "claim of failed key", b.Record,
		dedup.Record{State: dedup.StateProcessing, FirstSeen: Epoch, LeaseUntil: t2.Add(lease), ExpiresAt: t2.Add(lease), Attempts: 2,
			LastStatus: b.Record.LastStatus, LastError: b.Record.LastError}) // history of the last attempt: either kept or cleared
	wantErr(t, "old token Commit after reclaim", e.s.Commit(context.Background(), k, a.Token, dedup.CommitOptions{Window: window, Status: 200}), dedup.ErrNotOwner)

	t3 := e.clk.Advance(3 * time.Second)
	mustRelease(t, e.s, k, b.Token, dedup.ReleaseOptions{Retain: retain, Error: "timeout"})
	checkRecord(t, "Get after Release(timeout)", mustGet(t, e.s, k),
		dedup.Record{State: dedup.StateFailed, FirstSeen: Epoch, CompletedAt: t3, ExpiresAt: t3.Add(retain), Attempts: 2, LastError: "timeout"})

	t4 := e.clk.Advance(time.Second)
	c := mustClaim(t, e.s, k, dedup.Claimed)
	mustCommit(t, e.s, k, c.Token, nil)
	checkRecord(t, "Get after Commit", mustGet(t, e.s, k),
		dedup.Record{State: dedup.StateProcessed, FirstSeen: Epoch, CompletedAt: t4, ExpiresAt: t4.Add(window), Attempts: 3, LastStatus: 200})
}

// testMaybeProcessed: a Release's MaybeProcessed is on the failed record,
// every Claim carries it over (also a takeover of a lapsed lease) until the
// owner settles the key again, and a Commit clears it.
func testMaybeProcessed(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	a := mustClaim(t, e.s, k, dedup.Claimed)
	t1 := e.clk.Advance(time.Second)
	mustRelease(t, e.s, k, a.Token, dedup.ReleaseOptions{Retain: retain, Error: "timeout", MaybeProcessed: true})
	failed := dedup.Record{State: dedup.StateFailed, FirstSeen: Epoch, CompletedAt: t1, ExpiresAt: t1.Add(retain), Attempts: 1, LastError: "timeout", MaybeProcessed: true}
	checkRecord(t, "Get after Release(MaybeProcessed)", mustGet(t, e.s, k), failed)
	_, listed := listAll(t, e, k.Namespace, dedup.ListOptions{States: []dedup.State{dedup.StateFailed}})
	checkRecord(t, "List after Release(MaybeProcessed)", listed[k.ID], failed)

	t2 := e.clk.Advance(time.Second)
	b := mustClaim(t, e.s, k, dedup.Claimed)
	processing := dedup.Record{State: dedup.StateProcessing, FirstSeen: Epoch, LeaseUntil: t2.Add(lease), ExpiresAt: t2.Add(lease), Attempts: 2,
		LastStatus: b.Record.LastStatus, LastError: b.Record.LastError, MaybeProcessed: true}
	checkRecord(t, "claim of a maybe-processed key", b.Record, processing)
	checkTookOver(t, "claim of a maybe-processed failed key", b, false)
	checkRecord(t, "Get while in flight", mustGet(t, e.s, k), processing)

	t3 := e.clk.Advance(lease + time.Second) // b's lease lapses: the next claim takes over
	c := mustClaim(t, e.s, k, dedup.Claimed)
	checkTookOver(t, "takeover of a lapsed claim", c, true)
	checkRecord(t, "takeover of a lapsed claim", c.Record,
		dedup.Record{State: dedup.StateProcessing, FirstSeen: Epoch, LeaseUntil: t3.Add(lease), ExpiresAt: t3.Add(lease), Attempts: 3,
			LastStatus: c.Record.LastStatus, LastError: c.Record.LastError, MaybeProcessed: true})

	t4 := e.clk.Advance(time.Second)
	mustRelease(t, e.s, k, c.Token, dedup.ReleaseOptions{Retain: retain, Status: 500})
	checkRecord(t, "Get after Release without MaybeProcessed (the store writes it as given)", mustGet(t, e.s, k),
		dedup.Record{State: dedup.StateFailed, FirstSeen: Epoch, CompletedAt: t4, ExpiresAt: t4.Add(retain), Attempts: 3, LastStatus: 500})

	d := mustClaim(t, e.s, k, dedup.Claimed)
	mustRelease(t, e.s, k, d.Token, dedup.ReleaseOptions{Retain: retain, Status: 502, MaybeProcessed: true})
	t5 := e.clk.Advance(time.Second)
	f := mustClaim(t, e.s, k, dedup.Claimed)
	mustCommit(t, e.s, k, f.Token, nil)
	processed := dedup.Record{State: dedup.StateProcessed, FirstSeen: Epoch, CompletedAt: t5, ExpiresAt: t5.Add(window), Attempts: 5, LastStatus: 200}
	checkRecord(t, "Get after Commit", mustGet(t, e.s, k), processed)
	checkRecord(t, "duplicate after Commit", mustClaim(t, e.s, k, dedup.Duplicate).Record, processed)
	forgotten, err := e.s.Forget(context.Background(), k, dedup.ForgetOptions{})
	if err != nil {
		t.Fatalf("Forget: got error %v, want nil", err)
	}
	checkRecord(t, "Forget's record", forgotten, processed)
	checkRecord(t, "claim after Forget", mustClaim(t, e.s, k, dedup.Claimed).Record,
		dedup.Record{State: dedup.StateProcessing, FirstSeen: t5, LeaseUntil: t5.Add(lease), ExpiresAt: t5.Add(lease), Attempts: 1})
}

func testFailedRetentionExpiry(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	a := mustClaim(t, e.s, k, dedup.Claimed)
	mustRelease(t, e.s, k, a.Token, dedup.ReleaseOptions{Retain: 30 * time.Second, Status: 500})
	e.clk.Advance(29 * time.Second)
	if got := mustGet(t, e.s, k); got.State != dedup.StateFailed {
		t.Fatalf("Get inside retention: got state %q, want failed", got.State)
	}
	now := e.clk.Advance(2 * time.Second)
	mustAbsent(t, e.s, k)
	res := mustClaim(t, e.s, k, dedup.Claimed)
	checkRecord(t, "claim after retention", res.Record,
		dedup.Record{State: dedup.StateProcessing, FirstSeen: now, LeaseUntil: now.Add(lease), ExpiresAt: now.Add(lease), Attempts: 1})
}

func testRetainZero(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	a := mustClaim(t, e.s, k, dedup.Claimed)
	mustRelease(t, e.s, k, a.Token, dedup.ReleaseOptions{Retain: 0, Status: 500})
	mustAbsent(t, e.s, k)
	if _, err := e.s.Forget(context.Background(), k, dedup.ForgetOptions{}); !errors.Is(err, dedup.ErrNotFound) {
		t.Errorf("Forget after Release(Retain 0): got %v, want ErrNotFound", err)
	}
	now := e.clk.Advance(time.Second)
	res := mustClaim(t, e.s, k, dedup.Claimed)
	checkRecord(t, "claim after Release(Retain 0)", res.Record,
		dedup.Record{State: dedup.StateProcessing, FirstSeen: now, LeaseUntil: now.Add(lease), ExpiresAt: now.Add(lease), Attempts: 1})
}

// UndecodableForget is one Forget a backend's own test runs on a record it
// cannot decode (which the suite cannot write), and whether it repairs
// the key (see dedup.Store.Forget).
type UndecodableForget struct {
	Name    string
	Opts    dedup.ForgetOptions
	Repairs bool
}

// UndecodableForgets are the Forgets of an undecodable record: one that
// asks for no state deletes it, keeping keys in flight or not, since no
// delivery can hold a key whose record cannot be read; one that asks for
// a state fails with the decoding error.
var UndecodableForgets = []UndecodableForget{
	{"unconditional", dedup.ForgetOptions{}, true},
	{"keep in flight", dedup.ForgetOptions{KeepInFlight: true}, true},
	{"state failed", dedup.ForgetOptions{State: dedup.StateFailed}, false},
	{"state failed, keep in flight", dedup.ForgetOptions{State: dedup.StateFailed, KeepInFlight: true}, false},
}

func testForget(t *testing.T, e *env) {
	ctx := context.Background()
	tests := []struct {
		name  string
		setup func(t *testing.T, k dedup.Key) (token string)
		want  dedup.State // "": ErrNotFound
	}{
		{"absent", func(t *testing.T, k dedup.Key) string { return "" }, ""},
		{"processing", func(t *testing.T, k dedup.Key) string {
			return mustClaim(t, e.s, k, dedup.Claimed).Token
		}, dedup.StateProcessing},
		{"processed", func(t *testing.T, k dedup.Key) string {
			res := mustClaim(t, e.s, k, dedup.Claimed)
			mustCommit(t, e.s, k, res.Token, testResponse)
			return res.Token
		}, dedup.StateProcessed},
		{"failed", func(t *testing.T, k dedup.Key) string {
			res := mustClaim(t, e.s, k, dedup.Claimed)
			mustRelease(t, e.s, k, res.Token, dedup.ReleaseOptions{Retain: retain, Status: 500})
			return res.Token
		}, dedup.StateFailed},
		// An expired record behaves as an absent one: nothing existed.
		{"expired", func(t *testing.T, k dedup.Key) string {
			res := mustClaim(t, e.s, k, dedup.Claimed)
			mustCommit(t, e.s, k, res.Token, nil)
			e.clk.Advance(window + time.Second)
			return res.Token
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := dedup.Key{Namespace: "forget", ID: tt.name}
			token := tt.setup(t, k)
			var before dedup.Record
			if tt.want != "" {
				before = mustGet(t, e.s, k)
			}
			rec, err := e.s.Forget(ctx, k, dedup.ForgetOptions{})
			switch {
			case tt.want == "":
				wantErr(t, "Forget", err, dedup.ErrNotFound)
			case err != nil:
				t.Fatalf("Forget: got error %v, want nil", err)
			default:
				checkRecord(t, "Forget's record", rec, before)
				if rec.Owner != "" {
					t.Errorf("Forget's record: got Owner %q, want none", rec.Owner)
				}
			}
			mustAbsent(t, e.s, k)
			_, err = e.s.Forget(ctx, k, dedup.ForgetOptions{})
			wantErr(t, "second Forget", err, dedup.ErrNotFound)
			if token != "" {
				wantErr(t, "Commit by the owner before Forget", e.s.Commit(ctx, k, token, dedup.CommitOptions{Window: window, Status: 200}), dedup.ErrNotOwner)
				wantErr(t, "Release by the owner before Forget", e.s.Release(ctx, k, token, dedup.ReleaseOptions{Retain: retain}), dedup.ErrNotOwner)
				mustAbsent(t, e.s, k)
			}
			now := e.clk.Now()
			res := mustClaim(t, e.s, k, dedup.Claimed)
			checkRecord(t, "claim after Forget", res.Record,
				dedup.Record{State: dedup.StateProcessing, FirstSeen: now, LeaseUntil: now.Add(lease), ExpiresAt: now.Add(lease), Attempts: 1})
			if token != "" {
				wantErr(t, "Commit by the owner before Forget after a new claim", e.s.Commit(ctx, k, token, dedup.CommitOptions{Window: window, Status: 200}), dedup.ErrNotOwner)
			}
			mustCommit(t, e.s, k, res.Token, nil)
		})
	}
}

// testForgetIf checks a conditional Forget: it deletes only a record that
// meets its ForgetOptions, and otherwise returns the record with ErrKept
// and leaves the key exactly as it was.
func testForgetIf(t *testing.T, e *env) {
	ctx := context.Background()
	setups := []struct {
		name  string
		setup func(t *testing.T, k dedup.Key)
	}{
		{"processing", func(t *testing.T, k dedup.Key) { mustClaim(t, e.s, k, dedup.Claimed) }},
		{"processed", func(t *testing.T, k dedup.Key) {
			mustCommit(t, e.s, k, mustClaim(t, e.s, k, dedup.Claimed).Token, testResponse)
		}},
		{"failed", func(t *testing.T, k dedup.Key) {
			mustRelease(t, e.s, k, mustClaim(t, e.s, k, dedup.Claimed).Token, dedup.ReleaseOptions{Retain: retain, Status: 500})
		}},
		// A long last_error, so a backend that reads the mark past it
		// meets a length of more than one byte.
		{"failed, maybe processed", func(t *testing.T, k dedup.Key) {
			mustRelease(t, e.s, k, mustClaim(t, e.s, k, dedup.Claimed).Token,
				dedup.ReleaseOptions{Retain: retain, Error: strings.Repeat("cut ", 50), MaybeProcessed: true})
		}},
		{"processing, maybe processed", func(t *testing.T, k dedup.Key) {
			mustRelease(t, e.s, k, mustClaim(t, e.s, k, dedup.Claimed).Token, dedup.ReleaseOptions{Retain: retain, Status: 504, MaybeProcessed: true})
			mustClaim(t, e.s, k, dedup.Claimed)
		}},
	}
	tests := []struct {
		name    string
		opts    dedup.ForgetOptions
		forgets []string // the setups whose key it forgets
	}{
		{"state processing", dedup.ForgetOptions{State: dedup.StateProcessing}, []string{"processing", "processing, maybe processed"}},
		{"state processed", dedup.ForgetOptions{State: dedup.StateProcessed}, []string{"processed"}},
		{"state failed", dedup.ForgetOptions{State: dedup.StateFailed}, []string{"failed", "failed, maybe processed"}},
		{"unknown state", dedup.ForgetOptions{State: "bogus"}, nil},
		{"keep in flight", dedup.ForgetOptions{KeepInFlight: true}, []string{"processed", "failed", "failed, maybe processed"}},
		{"failed, keep in flight", dedup.ForgetOptions{State: dedup.StateFailed, KeepInFlight: true}, []string{"failed", "failed, maybe processed"}},
		{"processing, keep in flight", dedup.ForgetOptions{State: dedup.StateProcessing, KeepInFlight: true}, nil},
		{"keep maybe processed", dedup.ForgetOptions{KeepMaybeProcessed: true}, []string{"processing", "processed", "failed"}},
		{"failed, keep maybe processed", dedup.ForgetOptions{State: dedup.StateFailed, KeepMaybeProcessed: true}, []string{"failed"}},
		{"keep in flight and maybe processed", dedup.ForgetOptions{KeepInFlight: true, KeepMaybeProcessed: true}, []string{"processed", "failed"}},
	}
	n := 0
	for _, tt := range tests {
		for _, st := range setups {
			n++
			k := dedup.Key{Namespace: "forget-if", ID: fmt.Sprintf("k%d", n)}
			what := fmt.Sprintf("%s: Forget(%+v) of a %s key", tt.name, tt.opts, st.name)
			st.setup(t, k)
			before := mustGet(t, e.s, k)
			rec, err := e.s.Forget(ctx, k, tt.opts)
			if slices.Contains(tt.forgets, st.name) {
				if err != nil {
					t.Errorf("%s: got error %v, want nil", what, err)
				}
				checkRecord(t, what, rec, before)
				if _, err := e.s.Get(ctx, k); !errors.Is(err, dedup.ErrNotFound) {
					t.Errorf("%s: then Get got error %v, want ErrNotFound", what, err)
				}
				continue
			}
			if !errors.Is(err, dedup.ErrKept) {
				t.Errorf("%s: got error %v, want ErrKept", what, err)
			}
			checkRecord(t, what, rec, before)
			if rec.Owner != "" {
				t.Errorf("%s: got Owner %q, want none", what, rec.Owner)
			}
			checkRecord(t, what+", then Get", mustGet(t, e.s, k), before)
		}
	}

	// The conditions apply to live records only: an absent key, or one
	// whose record ran out, is not found whatever they say.
	k := dedup.Key{Namespace: "forget-if", ID: "lapsed"}
	mustClaim(t, e.s, k, dedup.Claimed)
	e.clk.Advance(lease + time.Second)
	for _, opts := range []dedup.ForgetOptions{{KeepInFlight: true}, {State: dedup.StateProcessing}} {
		if _, err := e.s.Forget(ctx, k, opts); !errors.Is(err, dedup.ErrNotFound) {
			t.Errorf("Forget(%+v) of a lapsed lease: got error %v, want ErrNotFound", opts, err)
		}
	}
	if _, err := e.s.Forget(ctx, dedup.Key{Namespace: "forget-if", ID: "absent"}, dedup.ForgetOptions{State: dedup.StateFailed}); !errors.Is(err, dedup.ErrNotFound) {
		t.Errorf("Forget of an absent key: got error %v, want ErrNotFound", err)
	}
}

func testGet(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "get", ID: "evt_1"}
	mustAbsent(t, e.s, k)

	a := mustClaim(t, e.s, k, dedup.Claimed)
	processing := mustGet(t, e.s, k)
	checkRecord(t, "Get processing", processing,
		dedup.Record{State: dedup.StateProcessing, FirstSeen: Epoch, LeaseUntil: Epoch.Add(lease), ExpiresAt: Epoch.Add(lease), Attempts: 1})
	if processing.Owner != "" {
		t.Errorf("Get processing: got Owner %q, want none (whoever reads a key may not settle it)", processing.Owner)
	}

	t1 := e.clk.Advance(time.Second)
	mustRelease(t, e.s, k, a.Token, dedup.ReleaseOptions{Retain: retain, Status: 500, Error: ""})
	checkRecord(t, "Get failed", mustGet(t, e.s, k),
		dedup.Record{State: dedup.StateFailed, FirstSeen: Epoch, CompletedAt: t1, ExpiresAt: t1.Add(retain), Attempts: 1, LastStatus: 500})

	t2 := e.clk.Advance(time.Second)
	b := mustClaim(t, e.s, k, dedup.Claimed)
	mustCommit(t, e.s, k, b.Token, &dedup.Response{Status: 202, Body: []byte("accepted")})
	got := mustGet(t, e.s, k)
	checkRecord(t, "Get processed", got,
		dedup.Record{State: dedup.StateProcessed, FirstSeen: Epoch, CompletedAt: t2, ExpiresAt: t2.Add(window), Attempts: 2, LastStatus: 202})

	// Get is read-only: it neither claims nor extends anything.
	e.clk.Advance(window + time.Second)
	mustAbsent(t, e.s, k)
}

// testMillisecondTimes checks that every time a store returns is UTC,
// truncated to the millisecond, whatever the clock's precision: the admin API
// and the duplicate acknowledgement show the same first_seen on every backend,
// before and after the record reaches disk.
func testMillisecondTimes(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "ms", ID: "evt_1"}
	t0 := e.clk.Advance(1234567 * time.Nanosecond).Truncate(time.Millisecond)
	a := mustClaim(t, e.s, k, dedup.Claimed)
	processing := dedup.Record{State: dedup.StateProcessing, FirstSeen: t0, LeaseUntil: t0.Add(lease), ExpiresAt: t0.Add(lease), Attempts: 1}
	checkMillis(t, "Claim", a.Record, processing)
	checkMillis(t, "Get processing", mustGet(t, e.s, k), processing)

	t1 := e.clk.Advance(time.Second + 999999*time.Nanosecond).Truncate(time.Millisecond)
	mustCommit(t, e.s, k, a.Token, nil)
	processed := dedup.Record{State: dedup.StateProcessed, FirstSeen: t0, CompletedAt: t1, ExpiresAt: t1.Add(window), Attempts: 1, LastStatus: 200}
	checkMillis(t, "Get processed", mustGet(t, e.s, k), processed)
	checkMillis(t, "duplicate Claim", mustClaim(t, e.s, k, dedup.Duplicate).Record, processed)
}

// checkMillis is checkRecord plus: every non-zero time is in UTC with no
// part below the millisecond.
func checkMillis(t *testing.T, what string, got, want dedup.Record) {
	t.Helper()
	checkRecord(t, what, got, want)
	for _, f := range []struct {
		name string
		tm   time.Time
	}{{"FirstSeen", got.FirstSeen}, {"CompletedAt", got.CompletedAt}, {"LeaseUntil", got.LeaseUntil}, {"ExpiresAt", got.ExpiresAt}} {
		name, tm := f.name, f.tm
		if tm.IsZero() {
			continue
		}
		if tm.Location() != time.UTC || tm.Nanosecond()%int(time.Millisecond) != 0 {
			t.Errorf("%s: got %s %s, want UTC whole milliseconds", what, name, tm.Format(time.RFC3339Nano+" MST"))
		}
	}
}

func testNamespaces(t *testing.T, e *env) {
	ids := []string{"evt_1", strings.Repeat("L", 1000)}
	for _, id := range ids {
		a := dedup.Key{Namespace: "route-a", ID: id}
		b := dedup.Key{Namespace: "route-b", ID: id}
		ra := mustClaim(t, e.s, a, dedup.Claimed)
		rb := mustClaim(t, e.s, b, dedup.Claimed)
		wantErr(t, "Commit of b with a's token", e.s.Commit(context.Background(), b, ra.Token, dedup.CommitOptions{Window: window, Status: 200}), dedup.ErrNotOwner)
		mustCommit(t, e.s, a, ra.Token, nil)
		mustClaim(t, e.s, a, dedup.Duplicate)
		mustClaim(t, e.s, b, dedup.InFlight)
		mustRelease(t, e.s, b, rb.Token, dedup.ReleaseOptions{Retain: retain, Status: 500})
		if got := mustGet(t, e.s, a); got.State != dedup.StateProcessed {
			t.Errorf("Get(a) after Release(b): got %q, want processed", got.State)
		}
		if _, err := e.s.Forget(context.Background(), b, dedup.ForgetOptions{}); err != nil {
			t.Errorf("Forget(b): got error %v, want nil", err)
		}
		mustClaim(t, e.s, a, dedup.Duplicate)
	}
}

func testUnusualIDs(t *testing.T, e *env) {
	long := strings.Repeat("x", 1000)
	ids := []struct{ name, id string }{
		{"long", long},
		{"long differing in last byte", long[:999] + "y"},
		{"long differing in first byte", "y" + long[1:]},
		{"201 bytes", strings.Repeat("z", 201)},
		{"colons", "evt:with:colons:"},
		{"leading colon", ":evt"},
		{"control chars", "ctl\x00\x01\n\t\r\x7f"},
		{"unicode", "unicode ✓ 日本語 🎉"},
		{"invalid utf-8", "\xff\xfe\xc0"},
		{"spaces", "  spaced id  "},
		{"path-like", "../../etc/passwd"},
		{"percent", "%2F%00%zz"},
		{"quotes", `"'{}[]\`},
	}
	tokens := make([]string, len(ids))
	for i, tt := range ids {
		tokens[i] = mustClaim(t, e.s, dedup.Key{Namespace: "odd", ID: tt.id}, dedup.Claimed).Token
	}
	for i, tt := range ids {
		t.Run(tt.name, func(t *testing.T) {
			k := dedup.Key{Namespace: "odd", ID: tt.id}
			mustCommit(t, e.s, k, tokens[i], &dedup.Response{Status: 200, Body: []byte(tt.id)})
			dup := mustClaim(t, e.s, k, dedup.Duplicate)
			if dup.Record.Response == nil || string(dup.Record.Response.Body) != tt.id {
				t.Errorf("duplicate claim: got Response %#v, want body %q", dup.Record.Response, tt.id)
			}
			if got := mustGet(t, e.s, k); got.State != dedup.StateProcessed {
				t.Errorf("Get: got state %q, want processed", got.State)
			}
		})
	}
	for _, tt := range ids {
		k := dedup.Key{Namespace: "odd", ID: tt.id}
		if _, err := e.s.Forget(context.Background(), k, dedup.ForgetOptions{}); err != nil {
			t.Errorf("Forget(%s): got %v, want nil", tt.name, err)
		}
		mustAbsent(t, e.s, k)
	}
}

func testPing(t *testing.T, e *env) {
	if err := e.s.Ping(context.Background()); err != nil {
		t.Errorf("Ping: got %v, want nil", err)
	}
}

// ops lists one call of every Store method on k with token, for the
// cancelled-context and after-close checks.
func ops(s dedup.Store, k dedup.Key, token string) []struct {
	name string
	call func(ctx context.Context) error
} {
	return []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Claim", func(ctx context.Context) error {
			_, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: lease})
			return err
		}},
		{"Commit", func(ctx context.Context) error {
			return s.Commit(ctx, k, token, dedup.CommitOptions{Window: window, Status: 200})
		}},
		{"Release", func(ctx context.Context) error {
			return s.Release(ctx, k, token, dedup.ReleaseOptions{Retain: retain, Status: 500})
		}},
		{"Get", func(ctx context.Context) error {
			_, err := s.Get(ctx, k)
			return err
		}},
		{"Forget", func(ctx context.Context) error {
			_, err := s.Forget(ctx, k, dedup.ForgetOptions{})
			return err
		}},
		{"List", func(ctx context.Context) error {
			_, err := s.List(ctx, k.Namespace, dedup.ListOptions{})
			return err
		}},
		{"Ping", func(ctx context.Context) error { return s.Ping(ctx) }},
	}
}

func testCancelled(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "ctx", ID: "evt_1"}
	fresh := dedup.Key{Namespace: "ctx", ID: "evt_2"}
	res := mustClaim(t, e.s, k, dedup.Claimed)
	want := res.Record
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, op := range append(ops(e.s, k, res.Token), ops(e.s, fresh, "")[0]) {
		t.Run(op.name, func(t *testing.T) {
			err := op.call(ctx)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s with cancelled context: got %v, want an error wrapping context.Canceled", op.name, err)
			}
		})
	}
	checkRecord(t, "Get after cancelled calls", mustGet(t, e.s, k), want)
	mustAbsent(t, e.s, fresh)
	mustCommit(t, e.s, k, res.Token, nil)
}

func testAfterClose(t *testing.T, e *env) {
	k := dedup.Key{Namespace: "closed", ID: "evt_1"}
	res := mustClaim(t, e.s, k, dedup.Claimed)
	if err := e.s.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
	for _, op := range ops(e.s, k, res.Token) {
		t.Run(op.name, func(t *testing.T) {
			if err := op.call(context.Background()); err == nil {
				t.Errorf("%s after Close: got nil error, want non-nil (ErrClosed)", op.name)
			}
		})
	}
}
