package boltstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

// The conformance suite with nothing checkpointed while it runs: every
// record it lists is a journaled write in memory, or a lease.
func TestConformanceJournalOnly(t *testing.T) {
	storetest.Run(t, storetest.Harness{New: func(t testing.TB, now dedup.Clock) dedup.Store {
		s, _ := openTemp(t, Options{Now: now, Logger: zaptest.NewLogger(t), SweepInterval: time.Hour, CheckpointInterval: -1})
		return s
	}})
}

// listIDs follows every page of a listing of namespace and returns the IDs
// and records in the order listed.
func listIDs(t *testing.T, s *Store, namespace string, opts dedup.ListOptions) ([]string, []dedup.Record) {
	t.Helper()
	var (
		ids  []string
		recs []dedup.Record
	)
	for _, e := range storetest.ListAll(t, s, namespace, opts) {
		ids = append(ids, e.ID)
		recs = append(recs, e.Record)
	}
	return ids, recs
}

// A listing shows each key as Get does, wherever its current state is: a
// lease, a journaled write not yet checkpointed, bbolt, or a journaled
// write over an older record in bbolt.
func TestListComposesLeasesJournalAndFile(t *testing.T) {
	ctx := context.Background()
	clk := storetest.NewFakeClock(storetest.Epoch)
	s, _ := openTemp(t, Options{Now: clk.Now, CheckpointInterval: -1})
	defer s.Close()
	const lease, window = 10 * time.Second, time.Hour
	k := func(id string) dedup.Key { return dedup.Key{Namespace: "mix", ID: id} }
	claim := func(id string) string {
		t.Helper()
		res, err := s.Claim(ctx, k(id), dedup.ClaimOptions{Lease: lease})
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("Claim(%s): got (%v, %v), want claimed", id, res.Outcome, err)
		}
		return res.Token
	}
	commit := func(id string) {
		t.Helper()
		if err := s.Commit(ctx, k(id), claim(id), dedup.CommitOptions{Window: window, Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	fail := func(id string) {
		t.Helper()
		if err := s.Release(ctx, k(id), claim(id), dedup.ReleaseOptions{Retain: window, Status: 500}); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint := func() {
		t.Helper()
		if err := s.flush(ctx); err != nil {
			t.Fatalf("flush: %v", err)
		}
	}

	// In bbolt, then changed in the journal or by a lease.
	commit("file_processed")
	commit("file_forgotten")
	fail("file_failed_then_processed")
	fail("file_failed_then_leased")
	fail("file_failed_lease_lapsed")
	checkpoint()
	if _, err := s.Forget(ctx, k("file_forgotten"), dedup.ForgetOptions{}); err != nil {
		t.Fatal(err)
	}
	commit("file_failed_then_processed")
	claim("file_failed_lease_lapsed")
	clk.Advance(lease + time.Second)
	claim("file_failed_then_leased")
	// Only in the journal, or only a lease.
	commit("journal_processed")
	fail("journal_failed")
	claim("lease_only")

	s.recentMu.RLock()
	n := len(s.recent)
	s.recentMu.RUnlock()
	if n == 0 {
		t.Fatal("the journal index is empty: the test shows nothing")
	}
	want := map[string]dedup.State{
		"file_processed":             dedup.StateProcessed,
		"file_failed_then_processed": dedup.StateProcessed,
		"file_failed_then_leased":    dedup.StateProcessing,
		"journal_processed":          dedup.StateProcessed,
		"journal_failed":             dedup.StateFailed,
		"lease_only":                 dedup.StateProcessing,
	}
	var wantIDs []string
	for id := range want {
		wantIDs = append(wantIDs, id)
	}
	slices.Sort(wantIDs)
	for _, limit := range []int{1, 2, 100} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			ids, recs := listIDs(t, s, "mix", dedup.ListOptions{Limit: limit})
			if !slices.Equal(ids, wantIDs) {
				t.Fatalf("List: got %q, want %q", ids, wantIDs)
			}
			for i, id := range ids {
				got, err := s.Get(ctx, k(id))
				if err != nil {
					t.Fatalf("Get(%s): %v", id, err)
				}
				if recs[i].State != want[id] || !recs[i].FirstSeen.Equal(got.FirstSeen) || !recs[i].ExpiresAt.Equal(got.ExpiresAt) || recs[i].Attempts != got.Attempts {
					t.Errorf("%s: got listed %+v, want %s as Get shows it: %+v", id, recs[i], want[id], got)
				}
			}
		})
	}
}

// Pages cross bbolt's read batches and the journal's keys between them,
// and pages cut short by the scan budget carry on where they stopped.
func TestListPagesAcrossBatches(t *testing.T) {
	ctx := context.Background()
	clk := storetest.NewFakeClock(storetest.Epoch)
	s, _ := openTemp(t, Options{Now: clk.Now, CheckpointInterval: -1})
	defer s.Close()
	const n = 2*listBatch + 37
	var all, failed []string
	for i := range n {
		id := fmt.Sprintf("evt_%04d", i)
		k := dedup.Key{Namespace: "batches", ID: id}
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if i%50 == 7 {
			err = s.Release(ctx, k, res.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 500})
			failed = append(failed, id)
		} else {
			err = s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
		}
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, id)
		if i%3 == 0 { // every third key reaches bbolt, the others stay journaled
			if err := s.flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name   string
		limit  int
		budget int
		states []dedup.State
		want   []string
	}{
		{"limit 7", 7, listScanBudget, nil, all},
		{"limit 1000", 1000, listScanBudget, nil, all},
		{"budget 5", 100, 5, nil, all},
		{"budget 3, failed only", 2, 3, []dedup.State{dedup.StateFailed}, failed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s.listBudget = tt.budget
			defer func() { s.listBudget = listScanBudget }()
			ids, _ := listIDs(t, s, "batches", dedup.ListOptions{Limit: tt.limit, States: tt.states})
			if !slices.Equal(ids, tt.want) {
				t.Errorf("List: got %d IDs %q, want %d", len(ids), ids, len(tt.want))
			}
		})
	}
}

// A listing running while other keys are committed, forgotten and
// checkpointed still returns every key that stays put, once, in order: it
// never looks between the journal and bbolt as a checkpoint moves a key.
func TestListWhileCheckpointing(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t, Options{CheckpointInterval: -1})
	defer s.Close()
	var stable []string
	for i := range 300 {
		id := fmt.Sprintf("evt_%03d", i)
		k := dedup.Key{Namespace: "busy", ID: id}
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
			t.Fatal(err)
		}
		stable = append(stable, id)
		if i == 150 {
			if err := s.flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // churn: keys between the stable ones, and checkpoints
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := dedup.Key{Namespace: "busy", ID: fmt.Sprintf("evt_%03d_churn", i%300)}
			if res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err == nil && res.Outcome == dedup.Claimed {
				_ = s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
			} else {
				_, _ = s.Forget(ctx, k, dedup.ForgetOptions{})
			}
			if i%7 == 0 {
				_ = s.flush(ctx)
			}
		}
	}()
	for round := range 20 {
		ids, _ := listIDs(t, s, "busy", dedup.ListOptions{Limit: 9})
		if !slices.IsSorted(ids) || len(slices.Compact(slices.Clone(ids))) != len(ids) {
			t.Errorf("round %d: got IDs out of order or repeated", round)
		}
		var got []string
		for _, id := range ids {
			if _, err := fmt.Sscanf(id, "evt_%d", new(int)); err == nil && len(id) == len("evt_000") {
				got = append(got, id)
			}
		}
		if !slices.Equal(got, stable) {
			t.Errorf("round %d: got %d stable IDs, want %d", round, len(got), len(stable))
		}
	}
	close(stop)
	wg.Wait()
}

// A checkpoint that moves the journaled keys into bbolt between a page's
// read of the journal's index and its read of bbolt loses none of them.
func TestListCheckpointBetweenReads(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t, Options{CheckpointInterval: -1})
	defer s.Close()
	var want []string
	for i := range 20 {
		k := dedup.Key{Namespace: "moving", ID: fmt.Sprintf("evt_%02d", i)}
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
			t.Fatal(err)
		}
		want = append(want, k.ID)
	}
	checkpoints := 0
	s.listRead = func() {
		checkpoints++
		if err := s.flush(ctx); err != nil {
			t.Errorf("flush: %v", err)
		}
	}
	ids, _ := listIDs(t, s, "moving", dedup.ListOptions{Limit: 1000})
	if !slices.Equal(ids, want) {
		t.Errorf("List with a checkpoint between its reads: got %q, want %q", ids, want)
	}
	s.recentMu.RLock()
	left := len(s.recent)
	s.recentMu.RUnlock()
	if checkpoints == 0 || left != 0 {
		t.Errorf("got %d checkpoints and %d journaled keys left, want some and none: the test shows nothing", checkpoints, left)
	}
}

func TestListAfterCloseAndBadCursor(t *testing.T) {
	s, _ := openTemp(t, Options{})
	if _, err := s.List(context.Background(), "n", dedup.ListOptions{Cursor: "nope"}); !errors.Is(err, dedup.ErrBadCursor) {
		t.Errorf("List with a bad cursor: got %v, want ErrBadCursor", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.List(context.Background(), "n", dedup.ListOptions{}); !errors.Is(err, dedup.ErrClosed) {
		t.Errorf("List after Close: got %v, want ErrClosed", err)
	}
}

// Keys held only in memory (a lease, a journaled write) that sort between
// keys in bbolt are listed in their place, and a journaled forget of a key
// that sorts after them still hides its bbolt record, at every page size.
func TestListInterleavesMemoryAndFile(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t, Options{CheckpointInterval: -1})
	defer s.Close()
	k := func(id string) dedup.Key { return dedup.Key{Namespace: "weave", ID: id} }
	claim := func(id string) string {
		t.Helper()
		res, err := s.Claim(ctx, k(id), dedup.ClaimOptions{Lease: time.Minute})
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("Claim(%s): got (%v, %v), want claimed", id, res.Outcome, err)
		}
		return res.Token
	}
	commit := func(id string) {
		t.Helper()
		if err := s.Commit(ctx, k(id), claim(id), dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"b_file", "d_file", "f_file", "g_forgotten", "h_file"} {
		commit(id)
	}
	if err := s.flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Forget(ctx, k("g_forgotten"), dedup.ForgetOptions{}); err != nil {
		t.Fatal(err)
	}
	commit("a_journal")
	claim("c_lease")
	if err := s.Release(ctx, k("e_journal_failed"), claim("e_journal_failed"), dedup.ReleaseOptions{Retain: time.Hour, Status: 500}); err != nil {
		t.Fatal(err)
	}
	want := []string{"a_journal", "b_file", "c_lease", "d_file", "e_journal_failed", "f_file", "h_file"}
	for _, limit := range []int{1, 2, 3, 100} {
		t.Run(fmt.Sprintf("limit %d", limit), func(t *testing.T) {
			ids, _ := listIDs(t, s, "weave", dedup.ListOptions{Limit: limit})
			if !slices.Equal(ids, want) {
				t.Errorf("List: got %q, want %q", ids, want)
			}
		})
	}
}
