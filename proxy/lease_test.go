package proxy

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

// TestForwardDeadline: a forward's deadline is upstream_timeout, cut to the
// lease's end minus the commit reserve when that is earlier.
func TestForwardDeadline(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name         string
		lease, up    time.Duration
		storeTimeout time.Duration
		token        string
		leaseLeft    time.Duration // leaseEnd - now; 0 means no leaseEnd
		wantReserve  time.Duration
		want         time.Duration // deadline - now
		wantBound    bool
	}{
		{"defaults, fresh claim", time.Minute, 30 * time.Second, 5 * time.Second, "t", time.Minute, 5 * time.Second, 30 * time.Second, false},
		{"defaults, claim took 26s", time.Minute, 30 * time.Second, 5 * time.Second, "t", 34 * time.Second, 5 * time.Second, 29 * time.Second, true},
		{"small slack caps the reserve", time.Second, 500 * time.Millisecond, 5 * time.Second, "t", time.Second, 250 * time.Millisecond, 500 * time.Millisecond, false},
		{"small slack, slow claim", time.Second, 500 * time.Millisecond, 5 * time.Second, "t", 600 * time.Millisecond, 250 * time.Millisecond, 350 * time.Millisecond, true},
		{"lease already spent", time.Second, 500 * time.Millisecond, 5 * time.Second, "t", 100 * time.Millisecond, 250 * time.Millisecond, -150 * time.Millisecond, true},
		{"no claim (fail open, unkeyed)", time.Second, 500 * time.Millisecond, 5 * time.Second, "", 100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, false},
		{"claim without a lease end", time.Second, 500 * time.Millisecond, 5 * time.Second, "t", 0, 250 * time.Millisecond, 500 * time.Millisecond, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := &Gateway{storeTimeout: tt.storeTimeout}
			d := &delivery{rt: &route{Route: Route{Lease: tt.lease, UpstreamTimeout: tt.up}}, token: tt.token}
			if tt.leaseLeft != 0 {
				d.leaseEnd = now.Add(tt.leaseLeft)
			}
			if got := g.commitReserve(d.rt); got != tt.wantReserve {
				t.Errorf("got commit reserve %s, want %s", got, tt.wantReserve)
			}
			deadline, bound := g.forwardDeadline(d, now)
			if got := deadline.Sub(now); got != tt.want || bound != tt.wantBound {
				t.Errorf("got deadline now%+v (lease bound %v), want now%+v (lease bound %v)", got, bound, tt.want, tt.wantBound)
			}
		})
	}
}

// leaseStore wraps a Store: each Claim first waits delay (a slow store),
// and a claimed record's LeaseUntil is reported as the claim time plus
// leaseLeft (a store whose clock is behind ours) when leaseLeft is set.
type leaseStore struct {
	dedup.Store
	delay     time.Duration
	leaseLeft time.Duration
}

func (s *leaseStore) Claim(ctx context.Context, k dedup.Key, o dedup.ClaimOptions) (dedup.ClaimResult, error) {
	now := time.Now()
	if s.delay > 0 {
		select {
		case <-time.After(s.delay): // injected latency, not synchronisation
		case <-ctx.Done():
			return dedup.ClaimResult{}, ctx.Err()
		}
	}
	res, err := s.Store.Claim(ctx, k, o)
	if err == nil && res.Outcome == dedup.Claimed && s.leaseLeft > 0 {
		res.Record.LeaseUntil = now.Add(s.leaseLeft)
	}
	return res, err
}

// TestLeaseBoundsForward: a forward that could not end with time left on
// its lease to commit is cut short like an upstream timeout (504, released
// with reason timeout, key claimable), so a retry meanwhile never finds the
// lease lapsed under a forward that will later answer 200.
func TestLeaseBoundsForward(t *testing.T) {
	tests := []struct {
		name         string
		store        leaseStore
		lease, up    time.Duration
		wantUpstream int
	}{
		// reserve 50ms: the slow claim leaves 300-280 < 50ms, no forward at all.
		{"claim slower than the lease allows", leaseStore{delay: 280 * time.Millisecond}, 300 * time.Millisecond, 200 * time.Millisecond, 0},
		// The store's lease ends 100ms after the claim by our clock; the
		// reserve is 2.5s: no forward at all.
		{"store clock behind ours", leaseStore{leaseLeft: 100 * time.Millisecond}, 10 * time.Second, 5 * time.Second, 0},
		// 3.5s left, reserve 2.5s: the upstream gets about 1s, not 5s (time
		// enough to reach it on a loaded machine).
		{"forward cut mid-way", leaseStore{leaseLeft: 3500 * time.Millisecond}, 10 * time.Second, 5 * time.Second, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n == 0 {
					<-r.Context().Done() // hold until the gateway gives up
				}
			})
			r := genericRoute("orders", "/hooks/orders", up.URL)
			r.Lease, r.UpstreamTimeout = tt.lease, tt.up
			h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
			store := tt.store
			store.Store = h.mem
			h.gw.store.next = &store

			start := time.Now()
			resp := h.send("/hooks/orders", `{"id":"evt_1"}`)
			took := time.Since(start)
			if resp.Status != http.StatusGatewayTimeout || resp.Header.Get(HeaderDedupStatus) != statusForwarded {
				t.Errorf("got %d %q, want 504 %q", resp.Status, resp.Header.Get(HeaderDedupStatus), statusForwarded)
			}
			if limit := tt.store.delay + tt.up; took >= limit {
				t.Errorf("got the answer after %s, want it before the claim's delay plus upstream_timeout, %s", took, limit)
			}
			if got := up.count(); got != tt.wantUpstream {
				t.Errorf("got %d requests upstream, want %d", got, tt.wantUpstream)
			}
			rec, err := h.record("orders", "evt_1")
			if err != nil || rec.State != dedup.StateFailed || rec.LastError != "timeout" {
				t.Errorf("got record %+v, %v; want failed with last_error timeout", rec, err)
			}
			if got := counterValue(t, h.gw.metrics.releases, "orders", reasonTimeout); got != 1 {
				t.Errorf("got %v timeout releases, want 1", got)
			}
		})
	}
}
