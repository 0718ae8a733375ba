package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/boltstore"
	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
	"github.com/dedupgw/dedupgw/providers"
	"github.com/dedupgw/dedupgw/proxy"
)

// BenchmarkLoopback drives the gateway (and, for comparison, the bare
// ReverseProxy) in-process over real loopback HTTP with the runner's load
// driver and real stores, so a CPU profile shows where a delivery's time goes:
//
//	go test -run '^$' -bench 'Loopback/bolt/unique' -cpuprofile cpu.out ./bench
//	go tool pprof -top -focus 'proxy|boltstore' cpu.out
//
// The load driver and the upstream share the process, so ns/op is not
// comparable with the runner's numbers; compare sub-benchmarks with each other.
func BenchmarkLoopback(b *testing.B) {
	targets := []struct {
		name  string
		store func(b *testing.B) dedup.Store // nil: the bare ReverseProxy
	}{
		{"bare", nil},
		{"memory", func(b *testing.B) dedup.Store { return memstore.New(memstore.Options{}) }},
		{"bolt", func(b *testing.B) dedup.Store {
			s, err := boltstore.Open(filepath.Join(b.TempDir(), "bench.db"), boltstore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
		{"redis", func(b *testing.B) dedup.Store {
			srv := redistest.Start(b)
			s, err := redisstore.New(redisstore.Config{Addrs: []string{srv.Addr()}}, redisstore.Options{})
			if err != nil {
				b.Fatal(err)
			}
			return s
		}},
	}
	for _, tg := range targets {
		for _, w := range []string{Unique, Duplicate} {
			b.Run(tg.name+"/"+w, func(b *testing.B) {
				up := httptest.NewServer(&upstream{})
				defer up.Close()
				var h http.Handler
				if tg.store == nil {
					p, err := newBareProxy(up.URL, 64)
					if err != nil {
						b.Fatal(err)
					}
					defer p.Transport.(*http.Transport).CloseIdleConnections()
					h = p
				} else {
					store := tg.store(b)
					defer store.Close()
					g, err := proxy.New(proxy.Config{Routes: []proxy.Route{{
						Name:     "stripe",
						Path:     webhookPath,
						Upstream: up.URL,
						Provider: providers.Config{Provider: providers.Stripe},
					}}}, store, proxy.Options{})
					if err != nil {
						b.Fatal(err)
					}
					defer g.Close()
					h = g
				}
				srv := httptest.NewServer(h)
				defer srv.Close()
				loopbackLoad(b, srv.URL+webhookPath, w)
			})
		}
	}
}

// loopbackLoad posts b.N events of workload w to url from 32 senders and
// reports requests/s.
func loopbackLoad(b *testing.B, url, w string) {
	const senders = 32
	ids := newIDSpace()
	d := newDriver(senders, 10*time.Second, ids)
	defer d.Close()
	ctx := context.Background()
	var fixed string
	if w == Duplicate {
		fixed = ids.newID()
		if status, err := d.post(ctx, url, appendEvent(nil, []byte(fixed))); err != nil || status != http.StatusOK {
			b.Fatalf("priming: got %d %v, want 200", status, err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var left atomic.Int64
	left.Store(int64(b.N))
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			seq := newSequence(w, ids, fixed)
			for left.Add(-1) >= 0 {
				if status, err := d.post(ctx, url, seq.next()); err != nil || status != http.StatusOK {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	if n := failed.Load(); n > 0 {
		b.Errorf("got %d failed requests of %d, want 0", n, b.N)
	}
}
