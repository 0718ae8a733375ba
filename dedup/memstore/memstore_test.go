package memstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func harness(interval time.Duration) storetest.Harness {
	return storetest.Harness{New: func(t testing.TB, now dedup.Clock) dedup.Store {
		return memstore.New(memstore.Options{Now: now, SweepInterval: interval})
	}}
}

func TestConformance(t *testing.T) {
	// The sweeper runs (real ticker, fake clock) but too rarely to matter.
	storetest.Run(t, harness(time.Hour))
}

func BenchmarkStore(b *testing.B) { storetest.Bench(b, harness(0)) }

func TestSweepDeletesExpired(t *testing.T) {
	clk := storetest.NewFakeClock(storetest.Epoch)
	s := memstore.New(memstore.Options{Now: clk.Now, SweepInterval: -1})
	defer s.Close()
	ctx := context.Background()

	claim := func(id string) string {
		t.Helper()
		res, err := s.Claim(ctx, dedup.Key{Namespace: "n", ID: id}, dedup.ClaimOptions{Lease: 10 * time.Second})
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("Claim(%s): got (%v, %v), want (claimed, nil)", id, res.Outcome, err)
		}
		return res.Token
	}
	if err := s.Commit(ctx, dedup.Key{Namespace: "n", ID: "short"}, claim("short"), dedup.CommitOptions{Window: 20 * time.Second, Status: 200}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, dedup.Key{Namespace: "n", ID: "long"}, claim("long"), dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, dedup.Key{Namespace: "n", ID: "failed"}, claim("failed"), dedup.ReleaseOptions{Retain: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	claim("leased")

	tests := []struct {
		advance   time.Duration
		wantSwept int
		wantLen   int
	}{
		{0, 0, 4},
		{6 * time.Second, 1, 3},  // failed retention over
		{5 * time.Second, 0, 3},  // lease over, but its owner may still commit
		{10 * time.Second, 1, 2}, // short window over
		{time.Hour, 2, 0},        // long window over; lease over by more than dedup.LeaseGrace
	}
	for i, tt := range tests {
		clk.Advance(tt.advance)
		if got := s.Sweep(); got != tt.wantSwept {
			t.Errorf("step %d: Sweep: got %d deleted, want %d", i, got, tt.wantSwept)
		}
		if got := s.Len(); got != tt.wantLen {
			t.Errorf("step %d: Len: got %d, want %d", i, got, tt.wantLen)
		}
	}
}

func TestSweeperRunsAndStops(t *testing.T) {
	clk := storetest.NewFakeClock(storetest.Epoch)
	s := memstore.New(memstore.Options{Now: clk.Now, SweepInterval: time.Millisecond})
	ctx := context.Background()
	res, err := s.Claim(ctx, dedup.Key{Namespace: "n", ID: "a"}, dedup.ClaimOptions{Lease: time.Second})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
	clk.Advance(time.Second + dedup.LeaseGrace + time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for s.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("sweeper: got %d records after 5s, want 0", s.Len())
		}
		time.Sleep(time.Millisecond) // polling with a deadline, not synchronisation
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: got %v, want nil", err)
	}
	if _, err := s.Get(ctx, dedup.Key{Namespace: "n", ID: "a"}); !errors.Is(err, dedup.ErrClosed) {
		t.Fatalf("Get after Close: got %v, want ErrClosed", err)
	}
}
