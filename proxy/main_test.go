package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/providers"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seenRequest is what the test upstream received.
type seenRequest struct {
	Method string
	Path   string
	// URI is the request target as sent (escapes included).
	URI    string
	Query  string
	Host   string
	Header http.Header
	Body   []byte
}

// upstream is a real httptest server that records every request and answers
// with handle (200 "ok" when nil).
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	seen   []seenRequest
	handle func(w http.ResponseWriter, r *http.Request, n int) // n counts from 0
}

func newUpstream(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, n int)) *upstream {
	t.Helper()
	u := &upstream{handle: handle}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		n := len(u.seen)
		u.seen = append(u.seen, seenRequest{
			Method: r.Method, Path: r.URL.Path, URI: r.RequestURI, Query: r.URL.RawQuery, Host: r.Host,
			Header: r.Header.Clone(), Body: body,
		})
		u.mu.Unlock()
		if u.handle == nil {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = io.WriteString(w, "ok")
			return
		}
		u.handle(w, r, n)
	}))
	t.Cleanup(u.Close)
	return u
}

// count returns how many requests reached the upstream.
func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.seen)
}

func (u *upstream) request(i int) seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[i]
}

// harness is a Gateway on a memstore behind a real loopback server.
type harness struct {
	t     *testing.T
	gw    *Gateway
	store dedup.Store
	mem   *memstore.Store
	reg   *prometheus.Registry
	srv   *httptest.Server
	// upstream is set by tests that want h.up().
	upstream *upstream
	// logs holds every line the gateway logged (also sent to the test's
	// log).
	logs *observer.ObservedLogs
}

func (h *harness) up() *upstream { return h.upstream }

// genericRoute is a route keyed by the Idempotency-Key header then json:id.
func genericRoute(name, path, upstreamURL string) Route {
	return Route{
		Name:     name,
		Path:     path,
		Upstream: upstreamURL,
		Provider: providers.Config{Provider: providers.Generic, Keys: []string{"header:Idempotency-Key", "json:id"}},
	}
}

type harnessOpts struct {
	store dedup.Store // nil: a fresh memstore
	now   func() time.Time
	// wrap wraps the gateway handler in the test server (to observe the
	// sender's request).
	wrap func(http.Handler) http.Handler
	// transport replaces the gateway's upstream transport.
	transport http.RoundTripper
	// storeTimeout replaces the gateway's default store timeout.
	storeTimeout time.Duration
	// logClock, when set, stamps the gateway's log entries (a fixed one
	// makes zap's per-second sampling deterministic).
	logClock zapcore.Clock
	// trusted replaces the gateway's default trusted proxies.
	trusted []netip.Prefix
}

func newHarness(t *testing.T, cfg Config, ho harnessOpts) *harness {
	t.Helper()
	h := &harness{t: t, reg: prometheus.NewRegistry()}
	h.mem = memstore.New(memstore.Options{SweepInterval: -1})
	t.Cleanup(func() { _ = h.mem.Close() })
	h.store = h.mem
	if ho.store != nil {
		h.store = ho.store
	}
	core, logs := observer.New(zapcore.DebugLevel)
	h.logs = logs
	logger := zap.New(zapcore.NewTee(zaptest.NewLogger(t).Core(), core))
	if ho.logClock != nil {
		logger = logger.WithOptions(zap.WithClock(ho.logClock))
	}
	gw, err := New(cfg, h.store, Options{
		Logger:         logger,
		Registerer:     h.reg,
		Backend:        "memory",
		Version:        "test",
		Now:            ho.now,
		Transport:      ho.transport,
		StoreTimeout:   ho.storeTimeout,
		TrustedProxies: ho.trusted,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.gw = gw
	var handler http.Handler = gw
	if ho.wrap != nil {
		handler = ho.wrap(gw)
	}
	h.srv = httptest.NewServer(handler)
	// A provider does not follow a redirect: the test sees the gateway's
	// own answer.
	h.srv.Client().CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	t.Cleanup(func() {
		// The gateway first: it cancels what still runs (a waiter, a
		// forward held by the test's upstream), which the server's Close
		// would wait for, when a test failed half-way.
		_ = gw.Close()
		h.srv.Close()
	})
	return h
}

// response is a fully read answer.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

// send posts body to path with headers ("Name: value" pairs).
func (h *harness) send(path, body string, headers ...string) response {
	h.t.Helper()
	return h.do(context.Background(), http.MethodPost, path, body, headers...)
}

func (h *harness) do(ctx context.Context, method, path, body string, headers ...string) response {
	h.t.Helper()
	resp, err := h.try(ctx, method, path, body, headers...)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// sendAsync posts body to path in the background; the answer (zero on a
// transport error) arrives on the returned channel.
func (h *harness) sendAsync(path, body string, headers ...string) <-chan response {
	c := make(chan response, 1)
	go func() {
		resp, _ := h.try(context.Background(), http.MethodPost, path, body, headers...)
		c <- resp
	}()
	return c
}

// waitHarness serves one generic route "orders" on /hooks/orders to up,
// with on_in_flight: wait.
func waitHarness(t *testing.T, up *upstream) *harness {
	t.Helper()
	r := genericRoute("orders", "/hooks/orders", up.URL)
	r.OnInFlight = Wait
	return newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
}

// try is do without failing the test (for use off the test goroutine).
func (h *harness) try(ctx context.Context, method, path, body string, headers ...string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	for _, kv := range headers {
		k, v, _ := strings.Cut(kv, ":")
		if k == "Host" { // net/http sends req.Host, not a Host header
			req.Host = strings.TrimSpace(v)
			continue
		}
		req.Header.Add(k, strings.TrimSpace(v))
	}
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// record reads a key's record from the store.
func (h *harness) record(ns, id string) (dedup.Record, error) {
	return h.store.Get(context.Background(), dedup.Key{Namespace: ns, ID: id})
}

// recv receives from ch, failing t after 10s (a deadline, not a
// measurement): a test that breaks fails with what it waited for instead of
// hanging until go test's timeout.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10s", what)
		panic("unreachable")
	}
}

// waitFor polls cond every millisecond until it holds or 5s passed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling with a deadline, not synchronisation by sleep
	}
}

// flakyStore fails every operation while down is set.
type flakyStore struct {
	dedup.Store
	down atomic.Bool

	mu       sync.Mutex
	claimsOf map[dedup.Key]int // claims asked, up or down
}

// claimCounts returns how many claims of each key were asked of s, read
// at one instant.
func (s *flakyStore) claimCounts() map[dedup.Key]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.claimsOf)
}

// claims returns how many claims of k were asked of s.
func (s *flakyStore) claims(k dedup.Key) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.claimsOf[k]
}

var errStoreDown = errors.New("store down")

// flakyMemstore returns a memstore without a sweeper and a flakyStore over
// it, up until its down is set; the memstore closes with the test.
func flakyMemstore(t *testing.T) (*memstore.Store, *flakyStore) {
	t.Helper()
	mem := memstore.New(memstore.Options{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	return mem, &flakyStore{Store: mem}
}

func (s *flakyStore) Claim(ctx context.Context, k dedup.Key, o dedup.ClaimOptions) (dedup.ClaimResult, error) {
	s.mu.Lock()
	if s.claimsOf == nil {
		s.claimsOf = map[dedup.Key]int{}
	}
	s.claimsOf[k]++
	s.mu.Unlock()
	if s.down.Load() {
		return dedup.ClaimResult{}, errStoreDown
	}
	return s.Store.Claim(ctx, k, o)
}

func (s *flakyStore) Get(ctx context.Context, k dedup.Key) (dedup.Record, error) {
	if s.down.Load() {
		return dedup.Record{}, errStoreDown
	}
	return s.Store.Get(ctx, k)
}

func (s *flakyStore) List(ctx context.Context, ns string, o dedup.ListOptions) (dedup.ListPage, error) {
	if s.down.Load() {
		return dedup.ListPage{}, errStoreDown
	}
	return s.Store.List(ctx, ns, o)
}

func (s *flakyStore) Ping(ctx context.Context) error {
	if s.down.Load() {
		return errStoreDown
	}
	return s.Store.Ping(ctx)
}

// closedPortURL returns an http URL on a loopback port nothing listens on.
func closedPortURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return "http://" + addr
}

func hasBody(b []byte, sub string) bool { return bytes.Contains(b, []byte(sub)) }

// counterValue reads one series of a counter vector.
func counterValue(t *testing.T, vec *prometheus.CounterVec, labels ...string) float64 {
	t.Helper()
	return testutil.ToFloat64(vec.WithLabelValues(labels...))
}

// testutilCount returns how many store operations op the gateway measured.
func testutilCount(h *harness, op string) uint64 {
	var m dto.Metric
	obs, err := h.gw.metrics.storeDuration.GetMetricWithLabelValues("memory", op)
	if err != nil {
		return 0
	}
	if err := obs.(prometheus.Metric).Write(&m); err != nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}
