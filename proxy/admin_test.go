package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/memstore"
)

// adminHarness is a gateway plus its admin handler on loopback servers.
type adminHarness struct {
	*harness
	admin *httptest.Server
	fs    *flakyStore
}

func newAdminHarness(t *testing.T, token string) *adminHarness {
	t.Helper()
	up := newUpstream(t, nil)
	fs := &flakyStore{}
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/*", up.URL)}}, harnessOpts{store: fs})
	fs.Store = h.mem
	h.upstream = up
	admin := httptest.NewServer(NewAdmin(h.gw, fs, AdminOptions{Token: token}))
	t.Cleanup(admin.Close)
	// Nothing on the admin listener redirects: a 3xx must show, not be
	// followed into another answer.
	admin.Client().CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &adminHarness{harness: h, admin: admin, fs: fs}
}

func (a *adminHarness) call(method, path, auth string) (int, http.Header, []byte) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.admin.URL+path, nil)
	if err != nil {
		a.t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := a.admin.Client().Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// Readiness logs the first failing ping, then one a minute while the store
// stays down (the kubelet probes every few seconds: an on-call trial got 54
// lines per replica in two minutes), and, once, the recovery, so the log
// shows when the store came back. (Found by an operator trial: there was
// no line for it.)
func TestReadinessLogsTheRecovery(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	fs := &flakyStore{Store: ms}
	clock := newManualClock(time.Unix(1_700_000_000, 0))
	core, logs := observer.New(zapcore.DebugLevel)
	gw, err := New(Config{Routes: []Route{genericRoute("orders", "/hooks/*", "http://127.0.0.1:1")}}, fs, Options{Logger: zap.New(core), Registerer: prometheus.NewRegistry(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	// A reload that changes admin.token builds a new admin handler: the
	// recovery is logged whichever handler sees it.
	var handler atomic.Pointer[http.Handler]
	newAdmin := func() {
		h := NewAdmin(gw, fs, AdminOptions{})
		handler.Store(&h)
	}
	newAdmin()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) }))
	t.Cleanup(srv.Close)
	const failed, back = "not ready: the store failed its ping", "ready again: the store answers its ping"
	for i, step := range []struct {
		down    bool
		advance time.Duration // before the probe
		want    int
		logs    []string
	}{
		{false, 0, 200, nil},
		{true, 0, 503, []string{failed}},
		{true, 10 * time.Second, 503, nil},
		{true, 50 * time.Second, 503, []string{failed}}, // a minute on; then a new handler
		{true, 10 * time.Second, 503, nil},
		{false, 0, 200, []string{back}},
		{false, 0, 200, nil},
		{true, time.Second, 503, []string{failed}}, // down again: at once
	} {
		clock.Advance(step.advance)
		fs.down.Store(step.down)
		resp, err := srv.Client().Get(srv.URL + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != step.want {
			t.Errorf("probe %d: got %d, want %d", i, resp.StatusCode, step.want)
		}
		var got []string
		for _, e := range logs.TakeAll() {
			got = append(got, e.Message)
		}
		if !slices.Equal(got, step.logs) {
			t.Errorf("probe %d: got log lines %q, want %q", i, got, step.logs)
		}
		if i == 3 {
			newAdmin()
		}
	}
}

// TestStoreWatchedWithoutTraffic: with StorePingInterval (serve sets it),
// a store that goes down shows in dedupgw_store_up, the ping errors and
// the log although no delivery arrives and nothing probes /readyz (the
// chart probes /healthz), and its return shows too. (Found by an operator
// trial: a Redis that died on a quiet night showed nowhere.)
func TestStoreWatchedWithoutTraffic(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	fs := &flakyStore{Store: ms}
	clock := newManualClock(time.Unix(1_700_000_000, 0)) // still: one "not ready" line
	core, logs := observer.New(zapcore.DebugLevel)
	gw, err := New(Config{Routes: []Route{genericRoute("orders", "/hooks/*", "http://127.0.0.1:1")}}, fs,
		Options{Logger: zap.New(core), Registerer: prometheus.NewRegistry(), Backend: "memory", Now: clock.Now, StorePingInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	up := func() float64 { return testutil.ToFloat64(gw.metrics.storeUp.WithLabelValues("memory")) }
	lines := func(msg string) int { return len(logs.FilterMessage(msg).All()) }
	const failed, back = "not ready: the store failed its ping", "ready again: the store answers its ping"

	waitFor(t, "dedupgw_store_up 1", func() bool { return up() == 1 })
	fs.down.Store(true)
	waitFor(t, "dedupgw_store_up 0 and a not-ready line", func() bool { return up() == 0 && lines(failed) == 1 })
	waitFor(t, "several failed pings", func() bool { return counterValue(t, gw.metrics.storeErrors, "memory", opPing) >= 3 })
	fs.down.Store(false)
	waitFor(t, "dedupgw_store_up 1 and a ready-again line", func() bool { return up() == 1 && lines(back) == 1 })
	if err := gw.Close(); err != nil {
		t.Fatal(err)
	}
	// Close stopped the pings (goleak checks the goroutine is gone).
	if got := lines(failed); got != 1 {
		t.Errorf("%q lines: got %d, want 1 (the first failure; then one a minute)", failed, got)
	}
}

// hangingPing is a store whose Ping hangs until its context ends, and
// says on pinging when the first one started.
type hangingPing struct {
	dedup.Store
	pinging chan struct{}
	once    sync.Once
}

func (s *hangingPing) Ping(ctx context.Context) error {
	s.once.Do(func() { close(s.pinging) })
	<-ctx.Done()
	return ctx.Err()
}

// TestCloseDuringAStorePing: a background ping that Close cuts short is
// not the store's answer. Taken for one, every shutdown of a gateway
// whose store is slow to answer would log "not ready: the store failed
// its ping" and set dedupgw_store_up to 0 on its way out.
func TestCloseDuringAStorePing(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	hs := &hangingPing{Store: ms, pinging: make(chan struct{})}
	core, logs := observer.New(zapcore.DebugLevel)
	reg := prometheus.NewRegistry()
	gw, err := New(Config{Routes: []Route{genericRoute("orders", "/hooks/*", "http://127.0.0.1:1")}}, hs,
		Options{Logger: zap.New(core), Registerer: reg, Backend: "memory", StorePingInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, hs.pinging, "the first background ping")
	if err := gw.Close(); err != nil {
		t.Fatal(err)
	}
	if got := logs.FilterMessage("not ready: the store failed its ping").Len(); got != 0 {
		t.Errorf("not-ready lines after Close cut the ping short: got %d, want 0", got)
	}
	if got := testutil.CollectAndCount(reg, "dedupgw_store_up"); got != 0 {
		t.Errorf("dedupgw_store_up series after a ping that never answered: got %d, want 0", got)
	}
	if got := counterValue(t, gw.metrics.storeErrors, "memory", opPing); got != 0 {
		t.Errorf("ping errors after Close cut the ping short: got %v, want 0 (no answer of the store's)", got)
	}
}

// TestStoreAnswersInOrder: a ping's answer that arrives after a later
// ping's was recorded is dropped (a /readyz ping started during an outage
// fails after the background ping found the store back), so the store is
// not read as down again, nor "not ready" logged, until the next ping.
func TestStoreAnswersInOrder(t *testing.T) {
	ms := memstore.New(memstore.Options{})
	t.Cleanup(func() { _ = ms.Close() })
	core, logs := observer.New(zapcore.DebugLevel)
	gw, err := New(Config{Routes: []Route{genericRoute("orders", "/hooks/*", "http://127.0.0.1:1")}}, ms,
		Options{Logger: zap.New(core), Registerer: prometheus.NewRegistry(), Backend: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	up := func() float64 { return testutil.ToFloat64(gw.metrics.storeUp.WithLabelValues("memory")) }
	const failed = "not ready: the store failed its ping"

	first, second := gw.pings.Add(1), gw.pings.Add(1)
	gw.storeAnswered(second, nil)
	gw.storeAnswered(first, errStoreDown) // started earlier, answered later
	if got := up(); got != 1 {
		t.Errorf("dedupgw_store_up after an overtaken failure: got %v, want 1", got)
	}
	if got := len(logs.FilterMessage(failed).All()); got != 0 {
		t.Errorf("%q lines after an overtaken failure: got %d, want 0", failed, got)
	}
	third := gw.pings.Add(1)
	gw.storeAnswered(third, errStoreDown)
	if got := up(); got != 0 {
		t.Errorf("dedupgw_store_up after a later failure: got %v, want 0", got)
	}
}

func TestAdminHealthAndReadiness(t *testing.T) {
	a := newAdminHarness(t, "")
	tests := []struct {
		name      string
		storeDown bool
		method    string
		path      string
		want      int
		wantAllow string
	}{
		{"healthz", false, "GET", "/healthz", 200, ""},
		{"healthz while the store is down", true, "GET", "/healthz", 200, ""},
		{"readyz", false, "GET", "/readyz", 200, ""},
		{"readyz while the store is down", true, "GET", "/readyz", 503, ""},
		{"readyz after the store came back", false, "GET", "/readyz", 200, ""},
		{"readyz by HEAD", false, "HEAD", "/readyz", 200, ""},
		{"metrics", false, "GET", "/metrics", 200, ""},
		{"unknown path", false, "GET", "/nope", 404, ""},
		{"unknown path under /v1", false, "GET", "/v1/nope", 404, ""},
		{"the route's listing", false, "GET", "/v1/keys/orders", 200, ""},
		{"DELETE of a route without a key", false, "DELETE", "/v1/keys/orders", 405, "GET, HEAD"},
		{"POST healthz", false, "POST", "/healthz", 405, "GET, HEAD"},
		{"DELETE metrics", false, "DELETE", "/metrics", 405, "GET, HEAD"},
		{"PUT a key", false, "PUT", "/v1/keys/orders/evt_1", 405, "GET, HEAD, DELETE"},
	}
	defer func() {
		// Last: a draining gateway is not ready, whatever the store says.
		a.gw.Drain()
		got, _, body := a.call(http.MethodGet, "/readyz", "")
		if got != 503 || !strings.Contains(string(body), "draining") {
			t.Errorf("GET /readyz while draining: got %d %s, want 503 draining", got, body)
		}
		if got, _, _ := a.call(http.MethodGet, "/healthz", ""); got != 200 {
			t.Errorf("GET /healthz while draining: got %d, want 200", got)
		}
	}()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a.fs.down.Store(tc.storeDown)
			got, hdr, body := a.call(tc.method, tc.path, "")
			if got != tc.want {
				t.Errorf("%s %s: got %d, want %d (body %s)", tc.method, tc.path, got, tc.want, body)
			}
			if want := map[int]string{404: `not-found"`, 405: `method-not-allowed"`}[got]; want != "" && tc.path != "/readyz" && !strings.Contains(string(body), want) {
				t.Errorf("%s %s: got %s, want a problem of type …%s", tc.method, tc.path, body, want)
			}
			if got := hdr.Get("Allow"); got != tc.wantAllow {
				t.Errorf("%s %s: got Allow %q, want %q", tc.method, tc.path, got, tc.wantAllow)
			}
			if got >= 400 && !strings.HasPrefix(hdr.Get("Content-Type"), "application/problem+json") {
				t.Errorf("%s %s: got Content-Type %q, want problem+json", tc.method, tc.path, hdr.Get("Content-Type"))
			}
		})
	}
}

func TestAdminKeysAPI(t *testing.T) {
	const token = "s3cret-token"
	a := newAdminHarness(t, token)
	bearer := "Bearer " + token
	for _, id := range []string{"evt_1", "a/b c"} {
		if resp := a.send("/hooks/x", "", "Idempotency-Key: "+id); resp.Status != 200 {
			t.Fatalf("forward %q: got %d, want 200", id, resp.Status)
		}
	}
	keyPath := func(id string) string { return "/v1/keys/orders/" + url.PathEscape(id) }

	auth := []struct {
		name, method, path, auth string
		want                     int
	}{
		{"get without token", http.MethodGet, keyPath("evt_1"), "", 401},
		{"get with wrong token", http.MethodGet, keyPath("evt_1"), "Bearer nope", 401},
		{"get with a token prefix", http.MethodGet, keyPath("evt_1"), "Bearer s3cret", 401},
		{"get with basic auth", http.MethodGet, keyPath("evt_1"), "Basic czNjcmV0LXRva2Vu", 401},
		{"delete without token", http.MethodDelete, keyPath("evt_1"), "", 401},
		{"get with token", http.MethodGet, keyPath("evt_1"), bearer, 200},
		{"get with the scheme in lower case", http.MethodGet, keyPath("evt_1"), "bearer " + token, 200},
		{"get with two spaces after the scheme", http.MethodGet, keyPath("evt_1"), "Bearer  " + token, 200},
		{"get with the token as the scheme", http.MethodGet, keyPath("evt_1"), token, 401},
		{"key containing a slash and a space", http.MethodGet, "/v1/keys/orders/a/b%20c", bearer, 200},
		{"absent key", http.MethodGet, keyPath("nope"), bearer, 404},
		{"unknown route", http.MethodGet, "/v1/keys/nope/evt_1", bearer, 404},
		{"health needs no token", http.MethodGet, "/healthz", "", 200},
	}
	for _, tc := range auth {
		t.Run(tc.name, func(t *testing.T) {
			got, hdr, body := a.call(tc.method, tc.path, tc.auth)
			if got != tc.want {
				t.Errorf("%s %s: got %d, want %d (body %s)", tc.method, tc.path, got, tc.want, body)
			}
			if got >= 400 && !strings.HasPrefix(hdr.Get("Content-Type"), "application/problem+json") {
				t.Errorf("%s %s: got Content-Type %q, want problem+json", tc.method, tc.path, hdr.Get("Content-Type"))
			}
		})
	}

	// Refusals leave an audit trail (sampled: anyone who reaches the
	// listener can be refused), with who asked and never what they sent.
	t.Run("refusals are logged without the credential", func(t *testing.T) {
		lines := a.logs.FilterMessage("keys API: request refused without a valid token").All()
		if len(lines) == 0 || len(lines) > 7 {
			t.Fatalf("refusal log lines: got %d, want 1 to 7 (7 refused, sampled)", len(lines))
		}
		for _, l := range lines {
			f := l.ContextMap()
			if addr, _ := f["remote_addr"].(string); !strings.HasPrefix(addr, "127.0.0.1:") {
				t.Errorf("refusal line: got remote_addr %v, want the caller's", f["remote_addr"])
			}
			if f["path"] != keyPath("evt_1") {
				t.Errorf("refusal line: got path %v, want %s", f["path"], keyPath("evt_1"))
			}
			for k, v := range f {
				for _, sent := range []string{"nope", "s3cret", "czNjcmV0"} {
					if strings.Contains(fmt.Sprint(v), sent) {
						t.Errorf("refusal line: got %s=%v, want nothing the caller sent as a credential", k, v)
					}
				}
			}
		}
	})

	t.Run("record fields", func(t *testing.T) {
		_, _, body := a.call(http.MethodGet, keyPath("evt_1"), bearer)
		var got map[string]any
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("record %s: %v", body, err)
		}
		want := map[string]any{"route": "orders", "namespace": "orders", "key": "evt_1", "state": "processed", "attempts": 1.0, "last_status": 200.0}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("record[%q]: got %v, want %v", k, got[k], v)
			}
		}
		for _, k := range []string{"first_seen", "completed_at", "expires_at", "body_sha256"} {
			if _, ok := got[k]; !ok {
				t.Errorf("record: %q missing in %s", k, body)
			}
		}
		for _, k := range []string{"owner", "Owner", "response", "lease_until", "maybe_processed"} {
			if _, ok := got[k]; ok {
				t.Errorf("record: %q present in %s, want it hidden", k, body)
			}
		}
	})

	t.Run("a failed record the application may have processed says so", func(t *testing.T) {
		ctx := context.Background()
		k := dedup.Key{Namespace: "orders", ID: "evt_cut"}
		res, err := a.store.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.store.Release(ctx, k, res.Token, dedup.ReleaseOptions{Retain: time.Hour, Error: "timeout", MaybeProcessed: true}); err != nil {
			t.Fatal(err)
		}
		_, _, body := a.call(http.MethodGet, keyPath("evt_cut"), bearer)
		var got map[string]any
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("record %s: %v", body, err)
		}
		if got["state"] != "failed" || got["maybe_processed"] != true {
			t.Errorf("record: got state %v maybe_processed %v, want failed true (body %s)", got["state"], got["maybe_processed"], body)
		}
	})

	t.Run("forget then forwarded again", func(t *testing.T) {
		if resp := a.send("/hooks/x", "", "Idempotency-Key: evt_1"); resp.Header.Get(HeaderDedupStatus) != "duplicate" {
			t.Fatalf("before forget: got %q, want duplicate", resp.Header.Get(HeaderDedupStatus))
		}
		if got, _, body := a.call(http.MethodDelete, keyPath("evt_1"), bearer); got != http.StatusNoContent {
			t.Fatalf("DELETE: got %d, want 204 (body %s)", got, body)
		}
		if got, _, _ := a.call(http.MethodDelete, keyPath("evt_1"), bearer); got != http.StatusNotFound {
			t.Errorf("second DELETE: got %d, want 404", got)
		}
		if _, err := a.store.Get(context.Background(), dedup.Key{Namespace: "orders", ID: "evt_1"}); err != dedup.ErrNotFound {
			t.Errorf("after forget: got %v, want ErrNotFound", err)
		}
		before := a.up().count()
		if resp := a.send("/hooks/x", "", "Idempotency-Key: evt_1"); resp.Header.Get(HeaderDedupStatus) != "forwarded" {
			t.Errorf("after forget: got %q, want forwarded", resp.Header.Get(HeaderDedupStatus))
		}
		if got := a.up().count(); got != before+1 {
			t.Errorf("after forget: got %d upstream requests, want %d", got, before+1)
		}
	})

	t.Run("forget refuses a key in flight unless forced", func(t *testing.T) {
		busy := dedup.Key{Namespace: "orders", ID: "evt_busy"}
		// A lease of its own, shorter than the route's: Retry-After is
		// what is left of it.
		if _, err := a.store.Claim(context.Background(), busy, dedup.ClaimOptions{Lease: 7 * time.Second}); err != nil {
			t.Fatal(err)
		}
		got, hdr, body := a.call(http.MethodDelete, keyPath("evt_busy"), bearer)
		if secs, err := strconv.Atoi(hdr.Get("Retry-After")); got != http.StatusConflict || err != nil || secs < 1 || secs > 7 || !strings.Contains(string(body), "force=true") {
			t.Errorf("DELETE in flight: got %d (Retry-After %q) %s, want 409 with Retry-After at most 7 (the lease's rest) naming force=true", got, hdr.Get("Retry-After"), body)
		}
		if _, err := a.store.Get(context.Background(), busy); err != nil {
			t.Errorf("after the refused DELETE: got %v, want the lease kept", err)
		}
		// In the state it names, but in flight: refused as in flight, not
		// as a state that changed.
		if got, _, body := a.call(http.MethodDelete, keyPath("evt_busy")+"?state=processing", bearer); got != http.StatusConflict || !strings.Contains(string(body), "in-flight") {
			t.Errorf("DELETE ?state=processing in flight: got %d %s, want 409 in-flight", got, body)
		}
		// A kept key is the store's answer, not its error.
		if got := counterValue(t, a.gw.metrics.storeErrors, "memory", opForget); got != 0 {
			t.Errorf("store forget errors after the refused DELETEs: got %v, want 0", got)
		}
		for _, v := range []string{"yes", "maybe"} { // not a boolean: refused, not taken for false
			if got, _, body := a.call(http.MethodDelete, keyPath("evt_busy")+"?force="+v, bearer); got != http.StatusBadRequest || !strings.Contains(string(body), "invalid-query") {
				t.Errorf("DELETE ?force=%s: got %d %s, want 400 invalid-query", v, got, body)
			}
		}
		if got, _, body := a.call(http.MethodDelete, keyPath("evt_busy")+"?force=true", bearer); got != http.StatusNoContent {
			t.Errorf("DELETE ?force=true: got %d %s, want 204", got, body)
		}
		// A forced forget shows as such in the log, for audit.
		lines := a.logs.FilterMessage("keys API: key forgotten").FilterField(zap.String("key", "evt_busy")).All()
		if len(lines) != 1 || lines[0].ContextMap()["force"] != true {
			t.Errorf("log of the forced forget: got %v, want one line with force=true", lines)
		} else if addr, _ := lines[0].ContextMap()["remote_addr"].(string); !strings.HasPrefix(addr, "127.0.0.1:") {
			t.Errorf("log of the forced forget: got remote_addr %v, want who asked", lines[0].ContextMap()["remote_addr"])
		}
	})

	// ?state= forgets the key only in that state, so a bulk forget leaves
	// a key that settled otherwise after its listing.
	t.Run("forget in a state", func(t *testing.T) {
		ctx := context.Background()
		k := dedup.Key{Namespace: "orders", ID: "evt_state"}
		c, err := a.store.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.store.Commit(ctx, k, c.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			query    string
			want     int
			wantType string
		}{
			{"?state=done", http.StatusBadRequest, "invalid-query"},
			{"?state=failed", http.StatusConflict, "state-changed"},
			{"?state=processing&force=true", http.StatusConflict, "state-changed"},
		} {
			got, _, body := a.call(http.MethodDelete, keyPath("evt_state")+tc.query, bearer)
			if got != tc.want || !strings.Contains(string(body), tc.wantType) {
				t.Errorf("DELETE %s of a processed key: got %d %s, want %d %s", tc.query, got, body, tc.want, tc.wantType)
			}
			if _, err := a.store.Get(ctx, k); err != nil {
				t.Fatalf("after DELETE %s: got %v, want the key kept", tc.query, err)
			}
		}
		if got, _, body := a.call(http.MethodDelete, keyPath("evt_state")+"?state=processed", bearer); got != http.StatusNoContent {
			t.Errorf("DELETE ?state=processed of a processed key: got %d %s, want 204", got, body)
		}
		if got, _, body := a.call(http.MethodDelete, keyPath("evt_state")+"?state=processed", bearer); got != http.StatusNotFound {
			t.Errorf("DELETE ?state=processed of a forgotten key: got %d %s, want 404", got, body)
		}
	})

	// ?keep_maybe_processed=true forgets the key only while it is not
	// marked maybe_processed, so a bulk forget leaves a key a retry's cut
	// forward marked after its listing; in flight stays "in-flight".
	t.Run("forget unless maybe processed", func(t *testing.T) {
		ctx := context.Background()
		k := dedup.Key{Namespace: "orders", ID: "evt_maybe"}
		c, err := a.store.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.store.Release(ctx, k, c.Token, dedup.ReleaseOptions{Retain: time.Hour, Error: "timeout", MaybeProcessed: true}); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			query    string
			want     int
			wantType string
		}{
			{"?keep_maybe_processed=perhaps", http.StatusBadRequest, "keep_maybe_processed=perhaps: want true or false"},
			{"?state=failed&keep_maybe_processed=true", http.StatusConflict, "the key is marked maybe_processed"},
			{"?keep_maybe_processed=1&force=true", http.StatusConflict, "state-changed"},
		} {
			got, _, body := a.call(http.MethodDelete, keyPath("evt_maybe")+tc.query, bearer)
			if got != tc.want || !strings.Contains(string(body), tc.wantType) {
				t.Errorf("DELETE %s of a maybe-processed key: got %d %s, want %d %s", tc.query, got, body, tc.want, tc.wantType)
			}
			if _, err := a.store.Get(ctx, k); err != nil {
				t.Fatalf("after DELETE %s: got %v, want the key kept", tc.query, err)
			}
		}
		busy, err := a.store.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}) // in flight, and marked
		if err != nil || !busy.Record.MaybeProcessed {
			t.Fatalf("claim of the marked key: got %+v, %v", busy, err)
		}
		if got, _, body := a.call(http.MethodDelete, keyPath("evt_maybe")+"?keep_maybe_processed=true", bearer); got != http.StatusConflict || !strings.Contains(string(body), "in-flight") {
			t.Errorf("DELETE ?keep_maybe_processed=true of a marked key in flight: got %d %s, want 409 in-flight", got, body)
		}
		if err := a.store.Release(ctx, k, busy.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 500}); err != nil { // unmarked now
			t.Fatal(err)
		}
		if got, _, body := a.call(http.MethodDelete, keyPath("evt_maybe")+"?state=failed&keep_maybe_processed=true", bearer); got != http.StatusNoContent {
			t.Errorf("DELETE ?keep_maybe_processed=true of an unmarked key: got %d %s, want 204", got, body)
		}
	})

	t.Run("a raw path is never cleaned into another key", func(t *testing.T) {
		ctx := context.Background()
		for _, id := range []string{"x/y", "x//y"} {
			c, err := a.store.Claim(ctx, dedup.Key{Namespace: "orders", ID: id}, dedup.ClaimOptions{Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if err := a.store.Commit(ctx, dedup.Key{Namespace: "orders", ID: id}, c.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []string{"/v1/keys/orders/x//y", "/v1/keys/orders/a/../x/y", "/v1/keys/orders/./x/y", "//v1/keys/orders/x//y", "/v2/../v1/keys/orders/x/y"} {
			if got, _, body := a.call(http.MethodDelete, p, bearer); got != http.StatusBadRequest {
				t.Errorf("DELETE %s: got %d %s, want 400 (ServeMux would redirect it to another key)", p, got, body)
			}
		}
		if _, err := a.store.Get(ctx, dedup.Key{Namespace: "orders", ID: "x/y"}); err != nil {
			t.Errorf("x/y after the refused DELETEs: got %v, want it kept", err)
		}
		if got, _, body := a.call(http.MethodDelete, keyPath("x//y"), bearer); got != http.StatusNoContent {
			t.Errorf("DELETE %s: got %d %s, want 204", keyPath("x//y"), got, body)
		}
		if got, _, _ := a.call(http.MethodGet, "/v1/keys/orders/x/y", bearer); got != http.StatusOK {
			t.Errorf("GET x/y: got %d, want 200 (a key with one slash may be sent raw)", got)
		}
	})

	t.Run("store down", func(t *testing.T) {
		a.fs.down.Store(true)
		defer a.fs.down.Store(false)
		if got, hdr, _ := a.call(http.MethodGet, keyPath("evt_1"), bearer); got != 503 || hdr.Get("Retry-After") == "" {
			t.Errorf("GET with the store down: got %d (Retry-After %q), want 503 with Retry-After", got, hdr.Get("Retry-After"))
		}
	})
}

// TestAdminWithoutTokenAnswersOnlyIPHosts: without a token, a web page that
// resolves a name of its own to 127.0.0.1 (DNS rebinding) must not reach the
// keys API; probes and metrics answer any Host, and admin.insecure
// (AnyHost) opens /v1 to names too.
// settlingStore lets a delivery settle the key the moment the admin API
// reads it: where a check and a forget were two store operations, the
// forget would delete what the check did not see.
type settlingStore struct {
	dedup.Store
	settle func()
}

func (s *settlingStore) Get(ctx context.Context, k dedup.Key) (dedup.Record, error) {
	rec, err := s.Store.Get(ctx, k)
	s.settle()
	return rec, err
}

// A DELETE checks the key's state and forgets it in one store operation:
// a key a retry claimed (or processed) just as the operator's DELETE
// ?state=failed (or a plain DELETE of a failed key) read it is kept, so the
// retry is not joined by a copy, and a later copy is answered as a
// duplicate. A handler that reads the key lets the retry settle it right
// after; one that does not must find it failed.
func TestAdminForgetChecksAndForgetsAtOnce(t *testing.T) {
	ctx := context.Background()
	a := newAdminHarness(t, "")
	for _, tc := range []struct {
		query, wantType string
	}{
		{"?state=failed", "state-changed"},
		{"", "in-flight"},
	} {
		k := dedup.Key{Namespace: "orders", ID: "evt_settling" + tc.query}
		c, err := a.mem.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.mem.Release(ctx, k, c.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 500}); err != nil {
			t.Fatal(err)
		}
		// The provider's retry claims the failed key; with ?state=failed
		// it is also processed.
		settled := false
		ss := &settlingStore{Store: a.mem, settle: func() {
			if settled {
				return
			}
			settled = true
			retry, err := a.mem.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
			if err != nil || retry.Outcome != dedup.Claimed {
				t.Errorf("the retry's claim: got %v, %v, want claimed", retry.Outcome, err)
				return
			}
			if tc.query != "" {
				if err := a.mem.Commit(ctx, k, retry.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
					t.Error(err)
				}
			}
		}}
		admin := httptest.NewServer(NewAdmin(a.gw, ss, AdminOptions{}))
		req, _ := http.NewRequest(http.MethodDelete, admin.URL+"/v1/keys/orders/"+url.PathEscape(k.ID)+tc.query, nil)
		resp, err := admin.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		admin.Close()
		if !settled {
			// Nothing read the key before forgetting it: it was failed.
			if resp.StatusCode != http.StatusNoContent {
				t.Errorf("DELETE%s of a failed key: got %d %s, want 204", tc.query, resp.StatusCode, body)
			}
			continue
		}
		if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), tc.wantType) {
			t.Errorf("DELETE%s of a failed key a retry claimed after the handler read it: got %d %s, want 409 %s", tc.query, resp.StatusCode, body, tc.wantType)
		}
		if _, err := a.mem.Get(ctx, k); err != nil {
			t.Errorf("DELETE%s: then Get got %v, want the retry's record kept", tc.query, err)
		}
	}
}

func TestAdminWithoutTokenAnswersOnlyIPHosts(t *testing.T) {
	a := newAdminHarness(t, "")
	anyHost := httptest.NewServer(NewAdmin(a.gw, a.fs, AdminOptions{AnyHost: true}))
	t.Cleanup(anyHost.Close)
	if resp := a.send("/hooks/x", "", "Idempotency-Key: evt_1"); resp.Status != 200 {
		t.Fatalf("forward: got %d, want 200", resp.Status)
	}
	for _, tc := range []struct {
		name, host, path string
		anyHost          bool
		want             int
	}{
		{"IPv4 with port", "127.0.0.1:9090", "/v1/keys/orders/evt_1", false, 200},
		{"IPv6 with port", "[::1]:9090", "/v1/keys/orders/evt_1", false, 200},
		{"pod IP without port", "10.1.2.3", "/v1/keys/orders/evt_1", false, 200},
		{"localhost", "LocalHost:9090", "/v1/keys/orders/evt_1", false, 200},
		{"a name", "rebind.example:9090", "/v1/keys/orders/evt_1", false, 403},
		{"a name that looks local", "127.0.0.1.nip.io", "/v1/keys/orders/evt_1", false, 403},
		{"a name, probes", "rebind.example:9090", "/readyz", false, 200},
		{"a name, metrics", "rebind.example:9090", "/metrics", false, 200},
		{"a name with AnyHost", "dedupgw-admin.default.svc:9090", "/v1/keys/orders/evt_1", true, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := a.admin.URL
			if tc.anyHost {
				url = anyHost.URL
			}
			req, err := http.NewRequest(http.MethodGet, url+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = tc.host
			resp, err := a.admin.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("GET %s with Host %s: got %d, want %d (body %s)", tc.path, tc.host, resp.StatusCode, tc.want, body)
			}
			if tc.want == 403 && !strings.Contains(string(body), "host-not-allowed") {
				t.Errorf("GET %s with Host %s: got %s, want a host-not-allowed problem", tc.path, tc.host, body)
			}
		})
	}
}

func TestAddressedByIP(t *testing.T) {
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"127.0.0.1:9090", true},
		{"127.0.0.1", true},
		{"[::1]:9090", true},
		{"[::1]", true},
		{"localhost", true},
		{"LOCALHOST:9090", true},
		{"", true}, // HTTP/1.0 without Host: no browser's
		{"rebind.example", false},
		{"rebind.example:9090", false},
		{"localhost.rebind.example", false},
		{"127.0.0.1.nip.io:9090", false},
	} {
		if got := addressedByIP(tc.host); got != tc.want {
			t.Errorf("addressedByIP(%q): got %v, want %v", tc.host, got, tc.want)
		}
	}
}

// A key's GET answers 404 both when the store never saw it and when a
// gateway claimed it and stopped mid-forward, once the claim's lease
// lapsed (Redis and memory keep the lapsed claim, but read it as not
// found until the next claim takes it over). So the 404 must not tell an
// operator asking "what happened to this event?" after a crash that there
// is no record of it: the application may have processed that attempt.
// (Found by an operator trial: a kill -9 mid-forward, then keys get said
// "the store has no record of this key" while Redis held it.)
func TestAdminKeyNotFoundAllowsALapsedClaim(t *testing.T) {
	clock := newManualClock(time.Unix(1_700_000_000, 0))
	ms := memstore.New(memstore.Options{Now: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = ms.Close() })
	gw, err := New(Config{Routes: []Route{genericRoute("orders", "/hooks/*", "http://127.0.0.1:1")}}, ms,
		Options{Logger: zap.NewNop(), Registerer: prometheus.NewRegistry(), Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gw.Close() })
	srv := httptest.NewServer(NewAdmin(gw, ms, AdminOptions{}))
	t.Cleanup(srv.Close)
	if _, err := ms.Claim(context.Background(), dedup.Key{Namespace: "orders", ID: "crashed"}, dedup.ClaimOptions{Lease: time.Second}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	for _, tt := range []struct{ name, key string }{
		{"never delivered", "unknown"},
		{"claim whose lease lapsed unsettled", "crashed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := srv.Client().Get(srv.URL + "/v1/keys/orders/" + tt.key)
			if err != nil {
				t.Fatal(err)
			}
			var p problem
			err = json.NewDecoder(resp.Body).Decode(&p)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("GET %s: got %d, want 404", tt.key, resp.StatusCode)
			}
			for _, want := range []string{"no live record", "lease lapsed", "may have processed"} {
				if !strings.Contains(p.Detail, want) {
					t.Errorf("GET %s: got detail %q, want it to say %q", tt.key, p.Detail, want)
				}
			}
		})
	}
}
