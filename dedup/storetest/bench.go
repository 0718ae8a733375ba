package storetest

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

// Bench runs the same benchmarks against every backend, each a sub-benchmark
// on a fresh store that uses the real clock (time.Now):
//
//   - ClaimCommit: a new key claimed then committed, the forwarded path;
//   - ClaimCommitParallel: the same from 16×GOMAXPROCS goroutines (commits
//     of different keys may coalesce);
//   - ClaimCommitReplay: ClaimCommit storing a 1 KiB replay response;
//   - DuplicateClaim: a Claim of a processed key, the duplicate path;
//   - DuplicateClaimParallel: the same from GOMAXPROCS goroutines.
//
// Run them with -benchmem.
func Bench(b *testing.B, h Harness) {
	if h.New == nil {
		b.Fatal("storetest: Harness.New is nil")
	}
	benches := []struct {
		name string
		fn   func(b *testing.B, s dedup.Store)
	}{
		{"ClaimCommit", func(b *testing.B, s dedup.Store) { benchClaimCommit(b, s, nil) }},
		{"ClaimCommitParallel", benchClaimCommitParallel},
		{"ClaimCommitReplay", func(b *testing.B, s dedup.Store) { benchClaimCommit(b, s, replayResponse()) }},
		{"DuplicateClaim", benchDuplicate},
		{"DuplicateClaimParallel", benchDuplicateParallel},
	}
	for _, bb := range benches {
		b.Run(bb.name, func(b *testing.B) {
			s := h.New(b, time.Now)
			b.Cleanup(func() { _ = s.Close() })
			b.ReportAllocs()
			bb.fn(b, s)
		})
	}
}

func replayResponse() *dedup.Response {
	body := make([]byte, 1024)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	return &dedup.Response{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: body}
}

// benchID makes a Stripe-shaped event ID.
func benchID(prefix string, i int64) string {
	return prefix + strconv.FormatInt(i, 36) + "xQ4bT7uZkWm3Pd9L"
}

var benchRun atomic.Int64 // distinct key prefixes when the framework reruns a benchmark

func benchClaimCommit(b *testing.B, s dedup.Store, resp *dedup.Response) {
	ctx := context.Background()
	prefix := "evt_" + strconv.FormatInt(benchRun.Add(1), 10) + "_"
	var i int64
	for b.Loop() {
		i++
		k := dedup.Key{Namespace: "bench", ID: benchID(prefix, i)}
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil || res.Outcome != dedup.Claimed {
			b.Fatalf("Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
		}
		if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200, Response: resp}); err != nil {
			b.Fatalf("Commit: got %v, want nil", err)
		}
	}
}

func benchClaimCommitParallel(b *testing.B, s dedup.Store) {
	ctx := context.Background()
	prefix := "evt_" + strconv.FormatInt(benchRun.Add(1), 10) + "_"
	var n atomic.Int64
	b.SetParallelism(16) // 16×GOMAXPROCS senders, like the load test's 32 on 2 cores
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := dedup.Key{Namespace: "bench", ID: benchID(prefix, n.Add(1))}
			res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
			if err != nil || res.Outcome != dedup.Claimed {
				b.Errorf("Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
				return
			}
			if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
				b.Errorf("Commit: got %v, want nil", err)
				return
			}
		}
	})
}

func committedKey(b *testing.B, s dedup.Store) dedup.Key {
	ctx := context.Background()
	k := dedup.Key{Namespace: "bench", ID: "evt_1NxQ4bT7uZkWm3Pd9Ldup"}
	res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Claimed {
		b.Fatalf("Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
	if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
		b.Fatalf("Commit: got %v, want nil", err)
	}
	return k
}

func benchDuplicate(b *testing.B, s dedup.Store) {
	ctx := context.Background()
	k := committedKey(b, s)
	for b.Loop() {
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil || res.Outcome != dedup.Duplicate {
			b.Fatalf("Claim: got (%v, %v), want (duplicate, nil)", res.Outcome, err)
		}
	}
}

func benchDuplicateParallel(b *testing.B, s dedup.Store) {
	ctx := context.Background()
	k := committedKey(b, s)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
			if err != nil || res.Outcome != dedup.Duplicate {
				b.Errorf("Claim: got (%v, %v), want (duplicate, nil)", res.Outcome, err)
				return
			}
		}
	})
}
