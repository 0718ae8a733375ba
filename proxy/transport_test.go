package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestUpstreamConnectionsAreReused: the gateway keeps its upstream
// connections alive under concurrency. Two waves of 32 concurrent
// deliveries reuse the first wave's connections instead of opening new ones
// (a transport with Go's default of 2 idle connections per host closes 30 of
// them after each wave and dials again).
func TestUpstreamConnectionsAreReused(t *testing.T) {
	const senders = 32
	var dialed atomic.Int64
	arrived := make(chan struct{}, senders)
	var gate atomic.Pointer[chan struct{}]
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g := *gate.Load()
		arrived <- struct{}{}
		<-g
		_, _ = w.Write([]byte("ok"))
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialed.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})

	id := 0
	for wave := range 2 {
		g := make(chan struct{})
		gate.Store(&g)
		errs := make(chan error, senders)
		for range senders {
			id++
			body := fmt.Sprintf(`{"id":"evt_%d"}`, id)
			go func() {
				resp, err := h.try(context.Background(), http.MethodPost, "/hooks/orders", body)
				if err == nil && resp.Status != http.StatusOK {
					err = fmt.Errorf("status %d", resp.Status)
				}
				errs <- err
			}()
		}
		// All 32 are at the upstream at once, so each holds a connection.
		deadline := time.After(10 * time.Second)
		for range senders {
			select {
			case <-arrived:
			case <-deadline:
				t.Fatalf("wave %d: not all %d deliveries reached the upstream within 10s", wave, senders)
			}
		}
		close(g)
		for range senders {
			if err := <-errs; err != nil {
				t.Fatalf("wave %d: delivery: %v", wave, err)
			}
		}
	}
	if got := dialed.Load(); got > senders+senders/4 {
		t.Errorf("upstream connections opened for 2 waves of %d concurrent deliveries: got %d, want about %d (reused)", senders, got, senders)
	}
}
