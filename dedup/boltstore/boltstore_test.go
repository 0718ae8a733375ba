package boltstore

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// openTemp opens a store on a fresh file in t's temp dir; the sweeper is off
// unless opts says otherwise. The caller closes it.
func openTemp(t testing.TB, opts Options) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dedup.db")
	if opts.SweepInterval == 0 {
		opts.SweepInterval = -1
	}
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open: got %v, want nil", err)
	}
	return s, path
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{New: func(t testing.TB, now dedup.Clock) dedup.Store {
		s, _ := openTemp(t, Options{Now: now, Logger: zaptest.NewLogger(t), SweepInterval: time.Hour})
		return s
	}})
}

func BenchmarkStore(b *testing.B) {
	storetest.Bench(b, storetest.Harness{New: func(t testing.TB, now dedup.Clock) dedup.Store {
		s, _ := openTemp(t, Options{Now: now})
		return s
	}})
}

func TestRecordsSurviveReopen(t *testing.T) {
	ctx := context.Background()
	clk := storetest.NewFakeClock(storetest.Epoch)
	s, path := openTemp(t, Options{Now: clk.Now})
	keys := map[string]dedup.Key{
		"processed": {Namespace: "n", ID: "processed"},
		"failed":    {Namespace: "n", ID: "failed"},
		"leased":    {Namespace: "n", ID: "leased"},
		"long":      {Namespace: "n", ID: strings.Repeat("x", 500)},
	}
	resp := &dedup.Response{Status: 201, Header: map[string][]string{"Content-Type": {"text/plain"}}, Body: []byte("ok")}
	claim := func(s *Store, k dedup.Key, want dedup.Outcome) dedup.ClaimResult {
		t.Helper()
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute, BodySHA256: strings.Repeat("0f", 32)})
		if err != nil || res.Outcome != want {
			t.Fatalf("Claim(%q): got (%v, %v), want (%v, nil)", k, res.Outcome, err, want)
		}
		return res
	}
	for _, name := range []string{"processed", "long"} {
		res := claim(s, keys[name], dedup.Claimed)
		if err := s.Commit(ctx, keys[name], res.Token, dedup.CommitOptions{Window: time.Hour, Status: 201, Response: resp}); err != nil {
			t.Fatalf("Commit(%s): %v", name, err)
		}
	}
	res := claim(s, keys["failed"], dedup.Claimed)
	if err := s.Release(ctx, keys["failed"], res.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 503}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	claim(s, keys["leased"], dedup.Claimed)
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	s, err := Open(path, Options{Now: clk.Now, SweepInterval: -1})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s.Close()
	for _, name := range []string{"processed", "long"} {
		dup := claim(s, keys[name], dedup.Duplicate)
		if dup.Record.Response == nil || string(dup.Record.Response.Body) != "ok" || dup.Record.Response.Header["Content-Type"][0] != "text/plain" {
			t.Errorf("%s after reopen: got Response %#v, want the stored one", name, dup.Record.Response)
		}
		if !dup.Record.FirstSeen.Equal(storetest.Epoch) || dup.Record.BodySHA256 != strings.Repeat("0f", 32) {
			t.Errorf("%s after reopen: got FirstSeen %v BodySHA256 %q, want %v and the claimed hash", name, dup.Record.FirstSeen, dup.Record.BodySHA256, storetest.Epoch)
		}
	}
	got, err := s.Get(ctx, keys["failed"])
	if err != nil || got.State != dedup.StateFailed || got.LastStatus != 503 || got.Attempts != 1 {
		t.Errorf("failed after reopen: got (%+v, %v), want failed/503/1 attempt", got, err)
	}
	// A lease dies with its process: the key is claimable at once.
	claim(s, keys["leased"], dedup.Claimed)
	if res := claim(s, keys["failed"], dedup.Claimed); res.Record.Attempts != 2 {
		t.Errorf("failed after reopen, claimed again: got Attempts %d, want 2", res.Record.Attempts)
	}
}

func TestSecondOpenFailsFast(t *testing.T) {
	s, path := openTemp(t, Options{})
	defer s.Close()
	start := time.Now()
	s2, err := Open(path, Options{OpenTimeout: 100 * time.Millisecond})
	took := time.Since(start)
	if err == nil {
		s2.Close()
		t.Fatal("second Open of a held file: got nil error, want a lock error")
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "locked by another process") {
		t.Errorf("second Open: got %q, want it to name %s and say it is locked", err, path)
	}
	if took > 5*time.Second {
		t.Errorf("second Open: took %v, want about the 100ms timeout", took)
	}
}

func TestSweepDeletesExpired(t *testing.T) {
	ctx := context.Background()
	clk := storetest.NewFakeClock(storetest.Epoch)
	s, _ := openTemp(t, Options{Now: clk.Now, SweepBatch: 7})
	defer s.Close()

	const n = 50
	for i := range n {
		k := dedup.Key{Namespace: "n", ID: "evt_" + strconv.Itoa(i)}
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
		}
		window := time.Duration(1+i%5) * time.Minute // 10 keys each at 1..5 minutes
		if i%2 == 0 {
			err = s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: window, Status: 200})
		} else {
			err = s.Release(ctx, k, res.Token, dedup.ReleaseOptions{Retain: window, Status: 500})
		}
		if err != nil {
			t.Fatalf("finish %d: %v", i, err)
		}
	}
	// One record rewritten to a later expiry keeps only its new index entry.
	k0 := dedup.Key{Namespace: "n", ID: "evt_1"} // failed, 2 minutes
	res, err := s.Claim(ctx, k0, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("reclaim: got (%v, %v)", res.Outcome, err)
	}
	if err := s.Commit(ctx, k0, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		advance     time.Duration
		wantDeleted int
		wantLeft    int
	}{
		{0, 0, n},
		{61 * time.Second, 10, 40},
		{60 * time.Second, 9, 31}, // evt_1 moved to an hour
		{3 * time.Minute, 30, 1},
		{time.Hour, 1, 0},
	}
	txs := 0
	s.onSweepTx = func(time.Duration) { txs++ } // Sweep runs on this goroutine
	for i, tt := range tests {
		clk.Advance(tt.advance)
		txs = 0
		got, err := s.Sweep(ctx)
		if err != nil || got != tt.wantDeleted {
			t.Errorf("step %d: Sweep: got (%d, %v), want (%d, nil)", i, got, err, tt.wantDeleted)
		}
		// Bounded batches: SweepBatch (7) records per transaction at most.
		if least := (tt.wantDeleted + 6) / 7; txs < least {
			t.Errorf("step %d: Sweep: got %d transactions for %d records, want at least %d (7 per transaction)", i, txs, tt.wantDeleted, least)
		}
		recs, idx, err := s.counts()
		if err != nil || recs != tt.wantLeft || idx != tt.wantLeft {
			t.Errorf("step %d: counts: got %d records, %d index entries (%v), want %d each", i, recs, idx, err, tt.wantLeft)
		}
	}
}

func TestExpiredReadsAbsentBeforeSweep(t *testing.T) {
	ctx := context.Background()
	clk := storetest.NewFakeClock(storetest.Epoch)
	s, _ := openTemp(t, Options{Now: clk.Now})
	defer s.Close()
	k := dedup.Key{Namespace: "n", ID: "a"}
	res, _ := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
	if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Minute, Status: 200}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	if _, err := s.Get(ctx, k); !errors.Is(err, dedup.ErrNotFound) {
		t.Errorf("Get of expired record: got %v, want ErrNotFound", err)
	}
	if recs, _, _ := s.counts(); recs != 1 {
		t.Errorf("records before sweep: got %d, want 1 (still on disk)", recs)
	}
}

func TestBackgroundSweeperRunsAndStops(t *testing.T) {
	ctx := context.Background()
	clk := storetest.NewFakeClock(storetest.Epoch)
	s, _ := openTemp(t, Options{Now: clk.Now, SweepInterval: time.Millisecond, Logger: zaptest.NewLogger(t)})
	k := dedup.Key{Namespace: "n", ID: "a"}
	res, _ := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
	if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Minute, Status: 200}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for {
		recs, _, err := s.counts()
		if err != nil {
			t.Fatal(err)
		}
		if recs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("background sweeper: got %d records after 5s, want 0", recs)
		}
		time.Sleep(time.Millisecond) // polling with a deadline, not synchronisation
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: got %v, want nil", err)
	}
	if _, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); !errors.Is(err, dedup.ErrClosed) {
		t.Errorf("Claim after Close: got %v, want ErrClosed", err)
	}
	if _, err := s.Sweep(ctx); !errors.Is(err, dedup.ErrClosed) {
		t.Errorf("Sweep after Close: got %v, want ErrClosed", err)
	}
	// goleak in TestMain checks the writer and sweeper goroutines are gone.
}

// A lease whose Commit is being written cannot be taken over even when it
// runs out meanwhile, and a failed write leaves it with its owner.
func TestFinishingLeaseIsNotTakenOver(t *testing.T) {
	ctx := context.Background()
	clk := storetest.NewFakeClock(storetest.Epoch)
	s, _ := openTemp(t, Options{Now: clk.Now})
	defer s.Close()
	k := dedup.Key{Namespace: "n", ID: "a"}
	res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Second})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
	rk := recordKey(k)
	l, err := s.beginFinish(rk, res.Token)
	if err != nil {
		t.Fatalf("beginFinish: %v", err)
	}
	clk.Advance(time.Minute)
	if got, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Second}); err != nil || got.Outcome != dedup.InFlight {
		t.Errorf("Claim during a finishing write: got (%v, %v), want (in-flight, nil)", got.Outcome, err)
	}
	if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); !errors.Is(err, dedup.ErrNotOwner) {
		t.Errorf("second Commit while the first is being written: got %v, want ErrNotOwner", err)
	}
	s.endFinish(rk, l, false) // the write failed: the owner keeps the lease
	if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
		t.Errorf("Commit after a failed write: got %v, want nil", err)
	}
	if got, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Second}); err != nil || got.Outcome != dedup.Duplicate {
		t.Errorf("Claim after Commit: got (%v, %v), want (duplicate, nil)", got.Outcome, err)
	}
}

// TestSweepKeepsLapsedLeaseForItsOwner: the sweeper must not drop a lease
// that ran out but was not taken over before dedup.LeaseGrace passed, or the
// owner's late commit (the upstream did answer 2xx) would be refused and the
// next retry forwarded again.
func TestSweepKeepsLapsedLeaseForItsOwner(t *testing.T) {
	ctx := context.Background()
	clk := storetest.NewFakeClock(storetest.Epoch)
	s, _ := openTemp(t, Options{Now: clk.Now, SweepInterval: -1})
	defer s.Close()
	tests := []struct {
		name      string
		lateBy    time.Duration
		wantError error
	}{
		{"within the grace", time.Second, nil},
		{"after the grace", dedup.LeaseGrace + time.Second, dedup.ErrNotOwner},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := dedup.Key{Namespace: "n", ID: tt.name}
			res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
			if err != nil || res.Outcome != dedup.Claimed {
				t.Fatalf("Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
			}
			clk.Advance(time.Minute + tt.lateBy)
			if _, err := s.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			err = s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
			if !errors.Is(err, tt.wantError) {
				t.Errorf("late Commit after a sweep: got %v, want %v", err, tt.wantError)
			}
		})
	}
}
