package boltstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

// TestScale measures the cost per delivery as the number of remembered keys
// grows. It runs only when DEDUPGW_SCALE lists key counts, for example
//
//	DEDUPGW_SCALE=10000,1000000 go test -run TestScale -v -timeout 1h ./dedup/boltstore
//
// and prints one Markdown table row per count. DEDUPGW_SCALE_DIR puts the
// file somewhere other than the test's temp dir; DEDUPGW_SCALE_BATCH sets
// Options.SweepBatch (default DefaultSweepBatch).
func TestScale(t *testing.T) {
	spec := os.Getenv("DEDUPGW_SCALE")
	if spec == "" {
		t.Skip("set DEDUPGW_SCALE=10000,1000000 to run the scale measurement")
	}
	batch := DefaultSweepBatch
	if v := os.Getenv("DEDUPGW_SCALE_BATCH"); v != "" {
		var err error
		if batch, err = strconv.Atoi(v); err != nil || batch <= 0 {
			t.Fatalf("DEDUPGW_SCALE_BATCH: bad value %q", v)
		}
	}
	var rows []string
	for _, f := range strings.Split(spec, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			t.Fatalf("DEDUPGW_SCALE: bad count %q", f)
		}
		rows = append(rows, scaleRun(t, n, batch))
	}
	fmt.Printf("SweepBatch %d, GOMAXPROCS %d\n", batch, runtime.GOMAXPROCS(0))
	fmt.Println("| keys | file bytes/key | new claim p50 / p99 | commit p50 / p99 | duplicate claim p50 / p99 | 32 senders: claim+commit/s, p99 | their checkpoints: time per record, longest | sweep keys/2 alone | longest sweep tx (of which deleting) | sweep keys/2 under 32 senders: took, their claim+commit p99 / max |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		fmt.Println(r)
	}
}

const idAlphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

// stripeID returns a random Stripe-shaped event ID ("evt_" + 24 characters).
func stripeID(r *rand.Rand) string {
	b := make([]byte, 28)
	copy(b, "evt_")
	for i := 4; i < len(b); i++ {
		b[i] = idAlphabet[r.IntN(len(idAlphabet))]
	}
	return string(b)
}

type lat []time.Duration

func (l lat) pct(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := slices.Clone(l)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func (l lat) String() string { return fmt.Sprintf("%v / %v", round(l.pct(0.5)), round(l.pct(0.99))) }

func round(d time.Duration) time.Duration {
	switch {
	case d > time.Second:
		return d.Round(10 * time.Millisecond)
	case d > time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(100 * time.Nanosecond)
}

func scaleRun(t *testing.T, n, batch int) string {
	ctx := context.Background()
	dir := os.Getenv("DEDUPGW_SCALE_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	path := dir + "/scale-" + strconv.Itoa(n) + ".db"
	_ = os.Remove(path)
	defer os.Remove(path)
	clk := storetest.NewFakeClock(storetest.Epoch)
	s, err := Open(path, Options{Now: clk.Now, SweepInterval: -1, SweepBatch: batch})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(uint64(n), 1))

	// Populate: n processed records in random key order, half expiring in 1h
	// and half in 2h,
	// written in large transactions (the layout random IDs give).
	start := time.Now()
	ids := make([]string, 0, min(n, 100_000)) // a sample to look up later
	const perTx = 20_000
	for done := 0; done < n; {
		m := min(perTx, n-done)
		err := s.db.Update(func(tx *bolt.Tx) error {
			for i := range m {
				id := stripeID(rng)
				if len(ids) < cap(ids) && (done+i)%max(1, n/cap(ids)) == 0 {
					ids = append(ids, id)
				}
				now := clk.Now()
				rec := dedup.Record{State: dedup.StateProcessed, FirstSeen: now, CompletedAt: now, ExpiresAt: now.Add(time.Hour * time.Duration(1+(done+i)%2)),
					Attempts: 1, LastStatus: 200, BodySHA256: fmt.Sprintf("%064x", rng.Uint64())}
				// Straight into bbolt, as a checkpoint would write it.
				if err := applyWrite(tx, recordKey(dedup.Key{Namespace: "stripe", ID: id}), encodeRecord(nil, &rec)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		done += m
	}
	t.Logf("%d keys: populated in %v", n, time.Since(start).Round(time.Millisecond))
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	perKey := float64(st.Size()) / float64(n)

	// Sequential latencies: one sender, new keys and duplicates.
	const seq = 2000
	var claimL, commitL, dupL lat
	for range seq {
		k := dedup.Key{Namespace: "stripe", ID: stripeID(rng)}
		t0 := time.Now()
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		t1 := time.Now()
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("Claim: got (%v, %v)", res.Outcome, err)
		}
		if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: 24 * time.Hour, Status: 200}); err != nil {
			t.Fatal(err)
		}
		t2 := time.Now()
		claimL, commitL = append(claimL, t1.Sub(t0)), append(commitL, t2.Sub(t1))

		d := dedup.Key{Namespace: "stripe", ID: ids[rng.IntN(len(ids))]}
		t3 := time.Now()
		res, err = s.Claim(ctx, d, dedup.ClaimOptions{Lease: time.Minute})
		dupL = append(dupL, time.Since(t3))
		if err != nil || res.Outcome != dedup.Duplicate {
			t.Fatalf("duplicate Claim: got (%v, %v)", res.Outcome, err)
		}
	}

	// 32 concurrent senders, new keys: throughput and claim+commit p99, and
	// what the checkpoints moving their commits into bbolt cost.
	var (
		ckMu              sync.Mutex
		ckRecs            int
		ckTook, ckLongest time.Duration
	)
	s.onCheckpoint = func(n int, d time.Duration) {
		ckMu.Lock()
		defer ckMu.Unlock()
		ckRecs += n
		ckTook += d
		ckLongest = max(ckLongest, d)
	}
	const senders, each = 32, 400
	conc, elapsed := senderLoad(t, s, senders, each, nil)
	if err := s.flush(ctx); err != nil {
		t.Fatal(err)
	}
	ckMu.Lock()
	s.onCheckpoint = nil
	ckPer := ckTook / time.Duration(max(ckRecs, 1))
	ckMu.Unlock()

	// Sweep: half the populated keys expire at +1h, half at +2h (see
	// populate). The first half is swept alone, to see the transaction
	// lengths; the second while 32 senders claim and commit new keys, to see
	// whether they stall.
	sweepAll := func() (took, longest, longestWork time.Duration, swept int) {
		s.onSweepTx = func(d time.Duration) { longestWork = max(longestWork, d) } // only sweepOnce, below, calls it
		defer func() { s.onSweepTx = nil }()
		nowMs := clk.Now().UnixMilli()
		start := time.Now()
		for {
			t0 := time.Now()
			d, more, err := s.sweepOnce(nowMs)
			longest = max(longest, time.Since(t0))
			swept += d
			if err != nil {
				t.Fatal(err)
			}
			if !more {
				return time.Since(start), longest, longestWork, swept
			}
		}
	}
	clk.Advance(90 * time.Minute)
	aloneTook, aloneLongest, aloneWork, swept := sweepAll()
	if swept != n/2 {
		t.Errorf("first sweep: got %d deleted, want %d", swept, n/2)
	}
	clk.Advance(time.Hour)
	stopLoad := make(chan struct{})
	var during lat
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		during, _ = senderLoad(t, s, senders, 1<<30, stopLoad)
	}()
	loadTook, _, _, swept2 := sweepAll()
	close(stopLoad)
	wg.Wait()
	if swept2 < n-n/2 {
		t.Errorf("second sweep: got %d deleted, want at least %d", swept2, n-n/2)
	}
	t.Logf("%d keys: swept %d alone in %v (longest tx %v, %v deleting), %d under load in %v with %d claim+commits",
		n, swept, aloneTook, aloneLongest, aloneWork, swept2, loadTook, len(during))

	return fmt.Sprintf("| %d | %.0f | %v | %v | %v | %.0f/s, %v | %v/record, longest %v | %v (%.0f keys/s) | %v (%v deleting) | %v: %v / %v |",
		n, perKey, claimL, commitL, dupL,
		float64(len(conc))/elapsed.Seconds(), round(conc.pct(0.99)), round(ckPer), round(ckLongest),
		round(aloneTook), float64(swept)/aloneTook.Seconds(), round(aloneLongest), round(aloneWork),
		round(loadTook), round(during.pct(0.99)), round(during.pct(1)))
}

// senderLoad runs senders goroutines each doing up to each claim+commit of
// new keys (until stop closes, when stop is non-nil) and returns every
// claim+commit latency and the wall time.
func senderLoad(t *testing.T, s *Store, senders, each int, stop <-chan struct{}) (lat, time.Duration) {
	ctx := context.Background()
	var (
		mu  sync.Mutex
		all lat
		wg  sync.WaitGroup
	)
	start := time.Now()
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			mine := make(lat, 0, 256)
			for i := 0; i < each; i++ {
				if stop != nil {
					select {
					case <-stop:
						i = each
						continue
					default:
					}
				}
				k := dedup.Key{Namespace: "load", ID: stripeID(rng)}
				t0 := time.Now()
				res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
				if err != nil || res.Outcome != dedup.Claimed {
					t.Errorf("Claim: got (%v, %v)", res.Outcome, err)
					return
				}
				if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: 24 * time.Hour, Status: 200}); err != nil {
					t.Errorf("Commit: %v", err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return all, time.Since(start)
}
