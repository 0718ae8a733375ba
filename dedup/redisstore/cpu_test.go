//go:build unix

package redisstore_test

import (
	"context"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

// BenchmarkSenders32 drives one store from 32 goroutines, the load test's
// senders, in two workloads:
//
//   - unique: a first delivery, Claim then Commit of a new key;
//   - duplicate: a Claim of a processed key.
//
// Besides ns/op it reports the CPU each operation costs in this process
// (client-µs/op, every goroutine of the test binary) and in redis-server
// (redis-µs/op, from INFO cpu). On a machine with few cores their sum, not the
// wall time, decides how many deliveries per second fit:
//
//	go test -run '^$' -bench Senders32 -count 5 ./dedup/redisstore/
func BenchmarkSenders32(b *testing.B) {
	srv := redistest.Start(b)
	admin := srv.Client()
	for _, w := range []string{"unique", "duplicate"} {
		b.Run(w, func(b *testing.B) {
			s, err := redisstore.New(redisstore.Config{Addrs: []string{srv.Addr()}, KeyPrefix: uniquePrefix()}, redisstore.Options{})
			if err != nil {
				b.Fatalf("New: %v", err)
			}
			defer s.Close()
			ctx := context.Background()
			dup := dedup.Key{Namespace: "bench", ID: "evt_dup"}
			claimCommit(b, s, dup)
			var (
				n      atomic.Int64
				failed atomic.Int64
				wg     sync.WaitGroup
			)
			prefix := "evt_" + strconv.Itoa(b.N) + "_"
			b.ReportAllocs()
			cpu0, redis0 := processCPU(b), redisCPU(b, admin)
			b.ResetTimer()
			for range 32 {
				wg.Go(func() {
					for i := n.Add(1); i <= int64(b.N); i = n.Add(1) {
						if w == "duplicate" {
							res, err := s.Claim(ctx, dup, dedup.ClaimOptions{Lease: time.Minute})
							if err != nil || res.Outcome != dedup.Duplicate {
								failed.Add(1)
							}
							continue
						}
						k := dedup.Key{Namespace: "bench", ID: prefix + strconv.FormatInt(i, 36)}
						res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
						if err == nil && res.Outcome == dedup.Claimed {
							err = s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
						}
						if err != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			cpu1, redis1 := processCPU(b), redisCPU(b, admin)
			b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "client-µs/op")
			b.ReportMetric(float64((redis1-redis0).Microseconds())/float64(b.N), "redis-µs/op")
			if f := failed.Load(); f > 0 {
				b.Fatalf("%d of %d operations failed", f, b.N)
			}
		})
	}
}

// processCPU returns the user plus system CPU time this process used so far.
func processCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var redisCPURE = regexp.MustCompile(`(?m)^used_cpu_(?:user|sys):([0-9.]+)\r?$`)

// redisCPU returns the user plus system CPU time redis-server used so far.
func redisCPU(tb testing.TB, admin *redis.Client) time.Duration {
	tb.Helper()
	info, err := admin.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatalf("INFO cpu: %v", err)
	}
	var sum float64
	for _, m := range redisCPURE.FindAllStringSubmatch(info, -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return time.Duration(sum * float64(time.Second))
}
