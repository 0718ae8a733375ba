package redisstore_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

func BenchmarkStore(b *testing.B) {
	srv := redistest.Start(b)
	storetest.Bench(b, storetest.Harness{
		New: func(t testing.TB, now dedup.Clock) dedup.Store {
			return newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}}, now)
		},
	})
}

// TestMeasure loads DEDUPGW_MEASURE_KEYS (e.g. 100000) processed keys shaped
// like Stripe events into a fresh redis-server and reports the memory per key
// and the claim latency at that size, once with a body SHA-256 on every record
// and once without. It is skipped unless the variable is set:
//
//	DEDUPGW_MEASURE_KEYS=100000 go test -run TestMeasure -v ./dedup/redisstore/
func TestMeasure(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DEDUPGW_MEASURE_KEYS"))
	if n <= 0 {
		t.Skip("set DEDUPGW_MEASURE_KEYS to measure")
	}
	t.Run("with body_sha256", func(t *testing.T) { measure(t, n, true) })
	t.Run("without body_sha256", func(t *testing.T) { measure(t, n, false) })
}

func measure(t *testing.T, n int, withSHA bool) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx := context.Background()
	s := newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}, KeyPrefix: redisstore.DefaultKeyPrefix}, nil)
	key := func(i int) dedup.Key {
		// 28 characters, like evt_1NG8Du2eZvKYlo2CzXZ9o6Gu.
		id := strconv.FormatInt(int64(i), 36)
		return dedup.Key{Namespace: "stripe", ID: "evt_" + strings.Repeat("0", 24-len(id)) + id}
	}
	// Load the scripts before the baseline so their memory is not counted.
	claimCommit(t, s, dedup.Key{Namespace: "warm", ID: "1"})
	if _, err := s.Forget(ctx, dedup.Key{Namespace: "warm", ID: "1"}, dedup.ForgetOptions{}); err != nil {
		t.Fatalf("Forget: %v", err)
	}
	before := usedMemory(t, srv)

	start := time.Now()
	const workers = 32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				k := key(i)
				opts := dedup.ClaimOptions{Lease: time.Minute}
				if withSHA {
					sum := sha256.Sum256([]byte(k.ID))
					opts.BodySHA256 = hex.EncodeToString(sum[:])
				}
				res, err := s.Claim(ctx, k, opts)
				if err == nil && res.Outcome != dedup.Claimed {
					err = fmt.Errorf("claim: got %v, want claimed", res.Outcome)
				}
				if err == nil {
					err = s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: 72 * time.Hour, Status: 200})
				}
				if err != nil {
					t.Errorf("load %s: %v", k, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	load := time.Since(start)
	after := usedMemory(t, srv)
	sample, err := admin.MemoryUsage(ctx, s.Key(key(n/2))).Result()
	if err != nil {
		t.Fatalf("MEMORY USAGE: %v", err)
	}
	value, _ := admin.Get(ctx, s.Key(key(n/2))).Result()
	t.Logf("%d keys loaded (claim+commit, %d workers) in %s: %.0f first deliveries/s",
		n, workers, load.Round(time.Millisecond), float64(n)/load.Seconds())
	t.Logf("used_memory - mem_clients_normal %d -> %d: %.1f bytes per key; MEMORY USAGE of one key %d bytes; key %d bytes, value %d bytes",
		before, after, float64(after-before)/float64(n), sample, len(s.Key(key(n/2))), len(value))

	// Latency of one caller at this size: duplicates and first deliveries.
	const samples = 5000
	dup := make([]time.Duration, samples)
	first := make([]time.Duration, samples)
	for i := range samples {
		k := key((i * 7919) % n)
		t0 := time.Now()
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		dup[i] = time.Since(t0)
		if err != nil || res.Outcome != dedup.Duplicate {
			t.Fatalf("Claim(%s): got (%v, %v), want duplicate", k, res.Outcome, err)
		}
		k = dedup.Key{Namespace: "stripe", ID: "new_" + strconv.Itoa(i)}
		t0 = time.Now()
		res, err = s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err == nil {
			err = s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
		}
		first[i] = time.Since(t0)
		if err != nil {
			t.Fatalf("claim+commit %s: %v", k, err)
		}
	}
	t.Logf("at %d keys, one caller: duplicate claim p50 %s p99 %s; claim+commit p50 %s p99 %s",
		n, pct(dup, 50), pct(dup, 99), pct(first, 50), pct(first, 99))
}

var (
	usedMemoryRE = regexp.MustCompile(`(?m)^used_memory:(\d+)\r?$`)
	clientsRE    = regexp.MustCompile(`(?m)^mem_clients_normal:(\d+)\r?$`)
)

// usedMemory returns INFO memory's used_memory less mem_clients_normal: the
// connections' buffers depend on the client pool, not on the keys.
func usedMemory(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	info, err := srv.Client().Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatalf("INFO memory: %v", err)
	}
	var v [2]int64
	for i, re := range []*regexp.Regexp{usedMemoryRE, clientsRE} {
		m := re.FindStringSubmatch(info)
		if m == nil {
			t.Fatalf("INFO memory: no %s in %q", re, info)
		}
		v[i], _ = strconv.ParseInt(m[1], 10, 64)
	}
	return v[0] - v[1]
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[(len(s)-1)*p/100].Round(time.Microsecond)
}
