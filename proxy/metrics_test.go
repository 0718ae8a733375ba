package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/dedupgw/dedupgw/providers"
)

// scenario drives every outcome on route "orders" a known number of times and
// returns the expected deliveries_total per outcome.
func scenario(t *testing.T, h *harness, fs *flakyStore) map[string]int {
	t.Helper()
	const dups = 7
	want := map[string]int{}
	expect := func(outcome string, resp response, status string) {
		t.Helper()
		if got := resp.Header.Get(HeaderDedupStatus); got != status {
			t.Fatalf("%s: got Dedup-Status %q, want %q (status %d)", outcome, got, status, resp.Status)
		}
		want[outcome]++
	}
	expect(outcomeForwarded, h.send("/hooks/orders", `{"id":"evt_1"}`), statusForwarded)
	for range dups {
		expect(outcomeDuplicate, h.send("/hooks/orders", `{"id":"evt_1"}`), statusDuplicate)
	}
	expect(outcomeUnkeyed, h.send("/hooks/orders", `{}`), statusUnkeyed)
	expect(outcomeRejectedBody, h.send("/hooks/orders", strings.Repeat("x", 100)), statusRejected)
	expect(outcomeRejectedSignature, h.send("/hooks/signed", `{"id":"evt_2"}`), statusRejected)
	expect(outcomeRejectedKey, h.send("/hooks/api", `{}`), statusRejected)
	fs.down.Store(true)
	expect(outcomeStoreError, h.send("/hooks/orders", `{"id":"evt_3"}`), statusStoreError)
	fs.down.Store(false)
	return want
}

func metricsHarness(t *testing.T) (*harness, *flakyStore) {
	up := newUpstream(t, nil)
	orders := genericRoute("orders", "/hooks/orders", up.URL)
	orders.MaxBodyBytes = 64
	signed := genericRoute("signed", "/hooks/signed", up.URL)
	signed.Provider = providers.Config{Provider: providers.Stripe, Secrets: []string{stripeSecret}}
	api := genericRoute("api", "/hooks/api", up.URL)
	api.OnMissingKey = Reject
	fs := &flakyStore{}
	h := newHarness(t, Config{Routes: []Route{orders, signed, api}}, harnessOpts{store: fs})
	fs.Store = h.mem
	return h, fs
}

func TestMetricsCountOutcomes(t *testing.T) {
	h, fs := metricsHarness(t)
	want := scenario(t, h, fs)
	routeOf := map[string]string{outcomeRejectedSignature: "signed", outcomeRejectedKey: "api"}
	for _, o := range outcomes {
		route := routeOf[o]
		if route == "" {
			route = "orders"
		}
		if got := counterValue(t, h.gw.metrics.deliveries, route, o); got != float64(want[o]) {
			t.Errorf("deliveries_total{route=%q,outcome=%q}: got %v, want %d", route, o, got, want[o])
		}
	}

	// The whole orders series set, pre-initialised outcomes included.
	var exp strings.Builder
	exp.WriteString("# HELP dedupgw_deliveries_total Deliveries received on a route, by what the gateway did with them.\n# TYPE dedupgw_deliveries_total counter\n")
	for _, route := range []string{"api", "orders", "signed"} {
		for _, o := range sortedOutcomes() {
			n := 0
			if routeOf[o] == route || (routeOf[o] == "" && route == "orders") {
				n = want[o]
			}
			fmt.Fprintf(&exp, "dedupgw_deliveries_total{outcome=%q,route=%q} %d\n", o, route, n)
		}
	}
	if err := testutil.GatherAndCompare(h.reg, strings.NewReader(exp.String()), "dedupgw_deliveries_total"); err != nil {
		t.Errorf("deliveries_total: %v", err)
	}

	checks := []struct {
		name string
		got  float64
		want float64
	}{
		{"upstream 2xx observations", histCount(t, h.reg, "dedupgw_upstream_duration_seconds", "route", "orders", "code_class", "2xx"), 3},
		{"store claim errors", counterValue(t, h.gw.metrics.storeErrors, "memory", opClaim), 1},
		{"store commit errors", counterValue(t, h.gw.metrics.storeErrors, "memory", opCommit), 0},
		{"build info", testutil.ToFloat64(h.gw.metrics.buildInfo.WithLabelValues("test", runtime.Version())), 1},
		{"in flight after the run", testutil.ToFloat64(h.gw.metrics.inFlight.WithLabelValues("orders")), 0},
		{"body bytes observations", histCount(t, h.reg, "dedupgw_body_bytes", "route", "orders"), 1 + 7 + 1 + 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func sortedOutcomes() []string {
	s := append([]string(nil), outcomes...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

// histCount returns the sample count of the histogram series with labels
// (name, value pairs).
func histCount(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// TestMetricsLint runs promlint over what /metrics serves after a scenario
// and fails on any problem.
func TestMetricsLint(t *testing.T) {
	h, fs := metricsHarness(t)
	scenario(t, h, fs)
	admin := httptest.NewServer(NewAdmin(h.gw, h.store, AdminOptions{Gatherer: h.reg}))
	defer admin.Close()
	resp, err := admin.Client().Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: got %d, want 200", resp.StatusCode)
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	for _, name := range []string{
		"dedupgw_deliveries_total", "dedupgw_upstream_duration_seconds", "dedupgw_store_operation_duration_seconds",
		"dedupgw_store_errors_total", "dedupgw_releases_total", "dedupgw_build_info", "dedupgw_in_flight",
		"dedupgw_body_bytes", "dedupgw_config_reloads_total", "dedupgw_replay_too_large_total", "dedupgw_leases_lost_total",
	} {
		if !bytes.Contains(body, []byte("\n# TYPE "+name+" ")) {
			t.Errorf("/metrics: %s missing", name)
		}
	}
	for _, forbidden := range []string{"evt_1", "/hooks/"} {
		if bytes.Contains(body, []byte(forbidden)) {
			t.Errorf("/metrics: contains %q; labels must come from config or fixed enums", forbidden)
		}
	}
}

// The label values a fresh gateway exports are the contract's, spelt out
// here rather than through the package's constants: dashboards and alerts
// (the README's shutdown-releases alert, for one) query them by name.
func TestMetricLabelValues(t *testing.T) {
	h, _ := metricsHarness(t)
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{} // "metric label" → the values seen
	for _, mf := range families {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				k := mf.GetName() + " " + lp.GetName()
				if !slices.Contains(got[k], lp.GetValue()) {
					got[k] = append(got[k], lp.GetValue())
				}
			}
		}
	}
	tests := []struct {
		metric, label string
		want          []string
	}{
		{"dedupgw_deliveries_total", "outcome", []string{"duplicate", "forwarded", "in_flight", "rejected_body", "rejected_fingerprint", "rejected_key", "rejected_signature", "store_error", "unkeyed"}},
		{"dedupgw_releases_total", "reason", []string{"shutdown", "timeout", "upstream_error", "upstream_status"}},
		{"dedupgw_upstream_duration_seconds", "code_class", []string{"2xx", "3xx", "4xx", "5xx", "error"}},
		{"dedupgw_store_operation_duration_seconds", "op", []string{"claim", "commit", "forget", "get", "list", "ping", "release"}},
		{"dedupgw_store_errors_total", "op", []string{"claim", "commit", "forget", "get", "list", "ping", "release"}},
		{"dedupgw_build_info", "version", []string{"test"}},
		{"dedupgw_build_info", "goversion", []string{runtime.Version()}},
	}
	for _, tt := range tests {
		vals := slices.Sorted(slices.Values(got[tt.metric+" "+tt.label]))
		if !slices.Equal(vals, tt.want) {
			t.Errorf("%s{%s}: got %q, want %q", tt.metric, tt.label, vals, tt.want)
		}
	}
}

// TestMetricsOwnRegistry: with no Registerer, New uses a fresh registry (two
// gateways in one process do not collide) and the admin serves it.
func TestMetricsOwnRegistry(t *testing.T) {
	h, _ := metricsHarness(t)
	for range 2 {
		g, err := New(Config{Routes: []Route{genericRoute("x", "/x", "http://127.0.0.1:1")}}, h.store, Options{})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		defer g.Close()
		if g.Gatherer() == nil || g.Gatherer() == prometheus.DefaultGatherer {
			t.Errorf("Gatherer: got %v, want a fresh registry", g.Gatherer())
		}
		rec := httptest.NewRecorder()
		NewAdmin(g, h.store, AdminOptions{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if !strings.Contains(rec.Body.String(), `dedupgw_deliveries_total{outcome="forwarded",route="x"} 0`) {
			t.Errorf("/metrics of a fresh gateway: pre-initialised series missing")
		}
	}
}

func TestCodeClass(t *testing.T) {
	tests := []struct {
		status int
		want   string
	}{
		{0, "error"}, {101, "error"}, {200, "2xx"}, {204, "2xx"}, {299, "2xx"}, {301, "3xx"},
		{404, "4xx"}, {499, "4xx"}, {500, "5xx"}, {599, "5xx"}, {600, "error"},
	}
	for _, tc := range tests {
		if got := codeClass(tc.status); got != tc.want {
			t.Errorf("codeClass(%d): got %q, want %q", tc.status, got, tc.want)
		}
	}
}
