package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestSIGTERMDrainsInFlight checks DESIGN.md's drain promise on the real
// binary: deliveries in flight when SIGTERM arrives are finished (forwarded,
// answered, committed) before the process exits 0, so after a restart every
// copy of them is answered as a duplicate and the upstream saw each once.
func TestSIGTERMDrainsInFlight(t *testing.T) {
	leakCheck(t)
	bin := gatewayBinary(t)
	const inFlight = 20
	tests := []struct {
		name    string
		backend string
	}{
		{"bolt", "bolt"},
		{"redis", "redis"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shortParallel(t)
			dir := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var store string
			switch tt.backend {
			case "bolt":
				store = fmt.Sprintf("  backend: bolt\n  bolt:\n    path: %q", filepath.Join(dir, "d.db"))
			case "redis":
				needRedis(t)
				r, err := StartRedis(ctx, dir)
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				store = fmt.Sprintf("  backend: redis\n  redis:\n    addrs: [%q]", r.Addr)
			}
			// Every answer takes 600ms, well inside the 1s upstream timeout.
			app := NewApp(AppConfig{Delay: 600 * time.Millisecond})
			defer app.Close()
			s := &Scenario{Lease: 2 * time.Second, UpstreamTimeout: time.Second, OnInFlight: "reject"}
			g, err := NewGateway(bin, dir, "d0", func(addr, admin string) string {
				return s.gatewayConfig(addr, admin, store, app.URL())
			})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if err := g.Start(ctx); err != nil {
				t.Fatal(err)
			}
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}
			defer c.CloseIdleConnections()
			send := func(id string) (int, string, error) {
				resp, err := c.Post(g.URL()+"/webhooks/stripe", "application/json", bytes.NewReader(Body(id)))
				if err != nil {
					return 0, "", err
				}
				defer resp.Body.Close()
				_, _ = io.Copy(io.Discard, resp.Body)
				return resp.StatusCode, resp.Header.Get("Dedup-Status"), nil
			}
			id := func(i int) string { return fmt.Sprintf("evt_drain_%s_%02d", tt.name, i) }

			type result struct {
				status int
				ds     string
				err    error
			}
			results := make([]result, inFlight)
			var wg sync.WaitGroup
			for i := range inFlight {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st, ds, err := send(id(i))
					results[i] = result{st, ds, err}
				}()
			}
			// SIGTERM once every delivery has reached the upstream.
			deadline := time.Now().Add(5 * time.Second)
			for app.Stats().Requests < inFlight && time.Now().Before(deadline) {
				select {
				case <-ctx.Done():
					t.Fatal(ctx.Err())
				case <-time.After(5 * time.Millisecond):
				}
			}
			if got := app.Stats().Requests; got != inFlight {
				t.Fatalf("got %d deliveries at the upstream before SIGTERM, want %d", got, inFlight)
			}
			drain, err := g.Term(10 * time.Second)
			if err != nil {
				t.Errorf("SIGTERM with %d deliveries in flight: %v", inFlight, err)
			}
			wg.Wait()
			t.Logf("drained %d in-flight deliveries in %s", inFlight, drain.Round(time.Millisecond))
			for i, r := range results {
				if r.err != nil || r.status != http.StatusOK || r.ds != "forwarded" {
					t.Errorf("in-flight delivery %s: got %d %q (err %v), want 200 \"forwarded\"", id(i), r.status, r.ds, r.err)
				}
			}

			if err := g.Start(ctx); err != nil {
				t.Fatal(err)
			}
			for i := range inFlight {
				st, ds, err := send(id(i))
				if err != nil || st != http.StatusOK || ds != "duplicate" {
					t.Errorf("copy of %s after the restart: got %d %q (err %v), want 200 \"duplicate\" (committed before exit)", id(i), st, ds, err)
				}
			}
			processed := app.Processed()
			for i := range inFlight {
				if got := len(processed[id(i)]); got != 1 {
					t.Errorf("upstream processed %s %d times, want 1", id(i), got)
				}
			}
			if _, err := g.Term(10 * time.Second); err != nil {
				t.Error(err)
			}
			for _, u := range g.Unexpected() {
				t.Errorf("gateway crashed: %s", u)
			}
		})
	}
}
