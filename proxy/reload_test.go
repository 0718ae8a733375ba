package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReloadWhileServing swaps routes (window, upstream, an added route)
// while senders keep delivering; no request fails.
func TestReloadWhileServing(t *testing.T) {
	upA := newUpstream(t, nil)
	upB := newUpstream(t, nil)
	cfgA := Config{Routes: []Route{genericRoute("orders", "/hooks/orders", upA.URL)}}
	routeB := genericRoute("orders", "/hooks/orders", upB.URL)
	routeB.Window = time.Hour
	cfgB := Config{Routes: []Route{routeB, genericRoute("extra", "/hooks/extra", upB.URL)}}
	h := newHarness(t, cfgA, harnessOpts{})

	const senders, perSender = 4, 50
	var (
		wg      sync.WaitGroup
		failed  atomic.Int64
		mu      sync.Mutex
		answers = map[string]int{}
	)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perSender {
				// Every event twice: a first delivery and a duplicate.
				body := fmt.Sprintf(`{"id":"evt_%d_%d"}`, s, i/2)
				resp, err := h.try(context.Background(), http.MethodPost, "/hooks/orders", body)
				if err != nil || (resp.Status != 200) {
					failed.Add(1)
					continue
				}
				mu.Lock()
				answers[resp.Header.Get(HeaderDedupStatus)]++
				mu.Unlock()
			}
		}()
	}
	reloads := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
loop:
	for {
		select {
		case <-done:
			break loop
		default:
		}
		cfg := cfgA
		if reloads%2 == 0 {
			cfg = cfgB
		}
		if err := h.gw.Reload(cfg); err != nil {
			t.Fatalf("Reload: %v", err)
		}
		reloads++
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("got %d failed requests during %d reloads, want 0", n, reloads)
	}
	if answers["forwarded"] != senders*perSender/2 || answers["duplicate"] != senders*perSender/2 {
		t.Errorf("got answers %v, want %d forwarded and %d duplicate", answers, senders*perSender/2, senders*perSender/2)
	}
	if got := upA.count() + upB.count(); got != senders*perSender/2 {
		t.Errorf("got %d upstream requests, want %d", got, senders*perSender/2)
	}
	if got := counterValue(t, h.gw.metrics.reloads, "success"); got != float64(reloads) {
		t.Errorf("config_reloads_total{result=success}: got %v, want %d", got, reloads)
	}
	t.Logf("%d reloads while %d deliveries flowed", reloads, senders*perSender)
}

// TestReloadInvalidKeepsOld: an invalid config is refused with its keys
// named and the old routes keep serving.
func TestReloadInvalidKeepsOld(t *testing.T) {
	up := newUpstream(t, nil)
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})
	bad := genericRoute("orders", "/hooks/new", up.URL)
	bad.Lease, bad.UpstreamTimeout = time.Second, 2*time.Second
	err := h.gw.Reload(Config{Routes: []Route{bad}})
	if err == nil || !strings.Contains(err.Error(), "routes[0] (orders): lease (1s) must be longer than upstream_timeout (2s)") {
		t.Fatalf("Reload: got %v, want the lease error", err)
	}
	if resp := h.send("/hooks/orders", `{"id":"evt_1"}`); resp.Status != 200 {
		t.Errorf("old route after a failed reload: got %d, want 200", resp.Status)
	}
	if resp := h.send("/hooks/new", `{"id":"evt_1"}`); resp.Status != 404 {
		t.Errorf("new route after a failed reload: got %d, want 404", resp.Status)
	}
	if got := counterValue(t, h.gw.metrics.reloads, "failure"); got != 1 {
		t.Errorf("config_reloads_total{result=failure}: got %v, want 1", got)
	}
	// A file that never parsed is counted in the same series.
	h.gw.ReloadFailed()
	if got := counterValue(t, h.gw.metrics.reloads, "failure"); got != 2 {
		t.Errorf("config_reloads_total{result=failure} after ReloadFailed: got %v, want 2", got)
	}
	if got := counterValue(t, h.gw.metrics.reloads, "success"); got != 0 {
		t.Errorf("config_reloads_total{result=success}: got %v, want 0", got)
	}
	if resp := h.send("/hooks/orders", `{"id":"evt_2"}`); resp.Status != 200 {
		t.Errorf("old route after ReloadFailed: got %d, want 200", resp.Status)
	}
}

// TestReloadInFlightFinishesOnOldRoute: a delivery being forwarded when the
// routes change is answered by the upstream it started with.
func TestReloadInFlightFinishesOnOldRoute(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	upOld := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		arrived <- struct{}{}
		<-release
		fmt.Fprint(w, "old")
	})
	upNew := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { fmt.Fprint(w, "new") })
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", upOld.URL)}}, harnessOpts{})
	first := make(chan response, 1)
	go func() {
		resp, _ := h.try(context.Background(), http.MethodPost, "/hooks/orders", `{"id":"evt_1"}`)
		first <- resp
	}()
	recv(t, arrived, "the first delivery at the old upstream")
	if err := h.gw.Reload(Config{Routes: []Route{genericRoute("orders", "/hooks/orders", upNew.URL)}}); err != nil {
		t.Fatal(err)
	}
	close(release)
	if got := string((<-first).Body); got != "old" {
		t.Errorf("in-flight delivery: got body %q, want old", got)
	}
	if got := string(h.send("/hooks/orders", `{"id":"evt_2"}`).Body); got != "new" {
		t.Errorf("delivery after reload: got body %q, want new", got)
	}
}

// TestReloadMetricsFollowRoutes: a route's series are resolved when it is
// built, so a route added by Reload counts in its own series from its first
// delivery (pre-initialised at 0 before it), and a route kept across the
// reload keeps counting in the series it had.
func TestReloadMetricsFollowRoutes(t *testing.T) {
	up := newUpstream(t, nil)
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})
	if resp := h.send("/hooks/orders", `{"id":"evt_1"}`); resp.Status != 200 {
		t.Fatalf("before reload: got %d, want 200", resp.Status)
	}
	routes := []Route{genericRoute("orders", "/hooks/orders", up.URL), genericRoute("extra", "/hooks/extra", up.URL)}
	if err := h.gw.Reload(Config{Routes: routes}); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(t, h.gw.metrics.deliveries, "extra", outcomeForwarded); got != 0 {
		t.Errorf("extra forwarded before its first delivery: got %v, want 0", got)
	}
	for _, path := range []string{"/hooks/orders", "/hooks/extra"} {
		if resp := h.send(path, `{"id":"evt_2"}`); resp.Status != 200 {
			t.Fatalf("%s after reload: got %d, want 200", path, resp.Status)
		}
	}
	if resp := h.send("/hooks/extra", `{"id":"evt_2"}`); resp.Header.Get(HeaderDedupStatus) != statusDuplicate {
		t.Fatalf("extra duplicate: got Dedup-Status %q", resp.Header.Get(HeaderDedupStatus))
	}
	checks := []struct {
		route, outcome string
		want           float64
	}{
		{"orders", outcomeForwarded, 2},
		{"extra", outcomeForwarded, 1},
		{"extra", outcomeDuplicate, 1},
	}
	for _, c := range checks {
		if got := counterValue(t, h.gw.metrics.deliveries, c.route, c.outcome); got != c.want {
			t.Errorf("deliveries_total{route=%q,outcome=%q}: got %v, want %v", c.route, c.outcome, got, c.want)
		}
	}
	for route, want := range map[string]float64{"orders": 2, "extra": 2} {
		if got := histCount(t, h.reg, "dedupgw_body_bytes", "route", route); got != want {
			t.Errorf("body_bytes{route=%q} observations: got %v, want %v", route, got, want)
		}
		if got := histCount(t, h.reg, "dedupgw_upstream_duration_seconds", "route", route, "code_class", "2xx"); got != 1+boolf(route == "orders") {
			t.Errorf("upstream_duration_seconds{route=%q,code_class=2xx} observations: got %v", route, got)
		}
	}

	// Removing a route removes its series; the kept route keeps counting.
	if err := h.gw.Reload(Config{Routes: routes[:1]}); err != nil {
		t.Fatal(err)
	}
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "route" && lp.GetValue() == "extra" {
					t.Errorf("after removing route extra: got series %s{route=%q}, want none", mf.GetName(), "extra")
				}
			}
		}
	}
	if resp := h.send("/hooks/orders", `{"id":"evt_3"}`); resp.Status != 200 {
		t.Fatalf("orders after the second reload: got %d", resp.Status)
	}
	if got := counterValue(t, h.gw.metrics.deliveries, "orders", outcomeForwarded); got != 3 {
		t.Errorf("deliveries_total{route=orders,outcome=forwarded} after the second reload: got %v, want 3", got)
	}
}

func boolf(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
