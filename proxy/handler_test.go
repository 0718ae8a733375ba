package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/providers"
)

const stripeSecret = "whsec_test_secret"

// stripeHeader signs body the way Stripe does, at time ts.
func stripeHeader(body string, ts time.Time) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	m := hmac.New(sha256.New, []byte(stripeSecret))
	m.Write([]byte(t + "." + body))
	return fmt.Sprintf("Stripe-Signature: t=%s,v1=%s", t, hex.EncodeToString(m.Sum(nil)))
}

// step is one delivery and what the sender must get.
type step struct {
	method      string // empty: POST
	path        string // empty: /hooks/orders
	body        string
	headers     []string
	wantStatus  int
	wantDedup   string // Dedup-Status; "-" means the header must be absent
	wantCT      string // Content-Type prefix, if checked
	wantBodyHas string
}

// TestDeliveryTable walks every row of DESIGN.md "What each delivery gets"
// that one sender can produce in sequence.
func TestDeliveryTable(t *testing.T) {
	ok := func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"received":true}`)
	}
	failThenOK := func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 0 {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		ok(w, r, n)
	}
	problemJSON := "application/problem+json"

	tests := []struct {
		name         string
		route        func(*Route)
		handle       func(http.ResponseWriter, *http.Request, int)
		storeDown    bool
		steps        []step
		wantUpstream int
		check        func(t *testing.T, h *harness)
	}{
		{
			name:   "first delivery, upstream 2xx: upstream's response byte for byte",
			handle: ok,
			steps:  []step{{body: `{"id":"evt_1"}`, wantStatus: 201, wantDedup: "forwarded", wantCT: "application/json", wantBodyHas: `{"received":true}`}},
			check: func(t *testing.T, h *harness) {
				rec, err := h.record("orders", "evt_1")
				if err != nil || rec.State != dedup.StateProcessed || rec.LastStatus != 201 {
					t.Errorf("record = %+v, %v; want processed with last_status 201", rec, err)
				}
			},
			wantUpstream: 1,
		},
		{
			name: "first delivery, upstream non-2xx: key becomes failed",
			handle: func(w http.ResponseWriter, _ *http.Request, _ int) {
				http.Error(w, "nope", http.StatusInternalServerError)
			},
			steps: []step{{body: `{"id":"evt_1"}`, wantStatus: 500, wantDedup: "forwarded", wantBodyHas: "nope"}},
			check: func(t *testing.T, h *harness) {
				rec, err := h.record("orders", "evt_1")
				if err != nil || rec.State != dedup.StateFailed || rec.LastStatus != 500 {
					t.Errorf("record = %+v, %v; want failed with last_status 500", rec, err)
				}
				if got := counterValue(t, h.gw.metrics.releases, "orders", reasonUpstreamStatus); got != 1 {
					t.Errorf("got %v upstream_status releases, want 1", got)
				}
				if got := counterValue(t, h.gw.metrics.deliveries, "orders", outcomeForwarded); got != 1 {
					t.Errorf("got %v forwarded deliveries, want 1", got)
				}
			},
			wantUpstream: 1,
		},
		{
			// A redirect is not success: the provider retries it, and the
			// retry must reach the app.
			name: "first delivery, upstream 3xx: key becomes failed, passed on as is",
			handle: func(w http.ResponseWriter, _ *http.Request, _ int) {
				w.Header().Set("Location", "/elsewhere")
				w.WriteHeader(http.StatusFound)
			},
			steps: []step{
				{body: `{"id":"evt_1"}`, wantStatus: 302, wantDedup: "forwarded"},
				{body: `{"id":"evt_1"}`, wantStatus: 302, wantDedup: "forwarded"},
			},
			check: func(t *testing.T, h *harness) {
				rec, err := h.record("orders", "evt_1")
				if err != nil || rec.State != dedup.StateFailed || rec.LastStatus != 302 {
					t.Errorf("record = %+v, %v; want failed with last_status 302", rec, err)
				}
			},
			wantUpstream: 2,
		},
		{
			name:   "retry of a failed key is forwarded again",
			handle: failThenOK,
			steps: []step{
				{body: `{"id":"evt_1"}`, wantStatus: 500, wantDedup: "forwarded"},
				{body: `{"id":"evt_1"}`, wantStatus: 201, wantDedup: "forwarded"},
				{body: `{"id":"evt_1"}`, wantStatus: 200, wantDedup: "duplicate"},
			},
			check: func(t *testing.T, h *harness) {
				rec, err := h.record("orders", "evt_1")
				if err != nil || rec.State != dedup.StateProcessed || rec.Attempts != 2 {
					t.Errorf("record = %+v, %v; want processed after 2 attempts", rec, err)
				}
			},
			wantUpstream: 2,
		},
		{
			name:   "duplicate of a processed key: 200 JSON ack, upstream not contacted",
			handle: ok,
			steps: []step{
				{body: `{"id":"evt_1"}`, wantStatus: 201, wantDedup: "forwarded"},
				{body: `{"id":"evt_1"}`, wantStatus: 200, wantDedup: "duplicate", wantCT: "application/json", wantBodyHas: `"status":"duplicate","route":"orders","key":"evt_1","first_seen":`},
				{headers: []string{"Idempotency-Key: evt_1"}, body: `other payload`, wantStatus: 200, wantDedup: "duplicate"},
			},
			wantUpstream: 1,
		},
		{
			name:   "duplicate_response: replay answers with the stored response",
			route:  func(r *Route) { r.DuplicateResponse = Replay },
			handle: ok,
			steps: []step{
				{body: `{"id":"evt_1"}`, wantStatus: 201, wantDedup: "forwarded"},
				{body: `{"id":"evt_1"}`, wantStatus: 201, wantDedup: "duplicate", wantCT: "application/json", wantBodyHas: `{"received":true}`},
			},
			wantUpstream: 1,
		},
		{
			name:   "no key, on_missing_key: forward: forwarded unchanged",
			handle: ok,
			steps:  []step{{body: `{"no":"id"}`, headers: []string{"Dedup-Key: spoofed"}, wantStatus: 201, wantDedup: "unkeyed"}},
			check: func(t *testing.T, h *harness) {
				if got := h.up().request(0).Header.Get("Dedup-Key"); got != "" {
					t.Errorf("upstream Dedup-Key = %q, want none for an unkeyed delivery", got)
				}
			},
			wantUpstream: 1,
		},
		{
			name:  "no key, on_missing_key: reject: 400 naming the expected key",
			route: func(r *Route) { r.OnMissingKey = Reject },
			steps: []step{
				{body: `{"no":"id"}`, wantStatus: 400, wantDedup: "rejected", wantCT: problemJSON, wantBodyHas: "header:Idempotency-Key, then json:id"},
				// Webhook and API routes share the title: not "Idempotency key".
				{body: `{"no":"id"}`, wantStatus: 400, wantDedup: "rejected", wantBodyHas: `"title":"Deduplication key missing or invalid"`},
			},
		},
		{
			name:  "body not JSON, on_missing_key: reject: 400 saying so",
			route: func(r *Route) { r.OnMissingKey = Reject },
			steps: []step{{body: `{"id":"evt_1",`, wantStatus: 400, wantDedup: "rejected", wantCT: problemJSON, wantBodyHas: "(the body is not valid JSON)"}},
		},
		{
			name:         "body not JSON, on_missing_key: forward: forwarded unkeyed",
			handle:       ok,
			steps:        []step{{body: `{"id":"evt_1",`, wantStatus: 201, wantDedup: "unkeyed"}},
			wantUpstream: 1,
		},
		{
			name:  "API key too long or not printable ASCII: 400",
			route: func(r *Route) { r.OnMissingKey = Reject },
			steps: []step{
				{headers: []string{"Idempotency-Key: " + strings.Repeat("k", 256)}, wantStatus: 400, wantDedup: "rejected", wantCT: problemJSON},
				{body: `{"id":"caf\u00e9"}`, wantStatus: 400, wantDedup: "rejected"},
				{body: `{"id":"tab\there"}`, wantStatus: 400, wantDedup: "rejected"},
				{body: `{"id":"del\u007f"}`, wantStatus: 400, wantDedup: "rejected"},
				{headers: []string{"Idempotency-Key: " + strings.Repeat("k", 255)}, wantStatus: 200, wantDedup: "forwarded"},
				{body: `{"id":" edges~"}`, wantStatus: 200, wantDedup: "forwarded"}, // 0x20 and 0x7e
			},
			wantUpstream: 2,
		},
		{
			name: "invalid or stale signature: 401, nothing recorded",
			route: func(r *Route) {
				r.Provider = providers.Config{Provider: providers.Stripe, Secrets: []string{stripeSecret}}
			},
			handle: ok,
			steps: []step{
				{body: `{"id":"evt_s"}`, wantStatus: 401, wantDedup: "rejected", wantCT: problemJSON},
				{body: `{"id":"evt_s"}`, headers: []string{stripeHeader(`{"id":"other"}`, time.Now())}, wantStatus: 401, wantDedup: "rejected"},
				{body: `{"id":"evt_s"}`, headers: []string{stripeHeader(`{"id":"evt_s"}`, time.Now().Add(-time.Hour))}, wantStatus: 401, wantDedup: "rejected"},
				{body: `{"id":"evt_s"}`, headers: []string{stripeHeader(`{"id":"evt_s"}`, time.Now())}, wantStatus: 201, wantDedup: "forwarded"},
			},
			wantUpstream: 1,
		},
		{
			name:  "body larger than max_body_bytes: 413, nothing recorded",
			route: func(r *Route) { r.MaxBodyBytes = 16 },
			steps: []step{
				{body: `{"id":"evt_big","pad":"xxxxxxxxxxxxxxxx"}`, wantStatus: 413, wantDedup: "rejected", wantCT: problemJSON},
				{body: `{"id":"evt_1"}`, wantStatus: 200, wantDedup: "forwarded"},
			},
			check: func(t *testing.T, h *harness) {
				if _, err := h.record("orders", "evt_big"); err != dedup.ErrNotFound {
					t.Errorf("oversized delivery: got record err %v, want ErrNotFound", err)
				}
			},
			wantUpstream: 1,
		},
		{
			name:         "store unreachable, on_store_error: forward: fail open",
			storeDown:    true,
			handle:       ok,
			steps:        []step{{body: `{"id":"evt_1"}`, wantStatus: 201, wantDedup: "store-error"}, {body: `{"id":"evt_1"}`, wantStatus: 201, wantDedup: "store-error"}},
			wantUpstream: 2,
		},
		{
			name:      "store unreachable, on_store_error: reject: 503 + Retry-After",
			route:     func(r *Route) { r.OnStoreError = Reject },
			storeDown: true,
			steps:     []step{{body: `{"id":"evt_1"}`, wantStatus: 503, wantDedup: "store-error", wantCT: problemJSON}},
			check: func(t *testing.T, h *harness) {
				resp := h.send("/hooks/orders", `{"id":"evt_1"}`)
				if got := resp.Header.Get("Retry-After"); got == "" {
					t.Errorf("Retry-After missing on 503")
				}
			},
		},
		{
			name:  "no route matches: 404 without Dedup-Status",
			steps: []step{{path: "/elsewhere", body: `{"id":"evt_1"}`, wantStatus: 404, wantDedup: "-", wantCT: problemJSON}},
		},
		{
			name:  "method not allowed on the route: 405",
			steps: []step{{method: http.MethodGet, wantStatus: 405, wantDedup: "rejected", wantCT: problemJSON}},
		},
		{
			name:   "another method, on_other_method: forward: passed through, not deduplicated",
			route:  func(r *Route) { r.OnOtherMethod = Forward },
			handle: ok,
			steps: []step{
				{method: http.MethodGet, headers: []string{"Idempotency-Key: k1", "Dedup-Key: spoofed"}, wantStatus: 201, wantDedup: "unkeyed"},
				{method: http.MethodGet, headers: []string{"Idempotency-Key: k1"}, wantStatus: 201, wantDedup: "unkeyed"},
				{method: http.MethodOptions, headers: []string{"Access-Control-Request-Method: POST", "Access-Control-Request-Headers: idempotency-key"}, wantStatus: 201, wantDedup: "unkeyed"},
				{method: http.MethodDelete, body: `{"id":"k1"}`, wantStatus: 201, wantDedup: "unkeyed"},
				{headers: []string{"Idempotency-Key: k1"}, wantStatus: 201, wantDedup: "forwarded"},
				{headers: []string{"Idempotency-Key: k1"}, wantStatus: 200, wantDedup: "duplicate"},
			},
			check: func(t *testing.T, h *harness) {
				for i, want := range []string{http.MethodGet, http.MethodGet, http.MethodOptions, http.MethodDelete, http.MethodPost} {
					got := h.up().request(i)
					if got.Method != want {
						t.Errorf("upstream request %d: got method %s, want %s", i, got.Method, want)
					}
					if dk := got.Header.Get("Dedup-Key"); (dk != "") != (want == http.MethodPost) {
						t.Errorf("upstream request %d (%s): got Dedup-Key %q, want one only on the POST", i, want, dk)
					}
				}
				if got := string(h.up().request(3).Body); got != `{"id":"k1"}` {
					t.Errorf("the DELETE's body upstream: got %q, want it as sent", got)
				}
				// Only the POST and its duplicate are deliveries.
				if got := deliveriesCounted(t, h, "orders"); got != 2 {
					t.Errorf("deliveries counted: got %v, want 2 (forwarded, duplicate; passed-through methods are not deliveries)", got)
				}
			},
			wantUpstream: 5,
		},
		{
			// Django, Flask, Symfony and Laravel read the method upper-cased:
			// a "post" passed through would reach the application as a POST
			// with no key claimed.
			name:   "a deduplicated method in another case, on_other_method: forward: 405",
			route:  func(r *Route) { r.OnOtherMethod = Forward },
			handle: ok,
			steps: []step{
				{method: "post", headers: []string{"Idempotency-Key: k1"}, wantStatus: 405, wantDedup: "rejected", wantCT: problemJSON},
				{method: "Post", headers: []string{"Idempotency-Key: k1"}, wantStatus: 405, wantDedup: "rejected", wantCT: problemJSON},
				{method: "get", wantStatus: 201, wantDedup: "unkeyed"},
			},
			wantUpstream: 1,
		},
		{
			// Meta (WhatsApp, Instagram, Messenger) checks a subscription with
			// an unsigned GET ?hub.challenge=… that the application answers;
			// nothing unsigned it might take for an event gets through.
			name: "signed route, on_other_method: forward: only a GET or HEAD without a body passes, unverified",
			route: func(r *Route) {
				r.OnOtherMethod = Forward
				r.Provider = providers.Config{Provider: providers.Stripe, Secrets: []string{stripeSecret}}
			},
			handle: ok,
			steps: []step{
				{method: http.MethodGet, path: "/hooks/orders?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=meatyhamhock", wantStatus: 201, wantDedup: "unkeyed"},
				{method: http.MethodHead, wantStatus: 201, wantDedup: "unkeyed"},
				{method: http.MethodGet, body: `{"id":"evt_s"}`, wantStatus: 405, wantDedup: "rejected", wantCT: problemJSON, wantBodyHas: "only as a GET or HEAD without a body"},
				{method: http.MethodDelete, wantStatus: 405, wantDedup: "rejected"},
				{method: http.MethodPut, body: `{"id":"evt_s"}`, headers: []string{stripeHeader(`{"id":"evt_s"}`, time.Now())}, wantStatus: 405, wantDedup: "rejected"},
				{method: "get", wantStatus: 405, wantDedup: "rejected"},
				{body: `{"id":"evt_s"}`, wantStatus: 401, wantDedup: "rejected"},
				{body: `{"id":"evt_s"}`, headers: []string{stripeHeader(`{"id":"evt_s"}`, time.Now())}, wantStatus: 201, wantDedup: "forwarded"},
			},
			check: func(t *testing.T, h *harness) {
				for i, want := range []string{http.MethodGet, http.MethodHead, http.MethodPost} {
					if got := h.up().request(i).Method; got != want {
						t.Errorf("upstream request %d: got method %s, want %s", i, got, want)
					}
				}
				if got := h.up().request(0).Query; !strings.Contains(got, "hub.challenge=1158201444") {
					t.Errorf("the subscription check's query upstream: got %q, want it as sent", got)
				}
				resp := h.do(context.Background(), http.MethodDelete, "/hooks/orders", "")
				if got, want := resp.Header.Get("Allow"), "POST, GET, HEAD"; got != want {
					t.Errorf("405's Allow: got %q, want %q", got, want)
				}
			},
			wantUpstream: 3,
		},
		{
			name:  "another method, on_other_method: forward, body over max_body_bytes: 413",
			route: func(r *Route) { r.OnOtherMethod, r.MaxBodyBytes = Forward, 8 },
			steps: []step{{method: http.MethodPut, body: `{"id":"too long"}`, wantStatus: 413, wantDedup: "rejected", wantCT: problemJSON}},
			check: func(t *testing.T, h *harness) {
				if got := deliveriesCounted(t, h, "orders"); got != 0 {
					t.Errorf("deliveries counted: got %v, want 0 (a passed-through method is not a delivery, whatever its answer)", got)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, tc.handle)
			r := genericRoute("orders", "/hooks/orders", up.URL)
			if tc.route != nil {
				tc.route(&r)
			}
			fs := &flakyStore{}
			h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{store: fs})
			fs.Store = h.mem
			fs.down.Store(tc.storeDown)
			h.upstream = up
			for i, s := range tc.steps {
				method, path := s.method, s.path
				if method == "" {
					method = http.MethodPost
				}
				if path == "" {
					path = "/hooks/orders"
				}
				resp := h.do(context.Background(), method, path, s.body, s.headers...)
				if resp.Status != s.wantStatus {
					t.Errorf("step %d: got status %d, want %d (body %s)", i, resp.Status, s.wantStatus, resp.Body)
				}
				gotDedup, present := resp.Header.Get(HeaderDedupStatus), len(resp.Header.Values(HeaderDedupStatus)) > 0
				switch {
				case s.wantDedup == "-" && present:
					t.Errorf("step %d: got Dedup-Status %q, want none", i, gotDedup)
				case s.wantDedup != "-" && gotDedup != s.wantDedup:
					t.Errorf("step %d: got Dedup-Status %q, want %q", i, gotDedup, s.wantDedup)
				}
				if n := len(resp.Header.Values(HeaderDedupStatus)); n > 1 {
					t.Errorf("step %d: got %d Dedup-Status headers, want 1", i, n)
				}
				if s.wantCT != "" && !strings.HasPrefix(resp.Header.Get("Content-Type"), s.wantCT) {
					t.Errorf("step %d: got Content-Type %q, want %q", i, resp.Header.Get("Content-Type"), s.wantCT)
				}
				if s.wantBodyHas != "" && !hasBody(resp.Body, s.wantBodyHas) {
					t.Errorf("step %d: got body %s, want it to contain %s", i, resp.Body, s.wantBodyHas)
				}
			}
			if got := up.count(); got != tc.wantUpstream {
				t.Errorf("got %d requests upstream, want %d", got, tc.wantUpstream)
			}
			if tc.check != nil {
				tc.check(t, h)
			}
		})
	}
}

// TestSettledBy: the in-flight 409's Retry-After points at when the
// holder's forward and settle end (upstream_timeout and the store timeout
// after the claim), not at its lease's end, unless that time has passed
// (the holder crashed, or retries its commit) or comes no earlier.
func TestSettledBy(t *testing.T) {
	g := &Gateway{storeTimeout: 5 * time.Second}
	claimed := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name            string
		lease, upstream time.Duration
		since           time.Duration // now - claimed
		want            time.Duration // settledBy - claimed
	}{
		{"just claimed", 60 * time.Second, 30 * time.Second, time.Second, 35 * time.Second},
		{"forward under way", 30 * time.Second, 10 * time.Second, 12 * time.Second, 15 * time.Second},
		{"should have settled: the lease's end", 30 * time.Second, 10 * time.Second, 16 * time.Second, 30 * time.Second},
		{"no earlier than the lease's end", 12 * time.Second, 10 * time.Second, time.Second, 12 * time.Second},
		// The lease was granted on a clock 10 minutes ahead of ours: the
		// claim, already in the store, is read as made now.
		{"holder's clock ahead", 60 * time.Second, 30 * time.Second, -10 * time.Minute, -10*time.Minute + 35*time.Second},
		{"holder's clock ahead, no earlier than the lease's end", 12 * time.Second, 10 * time.Second, -10 * time.Minute, -10*time.Minute + 12*time.Second},
	}
	for _, tt := range tests {
		rt := &route{Route: Route{Lease: tt.lease, UpstreamTimeout: tt.upstream}}
		got := g.settledBy(rt, claimed.Add(tt.lease), claimed.Add(tt.since)).Sub(claimed)
		if got != tt.want {
			t.Errorf("%s: got settled %v after the claim, want %v", tt.name, got, tt.want)
		}
	}
	if got := g.settledBy(&route{}, time.Time{}, claimed); !got.IsZero() {
		t.Errorf("no lease end known: got %v, want the zero time (retryAfterSeconds then uses the lease)", got)
	}
}

// deliveriesCounted returns dedupgw_deliveries_total summed over every
// outcome of route.
func deliveriesCounted(t *testing.T, h *harness, route string) float64 {
	t.Helper()
	total := 0.0
	for _, o := range append(slices.Clone(outcomes), outcomeOtherMethod, outcomeRejectedMethod) {
		total += counterValue(t, h.gw.metrics.deliveries, route, o)
	}
	return total
}

// TestSignedForwardRefusesBodiesOnTheWire: a signed route with
// on_other_method: forward passes only a GET or HEAD without a body, however
// the body is framed on the wire. A chunked body has no Content-Length
// (ContentLength -1), so a check for "no Content-Length" rather than "none
// at all" would forward it unverified; net/http's client cannot send a
// chunked GET, so these requests are written by hand.
func TestSignedForwardRefusesBodiesOnTheWire(t *testing.T) {
	up := newUpstream(t, nil)
	r := genericRoute("orders", "/hooks/orders", up.URL)
	r.OnOtherMethod = Forward
	r.Provider = providers.Config{Provider: providers.Stripe, Secrets: []string{stripeSecret}}
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
	h.upstream = up
	const event = "15\r\n{\"id\":\"evt_unsigned\"}\r\n0\r\n\r\n"
	tests := []struct {
		name, request string
		want          int
	}{
		{"a chunked GET", "GET /hooks/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + event, http.StatusMethodNotAllowed},
		{"a chunked HEAD", "HEAD /hooks/orders HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + event, http.StatusMethodNotAllowed},
		{"a chunked GET saying Content-Length: 0", "GET /hooks/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n" + event, http.StatusMethodNotAllowed},
		{"a HEAD with a Content-Length", "HEAD /hooks/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 21\r\n\r\n{\"id\":\"evt_unsigned\"}", http.StatusMethodNotAllowed},
		{"a GET with Content-Length: 0", "GET /hooks/orders HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := up.count()
			c, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, tt.request); err != nil {
				t.Fatal(err)
			}
			method, _, _ := strings.Cut(tt.request, " ")
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("got status %d, want %d", resp.StatusCode, tt.want)
			}
			wantUp := 0
			if tt.want == http.StatusOK {
				wantUp = 1
			}
			if got := up.count() - before; got != wantUp {
				t.Errorf("upstream requests: got %d, want %d", got, wantUp)
			}
			for i := before; i < up.count(); i++ {
				if b := up.request(i).Body; len(b) != 0 {
					t.Errorf("upstream request %d: got body %q, want none (unverified)", i, b)
				}
			}
		})
	}
}

// TestForwardedRequestReachesUpstreamIntact checks the body byte for byte,
// end-to-end headers, X-Forwarded-*, Dedup-Key and the upstream base path.
func TestForwardedRequestReachesUpstreamIntact(t *testing.T) {
	up := newUpstream(t, nil)
	r := genericRoute("orders", "/hooks/*", up.URL+"/base")
	r.Namespace = "shop"
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
	// Not canonical JSON, odd spacing, a trailing newline and a NUL byte:
	// signatures upstream depend on every byte.
	body := "{ \"id\" : \"evt_42\",\n\t\"amount\": 1.50e2 ,\"x\":\"\\u0000\"}\n"
	resp := h.send("/hooks/orders/v1?via=test", body,
		"Content-Type: application/json; charset=utf-8",
		"Stripe-Signature: t=1,v1=abc",
		"X-Forwarded-For: 203.0.113.7",
		"Dedup-Key: spoofed:key",
		"Dedup_Key: stripe:evt_victim", // one HTTP_DEDUP_KEY with Dedup-Key in CGI-style servers
		"Dedup.Key: stripe:evt_victim", // in PHP too, which reads "." in a name as "_"
		"X_Forwarded_For: 10.0.0.1",    // and one HTTP_X_FORWARDED_FOR
		"X-Forwarded.Proto: https",     // and one HTTP_X_FORWARDED_PROTO
		"Stripe_Signature: t=2,v1=def", // beside the real one, which the gateway checked
		"X-Request_Id: kept",           // a name with "_" that collides with nothing
		"X-Trace.Id: kept",             // a name with "." that collides with nothing
		"Connection: X-Hop",
		"X-Hop: must-not-pass",
	)
	if resp.Status != http.StatusOK {
		t.Fatalf("got status %d, want 200", resp.Status)
	}
	got := up.request(0)
	checks := []struct{ name, got, want string }{
		{"body", string(got.Body), body},
		{"path", got.Path, "/base/hooks/orders/v1"},
		{"query", got.Query, "via=test"},
		{"Content-Type", got.Header.Get("Content-Type"), "application/json; charset=utf-8"},
		{"Stripe-Signature", got.Header.Get("Stripe-Signature"), "t=1,v1=abc"},
		{"Dedup-Key", strings.Join(got.Header.Values("Dedup-Key"), ","), "shop:evt_42"},
		{"X-Forwarded-For", got.Header.Get("X-Forwarded-For"), "203.0.113.7, 127.0.0.1"},
		{"X-Forwarded-Proto", got.Header.Get("X-Forwarded-Proto"), "http"},
		{"X-Forwarded-Host", got.Header.Get("X-Forwarded-Host"), strings.TrimPrefix(h.srv.URL, "http://")},
		{"X-Hop", got.Header.Get("X-Hop"), ""},
		{"Content-Length", got.Header.Get("Content-Length"), strconv.Itoa(len(body))},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("upstream %s: got %q, want %q", c.name, c.got, c.want)
		}
	}
	for name, v := range got.Header {
		if strings.IndexAny(name, "_.") >= 0 && name != "X-Request_id" && name != "X-Trace.id" {
			t.Errorf("upstream header %s: %q, want no look-alike of a header the gateway sets or another of the request", name, v)
		}
	}
	for _, name := range []string{"X-Request_id", "X-Trace.id"} {
		if got := got.Header.Get(name); got != "kept" {
			t.Errorf("upstream %s: got %q, want kept (only look-alikes go)", name, got)
		}
	}
	if got.Method != http.MethodPost {
		t.Errorf("upstream method: got %s, want POST", got.Method)
	}
}

// TestPreserveHost: by default the upstream gets its own host as Host, as
// httputil.ProxyRequest.SetURL sends it; with PreserveHost it gets the
// sender's, which an application checking Host against its own names
// (Django's ALLOWED_HOSTS) needs. X-Forwarded-Host carries the sender's
// either way.
func TestPreserveHost(t *testing.T) {
	up := newUpstream(t, nil)
	own := genericRoute("own", "/hooks/own", up.URL)
	kept := genericRoute("kept", "/hooks/kept", up.URL)
	kept.PreserveHost = true
	h := newHarness(t, Config{Routes: []Route{own, kept}}, harnessOpts{})
	upHost := strings.TrimPrefix(up.URL, "http://")
	tests := []struct {
		path, wantHost string
	}{
		{"/hooks/own", upHost},
		{"/hooks/kept", "hooks.example.com"},
	}
	for i, tt := range tests {
		if resp := h.send(tt.path, `{"id":"evt_host"}`, "Host: hooks.example.com"); resp.Status != http.StatusOK {
			t.Fatalf("%s: got status %d, want 200", tt.path, resp.Status)
		}
		got := up.request(i)
		if got.Host != tt.wantHost {
			t.Errorf("%s: upstream Host: got %q, want %q", tt.path, got.Host, tt.wantHost)
		}
		if xfh := got.Header.Get("X-Forwarded-Host"); xfh != "hooks.example.com" {
			t.Errorf("%s: upstream X-Forwarded-Host: got %q, want hooks.example.com", tt.path, xfh)
		}
	}
}

// TestStripPath: with StripPath the upstream gets what follows the route's
// path appended to its own (nothing on an exact route, without a "/"
// added), escapes and the query kept; without it the whole path.
func TestStripPath(t *testing.T) {
	up := newUpstream(t, nil)
	exact := genericRoute("exact", "/webhooks/stripe", up.URL+"/stripe/webhook")
	exact.StripPath = true
	prefix := genericRoute("prefix", "/billing/*", up.URL+"/base")
	prefix.StripPath = true
	bare := genericRoute("bare", "/bare/*", up.URL)
	bare.StripPath = true
	kept := genericRoute("kept", "/kept/*", up.URL+"/base")
	h := newHarness(t, Config{Routes: []Route{exact, prefix, bare, kept}}, harnessOpts{})
	tests := []struct {
		send, wantURI string
	}{
		{"/webhooks/stripe", "/stripe/webhook"},
		{"/webhooks/stripe?x=1", "/stripe/webhook?x=1"},
		{"/billing/invoices/7", "/base/invoices/7"},
		{"/billing/", "/base/"},
		{"/billing", "/base"},
		{"/billing/a%20b/50%25-off", "/base/a%20b/50%25-off"},
		{"/billing/%41b", "/base/%41b"}, // an escape kept as sent
		{"/bill%69ng/x%41", "/base/xA"}, // the route's part escaped: rebuilt from the path
		{"/bare/x", "/x"},
		{"/bare", "/"},
		{"/kept/x", "/base/kept/x"},
	}
	for i, tt := range tests {
		if resp := h.send(tt.send, fmt.Sprintf(`{"id":"evt_strip_%d"}`, i)); resp.Status != http.StatusOK {
			t.Fatalf("%s: got status %d, want 200", tt.send, resp.Status)
		}
		if got := up.request(i).URI; got != tt.wantURI {
			t.Errorf("%s: upstream request target: got %q, want %q", tt.send, got, tt.wantURI)
		}
	}
}

// TestForwardedProtoAndHostBehindAnIngress checks that the X-Forwarded-Proto
// and X-Forwarded-Host an ingress terminating TLS set reach the upstream, as
// they did before the gateway stood in between (an app that redirects plain
// http to https would answer every webhook with a redirect), when the sender
// is on a loopback or private address and the values are sound; otherwise
// the gateway sets its own view.
func TestForwardedProtoAndHostBehindAnIngress(t *testing.T) {
	for _, cfg := range []struct {
		name    string
		trusted []netip.Prefix
	}{
		{"default trusted proxies", nil},
		{"configured", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("35.191.0.0/16")}},
	} {
		t.Run(cfg.name, func(t *testing.T) { testForwardedProtoAndHost(t, cfg.trusted) })
	}
}

// peerHarness serves one generic route "orders" on /hooks/orders to up,
// trusting the proxies trusted (nil: the defaults), and lets the test set
// the sender's address the gateway sees; nil, the start, is the real one
// (loopback).
func peerHarness(t *testing.T, up *upstream, trusted []netip.Prefix) (*harness, *atomic.Pointer[string]) {
	t.Helper()
	peer := new(atomic.Pointer[string])
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{
		trusted: trusted,
		wrap: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if p := peer.Load(); p != nil {
					r.RemoteAddr = *p
				}
				next.ServeHTTP(w, r)
			})
		},
	})
	return h, peer
}

func testForwardedProtoAndHost(t *testing.T, trusted []netip.Prefix) {
	up := newUpstream(t, nil)
	h, peer := peerHarness(t, up, trusted)
	own := strings.TrimPrefix(h.srv.URL, "http://")
	ingress := []string{"X-Forwarded-Proto: https", "X-Forwarded-Host: hooks.example.com"}
	byDefault := trusted == nil
	pick := func(ifDefault, ifConfigured string) string {
		if byDefault {
			return ifDefault
		}
		return ifConfigured
	}
	tests := []struct {
		name      string
		peer      string // "" for loopback
		headers   []string
		wantProto string
		wantHost  string
	}{
		{"set by the ingress", "", ingress, "https", "hooks.example.com"},
		{"an ingress on a private address", "10.1.2.3:40000", ingress, pick("https", "http"), pick("hooks.example.com", own)},
		{"an IPv6 private peer", "[fd00::7]:40000", ingress, pick("https", "http"), pick("hooks.example.com", own)},
		{"an IPv4-mapped private peer", "[::ffff:192.168.1.2]:40000", ingress, pick("https", "http"), pick("hooks.example.com", own)},
		{"shared address space (RFC 6598)", "100.64.7.8:40000", ingress, pick("https", "http"), pick("hooks.example.com", own)},
		{"a cloud load balancer's public range", "35.191.1.2:40000", ingress, pick("http", "https"), pick(own, "hooks.example.com")},
		{"a public peer is not trusted", "203.0.113.9:40000", ingress, "http", own},
		{"a proxy chain's comma list", "", []string{"X-Forwarded-Proto: https, https", "X-Forwarded-Host: a.example, b.example"}, "https, https", "a.example, b.example"},
		{"only the proto", "", []string{"X-Forwarded-Proto: https"}, "https", own},
		{"an unsound proto", "", []string{"X-Forwarded-Proto: javascript", "X-Forwarded-Host: a b"}, "http", own},
		{"an empty proto", "", []string{"X-Forwarded-Proto:"}, "http", own},
		{"none", "", nil, "http", own},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.peer == "" {
				peer.Store(nil)
			} else {
				peer.Store(&tt.peer)
			}
			body := fmt.Sprintf(`{"id":"evt_xf_%d"}`, i)
			if resp := h.send("/hooks/orders", body, tt.headers...); resp.Status != http.StatusOK {
				t.Fatalf("got status %d, want 200", resp.Status)
			}
			got := up.request(i).Header
			if p := strings.Join(got.Values("X-Forwarded-Proto"), ","); p != tt.wantProto {
				t.Errorf("upstream X-Forwarded-Proto: got %q, want %q", p, tt.wantProto)
			}
			if host := strings.Join(got.Values("X-Forwarded-Host"), ","); host != tt.wantHost {
				t.Errorf("upstream X-Forwarded-Host: got %q, want %q", host, tt.wantHost)
			}
		})
	}
}

// TestProxyHeadersOnlyFromTrustedPeers: the headers by which a proxy tells
// an application the client's address, scheme, port or TLS certificate
// (X-Real-IP, X-Forwarded-Port, X-Forwarded-Ssl, …) reach the upstream from
// a trusted peer (an ingress) as they were, and never from another sender,
// not even spelt with "_" for "-", which Rack and PHP read as the same
// header. Other headers pass either way.
func TestProxyHeadersOnlyFromTrustedPeers(t *testing.T) {
	up := newUpstream(t, nil)
	h, peer := peerHarness(t, up, nil)
	sent := []struct {
		name, value string
		proxy       bool // a proxy header: dropped from an untrusted peer
	}{
		{"X-Real-IP", "198.51.100.7", true},
		{"X-Forwarded-Port", "443", true},
		{"X-Forwarded-Prefix", "/admin", true},
		{"X-Forwarded-Ssl", "on", true},
		{"X-Forwarded-Scheme", "https", true},
		{"X-Forwarded-Tls-Client-Cert", "MIIB", true},
		{"X-Forwarded-Tls-Client-Cert-Info", "Subject%3D%22CN%3Dx%22", true},
		{"X-Forwarded-Uri", "/admin", true},
		{"X-Forwarded-Method", "DELETE", true},
		{"X-Url-Scheme", "https", true},
		{"Front-End-Https", "on", true},
		{"X-Scheme", "https", true},
		{"True-Client-IP", "198.51.100.8", true},
		{"X-Client-IP", "198.51.100.9", true},
		{"Client-IP", "198.51.100.10", true},
		{"CF-Connecting-IP", "198.51.100.11", true},
		{"Fastly-Client-IP", "198.51.100.12", true},
		{"X-Cluster-Client-IP", "198.51.100.13", true},
		{"X-Original-Forwarded-For", "198.51.100.14", true},
		{"X-Original-URL", "/webhooks/stripe", true},
		{"X-Rewrite-URL", "/webhooks/stripe", true},
		{"X_Forwarded_Server", "evil.example", true},
		{"X-Custom", "kept", false},
	}
	var lines []string
	for _, hd := range sent {
		lines = append(lines, hd.name+": "+hd.value)
	}
	tests := []struct {
		name    string
		peer    string
		trusted bool
	}{
		{"a trusted ingress", "10.1.2.3:40000", true},
		{"a public sender", "203.0.113.9:40000", false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer.Store(&tt.peer)
			if resp := h.send("/hooks/orders", fmt.Sprintf(`{"id":"evt_ph_%d"}`, i), lines...); resp.Status != http.StatusOK {
				t.Fatalf("got status %d, want 200", resp.Status)
			}
			got := up.request(i).Header
			for _, hd := range sent {
				want := hd.value
				if hd.proxy && !tt.trusted {
					want = ""
				}
				name := http.CanonicalHeaderKey(hd.name)
				if v := strings.Join(got[name], ","); v != want {
					t.Errorf("upstream %s: got %q, want %q", name, v, want)
				}
			}
		})
	}
}

// TestUnroutedRequestsLeaveATrace checks that a request reaching no route
// (a provider posting to a misspelt URL) is counted by reason and logged
// with its path, at most sampledLogsPerSecond times a second, so that
// scanners cannot flood the log.
func TestUnroutedRequestsLeaveATrace(t *testing.T) {
	up := newUpstream(t, nil)
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{logClock: fixedLogClock{}})
	sends := []struct {
		path   string
		status int
	}{
		{"/hooks/ordres", http.StatusNotFound},
		{"/hooks/../hooks/orders", http.StatusBadRequest}, // not canonical
		{"/hooks//orders", http.StatusBadRequest},         // not canonical either
	}
	for i := range 5 {
		sends = append(sends, struct {
			path   string
			status int
		}{fmt.Sprintf("/scan/%d", i), http.StatusNotFound})
	}
	for _, s := range sends {
		if resp := h.send(s.path, `{"id":"evt_1"}`); resp.Status != s.status {
			t.Errorf("POST %s: got status %d, want %d", s.path, resp.Status, s.status)
		}
	}
	if got := up.count(); got != 0 {
		t.Errorf("upstream requests: got %d, want 0", got)
	}
	for reason, want := range map[string]float64{unroutedNoRoute: 6, unroutedInvalidPath: 2} {
		if got := counterValue(t, h.gw.metrics.unrouted, reason); got != want {
			t.Errorf("dedupgw_unrouted_requests_total{reason=%q}: got %v, want %v", reason, got, want)
		}
	}
	logged := h.logs.FilterMessage("request reached no route").All()
	if len(logged) != sampledLogsPerSecond {
		t.Fatalf("log entries within one second: got %d, want %d (sampled)", len(logged), sampledLogsPerSecond)
	}
	first := logged[0].ContextMap()
	for field, want := range map[string]any{"reason": unroutedNoRoute, "status": int64(http.StatusNotFound), "method": "POST", "path": "/hooks/ordres"} {
		if got := first[field]; got != want {
			t.Errorf("first log entry's %s: got %v (%T), want %v", field, got, got, want)
		}
	}
	if got := logged[1].ContextMap()["reason"]; got != unroutedInvalidPath {
		t.Errorf("second log entry's reason: got %v, want %s", got, unroutedInvalidPath)
	}
}

// TestAmbiguousKeyIsRefused checks that a delivery whose key header appears
// twice with different values is refused with 400 even on a route that
// forwards deliveries without a key (on_missing_key: forward): forwarded
// without deduplication, a captured delivery replayed with a second key
// header would reach the application again.
func TestAmbiguousKeyIsRefused(t *testing.T) {
	up := newUpstream(t, nil)
	r := genericRoute("orders", "/hooks/orders", up.URL)
	r.Provider.Keys = []string{"header:X-Event-Id", "body"}
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
	body := `{"id":"evt_1"}`
	if resp := h.send("/hooks/orders", body, "X-Event-Id: e-1"); resp.Header.Get(HeaderDedupStatus) != "forwarded" {
		t.Fatalf("first delivery: got %d %q, want forwarded", resp.Status, resp.Header.Get(HeaderDedupStatus))
	}
	resp := h.send("/hooks/orders", body, "X-Event-Id: e-1", "X-Event-Id: e-2")
	if resp.Status != http.StatusBadRequest || resp.Header.Get(HeaderDedupStatus) != "rejected" || !hasBody(resp.Body, "appears more than once") {
		t.Errorf("replay with a second key header: got %d %q %s, want 400 rejected", resp.Status, resp.Header.Get(HeaderDedupStatus), resp.Body)
	}
	if got := up.count(); got != 1 {
		t.Errorf("upstream requests: got %d, want 1", got)
	}
}

// fixedLogClock stamps every log entry with one instant.
type fixedLogClock struct{}

func (fixedLogClock) Now() time.Time                         { return time.Unix(1_700_000_000, 0) }
func (fixedLogClock) NewTicker(d time.Duration) *time.Ticker { return time.NewTicker(d) }

// TestConcurrentCopiesReachUpstreamOnce sends 40 concurrent copies of one
// event; exactly one is forwarded, the rest are in-flight or duplicate.
func TestConcurrentCopiesReachUpstreamOnce(t *testing.T) {
	for _, mode := range []string{Reject, Wait} {
		t.Run(mode, func(t *testing.T) {
			up := newUpstream(t, nil)
			r := genericRoute("orders", "/hooks/orders", up.URL)
			r.OnInFlight = mode
			h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
			const n = 40
			var (
				wg     sync.WaitGroup
				mu     sync.Mutex
				counts = map[string]int{}
				errs   []error
			)
			start := make(chan struct{})
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					resp, err := h.try(context.Background(), http.MethodPost, "/hooks/orders", `{"id":"evt_burst"}`)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, err)
						return
					}
					counts[fmt.Sprintf("%d %s", resp.Status, resp.Header.Get(HeaderDedupStatus))]++
				}()
			}
			close(start)
			wg.Wait()
			if len(errs) > 0 {
				t.Fatalf("send errors: %v", errs)
			}
			if got := up.count(); got != 1 {
				t.Errorf("got %d requests upstream, want 1", got)
			}
			if got := counts["200 forwarded"]; got != 1 {
				t.Errorf("got %d forwarded answers, want 1 (answers %v)", got, counts)
			}
			others := counts["409 in-flight"] + counts["200 duplicate"]
			if others != n-1 {
				t.Errorf("got %d in-flight or duplicate answers, want %d (answers %v)", others, n-1, counts)
			}
			if mode == Wait && counts["409 in-flight"] != 0 {
				t.Errorf("wait mode: got %d in-flight answers, want 0 (answers %v)", counts["409 in-flight"], counts)
			}
		})
	}
}

// wantProblemOf fails t unless resp is an application/problem+json answer
// of p's type.
func wantProblemOf(t *testing.T, resp response, p problem) {
	t.Helper()
	var got struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("got Content-Type %q, want application/problem+json", ct)
	}
	if err := json.Unmarshal(resp.Body, &got); err != nil || got.Type != p.Type || got.Status != p.Status {
		t.Errorf("got problem %s (%v), want type %s, status %d", resp.Body, err, p.Type, p.Status)
	}
}

// TestInFlightReject: a duplicate arriving while the first is forwarded gets
// 409 with Retry-After until the first should be settled: within
// upstream_timeout (30s) and the store timeout (5s) of the claim, well
// before its lease ends, also when the lease was granted on a clock ahead of
// the gateway's (another replica's on Redis): the claim was made no later
// than now, so not 10m35s.
func TestInFlightReject(t *testing.T) {
	tests := []struct {
		name  string
		lease time.Duration
		ahead time.Duration // the store's clock less the gateway's
	}{
		{"a 90s lease", 90 * time.Second, 0},
		{"the holder's clock 10 minutes ahead", 0, 10 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			arrived := make(chan struct{}, 1)
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
				arrived <- struct{}{}
				<-release
			})
			r := genericRoute("orders", "/hooks/orders", up.URL)
			r.Lease = tt.lease
			store := memstore.New(memstore.Options{Now: func() time.Time { return time.Now().Add(tt.ahead) }, SweepInterval: -1})
			t.Cleanup(func() { _ = store.Close() })
			h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{store: store})
			first := make(chan response, 1)
			go func() {
				resp, _ := h.try(context.Background(), http.MethodPost, "/hooks/orders", `{"id":"evt_1"}`)
				first <- resp
			}()
			recv(t, arrived, "the first delivery at the upstream")
			resp := h.send("/hooks/orders", `{"id":"evt_1"}`)
			close(release)
			if resp.Status != http.StatusConflict || resp.Header.Get(HeaderDedupStatus) != "in-flight" {
				t.Errorf("got %d %q, want 409 in-flight", resp.Status, resp.Header.Get(HeaderDedupStatus))
			}
			wantProblemOf(t, resp, probInFlight)
			if got := counterValue(t, h.gw.metrics.deliveries, "orders", outcomeInFlight); got != 1 {
				t.Errorf("got %v in_flight deliveries, want 1", got)
			}
			ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || ra < 30 || ra > 35 {
				t.Errorf("got Retry-After %q, want about 35 seconds", resp.Header.Get("Retry-After"))
			}
			if got := (<-first).Status; got != http.StatusOK {
				t.Errorf("first delivery: got %d, want 200", got)
			}
		})
	}
}

// TestInFlightWait covers on_in_flight: wait: the first succeeds → duplicate;
// the first fails → the waiter is forwarded; unresolved by the deadline → 409.
func TestInFlightWait(t *testing.T) {
	tests := []struct {
		name        string
		firstStatus int // upstream status for the first delivery; 0: never resolves
		wantStatus  int
		wantDedup   string
		wantUp      int
	}{
		{"first succeeded: answered as duplicate", 200, 200, "duplicate", 1},
		{"first failed: waiter claims and is forwarded", 503, 200, "forwarded", 2},
		{"unresolved at the deadline: 409", 0, 409, "in-flight", 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			arrived := make(chan struct{}, 1)
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n > 0 {
					return // 200
				}
				arrived <- struct{}{}
				select {
				case <-release:
				case <-r.Context().Done():
				}
				if tc.firstStatus != 0 {
					w.WriteHeader(tc.firstStatus)
				}
			})
			r := genericRoute("orders", "/hooks/orders", up.URL)
			r.OnInFlight = Wait
			// The gateway's clock is the test's; the store keeps real time,
			// so the lease stays held while the gateway's wait deadline passes.
			clock := newManualClock(time.Now())
			h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{now: clock.Now})

			first := make(chan response, 1)
			go func() {
				resp, _ := h.try(context.Background(), http.MethodPost, "/hooks/orders", `{"id":"evt_1"}`)
				first <- resp
			}()
			recv(t, arrived, "the first delivery at the upstream")
			second := make(chan response, 1)
			go func() {
				resp, _ := h.try(context.Background(), http.MethodPost, "/hooks/orders", `{"id":"evt_1"}`)
				second <- resp
			}()
			// The waiter is parked once it has read the store at least once.
			waitFor(t, "the waiter to poll", func() bool {
				return testutilCount(h, "get") > 0
			})
			if tc.firstStatus == 0 {
				clock.Advance(2 * r.effectiveLease())
			} else {
				close(release)
			}
			got := recv(t, second, "the waiter's answer")
			if tc.firstStatus == 0 {
				close(release)
			}
			recv(t, first, "the first delivery's answer")
			if got.Status != tc.wantStatus || got.Header.Get(HeaderDedupStatus) != tc.wantDedup {
				t.Errorf("waiter: got %d %q, want %d %q", got.Status, got.Header.Get(HeaderDedupStatus), tc.wantStatus, tc.wantDedup)
			}
			if tc.wantStatus == 409 {
				if got.Header.Get("Retry-After") == "" {
					t.Errorf("waiter: Retry-After missing on 409")
				}
				wantProblemOf(t, got, probInFlight)
			}
			// The waiter's answer is counted under its own outcome (forwarded:
			// the first delivery was too).
			outcome := map[string]string{"duplicate": outcomeDuplicate, "forwarded": outcomeForwarded, "in-flight": outcomeInFlight}[tc.wantDedup]
			want := 1
			if outcome == outcomeForwarded {
				want = 2
			}
			if got := counterValue(t, h.gw.metrics.deliveries, "orders", outcome); got != float64(want) {
				t.Errorf("got %v %s deliveries, want %d", got, outcome, want)
			}
			if n := up.count(); n != tc.wantUp {
				t.Errorf("got %d requests upstream, want %d", n, tc.wantUp)
			}
		})
	}
}

// TestUpstreamFailures: timeout → 504 and unreachable → 502 release the key
// (failed, with the reason), and the provider's retry is forwarded.
func TestUpstreamFailures(t *testing.T) {
	t.Run("timeout then retry", func(t *testing.T) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 0 {
				<-r.Context().Done() // hold until the gateway gives up
				return
			}
		})
		r := genericRoute("orders", "/hooks/orders", up.URL)
		r.UpstreamTimeout = 50 * time.Millisecond
		r.Lease = time.Minute
		h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
		resp := h.send("/hooks/orders", `{"id":"evt_1"}`)
		if resp.Status != http.StatusGatewayTimeout || resp.Header.Get(HeaderDedupStatus) != "forwarded" {
			t.Errorf("got %d %q, want 504 forwarded", resp.Status, resp.Header.Get(HeaderDedupStatus))
		}
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("got Content-Type %q, want problem+json", resp.Header.Get("Content-Type"))
		}
		rec, err := h.record("orders", "evt_1")
		if err != nil || rec.State != dedup.StateFailed || rec.LastError != "timeout" {
			t.Errorf("record = %+v, %v; want failed with last_error timeout", rec, err)
		}
		resp = h.send("/hooks/orders", `{"id":"evt_1"}`)
		if resp.Status != http.StatusOK || resp.Header.Get(HeaderDedupStatus) != "forwarded" {
			t.Errorf("retry: got %d %q, want 200 forwarded", resp.Status, resp.Header.Get(HeaderDedupStatus))
		}
		if got := counterValue(t, h.gw.metrics.releases, "orders", reasonTimeout); got != 1 {
			t.Errorf("got %v timeout releases, want 1", got)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", closedPortURL(t))}}, harnessOpts{})
		resp := h.send("/hooks/orders", `{"id":"evt_1"}`)
		if resp.Status != http.StatusBadGateway || resp.Header.Get(HeaderDedupStatus) != "forwarded" {
			t.Errorf("got %d %q, want 502 forwarded", resp.Status, resp.Header.Get(HeaderDedupStatus))
		}
		wantProblemOf(t, resp, probBadGateway)
		rec, err := h.record("orders", "evt_1")
		if err != nil || rec.State != dedup.StateFailed || rec.LastError != "connection refused" {
			t.Errorf("record = %+v, %v; want failed with last_error connection refused", rec, err)
		}
		if got := counterValue(t, h.gw.metrics.releases, "orders", reasonUpstreamError); got != 1 {
			t.Errorf("got %v upstream_error releases, want 1", got)
		}
	})
}

// TestMaybeProcessed: a failed record is marked maybe_processed when the
// forward ended without an answer after the application may have received
// it, not when the application answered or could not be reached; the mark
// lasts through the key's later failures and a 2xx clears it.
func TestMaybeProcessed(t *testing.T) {
	hold := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() } // until the gateway gives up
	cut := func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // read the delivery, then hang up without an answer
		}
	}
	reset := func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.(*net.TCPConn).SetLinger(0) // close with a RST: the gateway reads ECONNRESET
			conn.Close()
		}
	}
	answer := func(status int) func(http.ResponseWriter, *http.Request) {
		return func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }
	}
	tests := []struct {
		name     string
		attempts []func(http.ResponseWriter, *http.Request) // one per delivery of the same event
		refused  bool                                       // the upstream's port is closed
		tls      bool                                       // the upstream's certificate is not trusted
		want     dedup.State
		wantMark bool
	}{
		{name: "timeout", attempts: []func(http.ResponseWriter, *http.Request){hold}, want: dedup.StateFailed, wantMark: true},
		{name: "connection cut mid-exchange", attempts: []func(http.ResponseWriter, *http.Request){cut}, want: dedup.StateFailed, wantMark: true},
		{name: "connection reset mid-exchange", attempts: []func(http.ResponseWriter, *http.Request){reset}, want: dedup.StateFailed, wantMark: true},
		{name: "application answered 500", attempts: []func(http.ResponseWriter, *http.Request){answer(500)}, want: dedup.StateFailed},
		{name: "connection refused", refused: true, want: dedup.StateFailed},
		{name: "certificate refused", attempts: []func(http.ResponseWriter, *http.Request){answer(200)}, tls: true, want: dedup.StateFailed},
		{name: "timeout, then 500", attempts: []func(http.ResponseWriter, *http.Request){hold, answer(500)}, want: dedup.StateFailed, wantMark: true},
		{name: "timeout, then 500, then 200", attempts: []func(http.ResponseWriter, *http.Request){hold, answer(500), answer(200)}, want: dedup.StateProcessed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target, sends := closedPortURL(t), 1
			switch {
			case tt.tls:
				up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					t.Errorf("the upstream got %s %s through a TLS handshake the gateway must refuse", r.Method, r.URL)
				}))
				t.Cleanup(up.Close)
				target = up.URL
			case !tt.refused:
				up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { tt.attempts[n](w, r) })
				target, sends = up.URL, len(tt.attempts)
			}
			r := genericRoute("orders", "/hooks/orders", target)
			r.UpstreamTimeout = 50 * time.Millisecond
			if tt.tls {
				r.UpstreamTimeout = 10 * time.Second // the handshake must fail, not time out
			}
			r.Lease = time.Minute
			h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
			for i := range sends {
				if resp := h.send("/hooks/orders", `{"id":"evt_1"}`); resp.Header.Get(HeaderDedupStatus) != "forwarded" {
					t.Fatalf("delivery %d: got %d %q, want forwarded", i+1, resp.Status, resp.Header.Get(HeaderDedupStatus))
				}
			}
			// The log line of a forward without an answer says it too.
			for _, l := range h.logs.FilterMessage("upstream failed").All() {
				if got := l.ContextMap()["maybe_processed"]; sends == 1 && got != tt.wantMark {
					t.Errorf("\"upstream failed\" line: got maybe_processed %v, want %v", got, tt.wantMark)
				}
			}
			rec, err := h.record("orders", "evt_1")
			if err != nil || rec.State != tt.want || rec.MaybeProcessed != tt.wantMark {
				t.Errorf("record: got %s maybe_processed %v (last status %d, last error %q), %v; want %s maybe_processed %v",
					rec.State, rec.MaybeProcessed, rec.LastStatus, rec.LastError, err, tt.want, tt.wantMark)
			}
		})
	}
}

// TestMaybeProcessedLastsThroughARefusedRetry: a key cut at
// upstream_timeout stays marked when its retry cannot reach the
// application at all (connection refused): the refused attempt proves
// nothing about the first, which may still have been processed.
func TestMaybeProcessedLastsThroughARefusedRetry(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) { <-r.Context().Done() })
	r := genericRoute("orders", "/hooks/orders", up.URL)
	r.UpstreamTimeout = 50 * time.Millisecond
	r.Lease = time.Minute
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
	if resp := h.send("/hooks/orders", `{"id":"evt_1"}`); resp.Status != http.StatusGatewayTimeout {
		t.Fatalf("first delivery: got %d, want 504", resp.Status)
	}
	up.Close() // the application goes away: the retry is refused
	if resp := h.send("/hooks/orders", `{"id":"evt_1"}`); resp.Status != http.StatusBadGateway {
		t.Fatalf("retry: got %d, want 502", resp.Status)
	}
	rec, err := h.record("orders", "evt_1")
	if err != nil || rec.State != dedup.StateFailed || rec.Attempts != 2 || rec.LastError != "connection refused" || !rec.MaybeProcessed {
		t.Errorf("record = %+v, %v; want failed after 2 attempts, last_error connection refused, maybe processed", rec, err)
	}
}

// panicTransport aborts every forward the way a panic inside the
// ReverseProxy would: neither ModifyResponse nor ErrorHandler runs.
type panicTransport struct{}

func (panicTransport) RoundTrip(*http.Request) (*http.Response, error) { panic(http.ErrAbortHandler) }

// TestUnsettledForwardIsReleasedMaybeProcessed: the guard in forward that
// releases a claim neither ModifyResponse nor ErrorHandler settled marks
// the key maybe_processed, as nothing says the request was not sent.
func TestUnsettledForwardIsReleasedMaybeProcessed(t *testing.T) {
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", "http://127.0.0.1:1")}}, harnessOpts{transport: panicTransport{}})
	if _, err := h.try(context.Background(), http.MethodPost, "/hooks/orders", `{"id":"evt_1"}`); err == nil {
		t.Fatal("aborted forward: got an answer, want the connection closed")
	}
	rec, err := h.record("orders", "evt_1")
	if err != nil || rec.State != dedup.StateFailed || rec.LastError != "no answer" || !rec.MaybeProcessed {
		t.Errorf("record = %+v, %v; want failed with last_error no answer, maybe processed", rec, err)
	}
}

// TestSenderHangsUpMidForward: the sender goes away while the upstream works;
// the forward is not cancelled and the 2xx is committed, so the provider's
// retry is answered as a duplicate.
func TestSenderHangsUpMidForward(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	upstreamCancelled := make(chan struct{}, 1)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		arrived <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			upstreamCancelled <- struct{}{}
		}
	})
	senderGone := make(chan struct{})
	var once sync.Once
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{
		wrap: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				context.AfterFunc(r.Context(), func() { once.Do(func() { close(senderGone) }) })
				next.ServeHTTP(w, r)
			})
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := h.try(ctx, http.MethodPost, "/hooks/orders", `{"id":"evt_1"}`)
		errc <- err
	}()
	recv(t, arrived, "the delivery at the upstream")
	cancel()
	if err := <-errc; err == nil {
		t.Fatalf("sender: got no error after cancelling, want one")
	}
	select {
	case <-senderGone:
	case <-time.After(5 * time.Second):
		t.Fatalf("the gateway never noticed the sender hanging up")
	}
	close(release)
	waitFor(t, "the commit", func() bool {
		rec, err := h.record("orders", "evt_1")
		return err == nil && rec.State == dedup.StateProcessed
	})
	select {
	case <-upstreamCancelled:
		t.Errorf("the upstream request was cancelled when the sender hung up; want it to run to completion")
	default:
	}
	resp := h.send("/hooks/orders", `{"id":"evt_1"}`)
	if resp.Status != http.StatusOK || resp.Header.Get(HeaderDedupStatus) != "duplicate" {
		t.Errorf("retry: got %d %q, want 200 duplicate", resp.Status, resp.Header.Get(HeaderDedupStatus))
	}
}

// TestCommitBeforeAnswer: when the sender sees the upstream's 2xx, the key is
// already processed (a retry that follows an answer sees the final state).
func TestCommitBeforeAnswer(t *testing.T) {
	var h *harness
	var states []dedup.State
	var mu sync.Mutex
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush() // headers leave the upstream now
	})
	h = newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})
	for i := range 20 {
		id := fmt.Sprintf("evt_%d", i)
		resp, err := h.srv.Client().Post(h.srv.URL+"/hooks/orders", "application/json", strings.NewReader(`{"id":"`+id+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		// Headers received: read the state before the body.
		rec, err := h.record("orders", id)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		mu.Lock()
		states = append(states, rec.State)
		mu.Unlock()
	}
	for i, s := range states {
		if s != dedup.StateProcessed {
			t.Errorf("delivery %d: got state %q when the answer arrived, want processed", i, s)
		}
	}
}

// TestDuplicateBody checks the ack's JSON fields.
func TestDuplicateBody(t *testing.T) {
	up := newUpstream(t, nil)
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})
	h.send("/hooks/orders", `{"id":"evt_1"}`)
	resp := h.send("/hooks/orders", `{"id":"evt_1"}`)
	var got duplicateBody
	if err := json.Unmarshal(resp.Body, &got); err != nil {
		t.Fatalf("duplicate body %s: %v", resp.Body, err)
	}
	rec, _ := h.record("orders", "evt_1")
	if got.Status != "duplicate" || got.Route != "orders" || got.Key != "evt_1" || !got.FirstSeen.Equal(rec.FirstSeen) {
		t.Errorf("got %+v, want duplicate orders evt_1 first seen %s", got, rec.FirstSeen)
	}
}

// TestCloseReleasesInFlight: Close cancels a forward still running, releases
// its claim with reason shutdown, and answers 503; later deliveries get 503.
func TestCloseReleasesInFlight(t *testing.T) {
	arrived := make(chan struct{}, 1)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		arrived <- struct{}{}
		<-r.Context().Done()
	})
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})
	first := make(chan response, 1)
	go func() {
		resp, _ := h.try(context.Background(), http.MethodPost, "/hooks/orders", `{"id":"evt_1"}`)
		first <- resp
	}()
	recv(t, arrived, "the delivery at the upstream")
	if err := h.gw.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	resp := <-first
	if resp.Status != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("cancelled forward: got %d (Retry-After %q), want 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
	}
	rec, err := h.record("orders", "evt_1")
	if err != nil || rec.State != dedup.StateFailed || rec.LastError != "shutdown" || !rec.MaybeProcessed {
		t.Errorf("record = %+v, %v; want failed with last_error shutdown, maybe processed", rec, err)
	}
	if got := counterValue(t, h.gw.metrics.releases, "orders", reasonShutdown); got != 1 {
		t.Errorf("got %v shutdown releases, want 1", got)
	}
	if resp := h.send("/hooks/orders", `{"id":"evt_2"}`); resp.Status != http.StatusServiceUnavailable {
		t.Errorf("after Close: got %d, want 503", resp.Status)
	}
}

// manualClock is a settable clock for the gateway's deadlines.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func newManualClock(t time.Time) *manualClock { return &manualClock{now: t} }

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (r Route) effectiveLease() time.Duration {
	if r.Lease == 0 {
		return defaultLease
	}
	return r.Lease
}

// TestCloseWakesWaiters: Close answers a delivery held by on_in_flight: wait
// with 409 instead of leaving it until the lease ends.
func TestCloseWakesWaiters(t *testing.T) {
	arrived := make(chan struct{}, 1)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		arrived <- struct{}{}
		<-r.Context().Done()
	})
	h := waitHarness(t, up)
	first := h.sendAsync("/hooks/orders", `{"id":"evt_1"}`)
	recv(t, arrived, "the first delivery at the upstream")
	second := h.sendAsync("/hooks/orders", `{"id":"evt_1"}`)
	waitFor(t, "the waiter to poll", func() bool { return testutilCount(h, "get") > 0 })
	if err := h.gw.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := <-second; got.Status != http.StatusConflict || got.Header.Get(HeaderDedupStatus) != "in-flight" {
		t.Errorf("waiter: got %d %q, want 409 in-flight", got.Status, got.Header.Get(HeaderDedupStatus))
	}
	if got := (<-first).Status; got != http.StatusServiceUnavailable {
		t.Errorf("first: got %d, want 503", got)
	}
}

// TestWaitersAreBounded: beyond maxWaiting held deliveries (each holds its
// body), on_in_flight: wait answers 409 at once, as reject does.
func TestWaitersAreBounded(t *testing.T) {
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 0 {
			arrived <- struct{}{}
			<-release
		}
	})
	h := waitHarness(t, up)
	h.gw.maxWaiting = 2
	answers := []<-chan response{h.sendAsync("/hooks/orders", `{"id":"evt_1"}`)}
	recv(t, arrived, "the first delivery at the upstream")
	answers = append(answers, h.sendAsync("/hooks/orders", `{"id":"evt_1"}`), h.sendAsync("/hooks/orders", `{"id":"evt_1"}`))
	waitFor(t, "two waiters", func() bool { return h.gw.waiting.Load() == 2 })
	if got := h.send("/hooks/orders", `{"id":"evt_1"}`); got.Status != http.StatusConflict || got.Header.Get(HeaderDedupStatus) != "in-flight" {
		t.Errorf("third copy: got %d %q, want 409 in-flight at once", got.Status, got.Header.Get(HeaderDedupStatus))
	}
	close(release)
	statuses := map[string]int{}
	for _, a := range answers {
		statuses[(<-a).Header.Get(HeaderDedupStatus)]++
	}
	if statuses["forwarded"] != 1 || statuses["duplicate"] != 2 {
		t.Errorf("the first and its two waiters: got %v, want 1 forwarded and 2 duplicate", statuses)
	}
	if n := h.gw.waiting.Load(); n != 0 {
		t.Errorf("waiting after all answered: got %d, want 0", n)
	}
}

// TestForwardedWaiterFreesItsSlot: a held copy that claims the key after the
// first attempt failed is forwarded, and stops counting against maxWaiting
// while the upstream works on it.
func TestForwardedWaiterFreesItsSlot(t *testing.T) {
	arrived := make(chan int, 2)
	release := [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		arrived <- n
		<-release[n]
		if n == 0 {
			w.WriteHeader(http.StatusInternalServerError)
		}
	})
	h := waitHarness(t, up)
	first := h.sendAsync("/hooks/orders", `{"id":"evt_1"}`)
	recv(t, arrived, "the first delivery at the upstream")
	held := h.sendAsync("/hooks/orders", `{"id":"evt_1"}`)
	waitFor(t, "the copy to be held", func() bool { return h.gw.waiting.Load() == 1 })
	close(release[0]) // the first attempt fails: the held copy claims the key
	if n := <-arrived; n != 1 {
		t.Fatalf("got upstream request %d, want the held copy (1)", n)
	}
	if got := h.gw.waiting.Load(); got != 0 {
		t.Errorf("waiting while the former waiter is forwarded: got %d, want 0", got)
	}
	close(release[1])
	recv(t, first, "the first delivery's answer")
	recv(t, held, "the held copy's answer")
}

// TestFailedRetention: a failed key's record is kept for failed_retention,
// a processed one for the window.
func TestFailedRetention(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Idempotency-Key") == "bad" {
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	r := genericRoute("orders", "/hooks/orders", up.URL)
	r.Window, r.FailedRetention = 24*time.Hour, time.Hour
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
	h.send("/hooks/orders", `{}`, "Idempotency-Key: bad")
	h.send("/hooks/orders", `{}`, "Idempotency-Key: good")
	for _, tt := range []struct {
		key   string
		state dedup.State
		keep  time.Duration
	}{{"bad", dedup.StateFailed, time.Hour}, {"good", dedup.StateProcessed, 24 * time.Hour}} {
		rec, err := h.record("orders", tt.key)
		if err != nil || rec.State != tt.state {
			t.Fatalf("%s: got %+v, %v; want %s", tt.key, rec, err, tt.state)
		}
		if got := rec.ExpiresAt.Sub(rec.CompletedAt); got != tt.keep {
			t.Errorf("%s: got kept for %v, want %v", tt.key, got, tt.keep)
		}
	}
}

// TestNamespacesIsolateRoutes: the same key on two routes is two events
// unless the routes share a namespace.
func TestNamespacesIsolateRoutes(t *testing.T) {
	tests := []struct {
		name       string
		nsA, nsB   string
		wantSecond string
	}{
		{"default namespaces (route names)", "", "", "forwarded"},
		{"shared namespace", "shop", "shop", "duplicate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, nil)
			a := genericRoute("a", "/a", up.URL)
			a.Namespace = tc.nsA
			b := genericRoute("b", "/b", up.URL)
			b.Namespace = tc.nsB
			h := newHarness(t, Config{Routes: []Route{a, b}}, harnessOpts{})
			if got := h.send("/a", `{"id":"evt_1"}`).Header.Get(HeaderDedupStatus); got != "forwarded" {
				t.Errorf("route a: got %q, want forwarded", got)
			}
			if got := h.send("/b", `{"id":"evt_1"}`).Header.Get(HeaderDedupStatus); got != tc.wantSecond {
				t.Errorf("route b: got %q, want %q", got, tc.wantSecond)
			}
		})
	}
}

// TestReplayLimits: a 2xx body over max_replay_bytes is not stored (its
// duplicates are acked and counted); only replay_headers are replayed.
func TestReplayLimits(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Secret-Cookie", "no")
		w.Header().Set("X-Request-Id", "r1")
		if strings.Contains(r.Header.Get("Idempotency-Key"), "big") {
			fmt.Fprint(w, strings.Repeat("x", 100))
			return
		}
		fmt.Fprint(w, `{"ok":1}`)
	})
	r := genericRoute("api", "/api", up.URL)
	r.DuplicateResponse = Replay
	r.MaxReplayBytes = 50
	r.ReplayHeaders = []string{"content-type", "X-Request-Id"}
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})

	first := h.send("/api", "", "Idempotency-Key: big")
	dup := h.send("/api", "", "Idempotency-Key: big")
	if len(first.Body) != 100 {
		t.Errorf("first big answer: got %d bytes, want 100 (the whole body despite the capture)", len(first.Body))
	}
	if !hasBody(dup.Body, `"status":"duplicate"`) {
		t.Errorf("duplicate of a too-large response: got %s, want the JSON ack", dup.Body)
	}
	if got := counterValue(t, h.gw.metrics.replayTooLarge, "api"); got != 1 {
		t.Errorf("replay_too_large_total: got %v, want 1", got)
	}

	h.send("/api", "", "Idempotency-Key: small")
	dup = h.send("/api", "", "Idempotency-Key: small")
	checks := []struct{ name, got, want string }{
		{"body", string(dup.Body), `{"ok":1}`},
		{"Content-Type", dup.Header.Get("Content-Type"), "application/json"},
		{"X-Request-Id", dup.Header.Get("X-Request-Id"), "r1"},
		{"X-Secret-Cookie", dup.Header.Get("X-Secret-Cookie"), ""},
		{"Dedup-Status", dup.Header.Get(HeaderDedupStatus), "duplicate"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("replayed %s: got %q, want %q", c.name, c.got, c.want)
		}
	}
}

// TestReplayKeepsContentEncoding: a compressed upstream answer is replayed
// with its Content-Encoding, whatever replay_headers lists; otherwise a
// duplicate would get gzip bytes labelled as plain JSON. A retry that does
// not accept gzip gets it decompressed.
func TestReplayKeepsContentEncoding(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			fmt.Fprint(w, `{"id":"pay_1"}`)
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		fmt.Fprint(zw, `{"id":"pay_1"}`)
		_ = zw.Close()
	})
	r := genericRoute("api", "/api", up.URL)
	r.DuplicateResponse = Replay
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})

	first := h.send("/api", "", "Idempotency-Key: k1", "Accept-Encoding: gzip")
	dup := h.send("/api", "", "Idempotency-Key: k1", "Accept-Encoding: gzip")
	if got := dup.Header.Get("Content-Encoding"); got != "gzip" {
		t.Fatalf("replayed Content-Encoding: got %q, want gzip (the stored body is gzip)", got)
	}
	if !bytes.Equal(dup.Body, first.Body) {
		t.Errorf("replayed body: got %d bytes, want the first answer's %d bytes", len(dup.Body), len(first.Body))
	}
	zr, err := gzip.NewReader(bytes.NewReader(dup.Body))
	if err != nil {
		t.Fatalf("replayed body is not gzip: %v", err)
	}
	plain, _ := io.ReadAll(zr)
	if string(plain) != `{"id":"pay_1"}` {
		t.Errorf("replayed body decompressed: got %q, want %q", plain, `{"id":"pay_1"}`)
	}

	// A retry that does not accept gzip (curl without --compressed) gets
	// the same answer decompressed, not bytes it cannot read.
	for _, accept := range []string{"Accept-Encoding: identity", "Accept-Encoding: gzip;q=0, deflate"} {
		dup := h.send("/api", "", "Idempotency-Key: k1", accept)
		if got := dup.Header.Get("Content-Encoding"); got != "" {
			t.Errorf("%s: replayed Content-Encoding: got %q, want none", accept, got)
		}
		if string(dup.Body) != `{"id":"pay_1"}` || dup.Header.Get("Content-Length") != "14" {
			t.Errorf("%s: replayed body: got %q (Content-Length %s), want %q (14)", accept, dup.Body, dup.Header.Get("Content-Length"), `{"id":"pay_1"}`)
		}
		if got := dup.Header.Get(HeaderDedupStatus); dup.Status != http.StatusOK || got != "duplicate" || dup.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: got %d, Dedup-Status %q, Content-Type %q; want 200, duplicate, application/json", accept, dup.Status, got, dup.Header.Get("Content-Type"))
		}
	}
}

// TestBodyLimit: max_body_bytes holds for a body of declared length and for
// a chunked one, at the limit and one byte beyond it.
func TestBodyLimit(t *testing.T) {
	up := newUpstream(t, nil)
	r := genericRoute("orders", "/hooks/orders", up.URL)
	r.MaxBodyBytes = 32
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
	body := func(n int) string { // {"id":"evt_<n>","p":"xxx…"}, n bytes long
		s := fmt.Sprintf(`{"id":"evt_%d","p":""}`, n)
		return s[:len(s)-2] + strings.Repeat("x", n-len(s)) + `"}`
	}
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
		want    int
	}{
		{"declared length at the limit", 32, false, http.StatusOK},
		{"declared length over the limit", 33, false, http.StatusRequestEntityTooLarge},
		{"chunked at the limit", 31, true, http.StatusOK},
		{"chunked over the limit", 33, true, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := body(tc.size)
			if len(b) != tc.size {
				t.Fatalf("test body is %d bytes, want %d", len(b), tc.size)
			}
			var rd io.Reader = strings.NewReader(b)
			if tc.chunked {
				rd = io.MultiReader(rd) // unknown length: sent chunked
			}
			req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/hooks/orders", rd)
			if err != nil {
				t.Fatal(err)
			}
			if got := req.ContentLength == 0; got != tc.chunked {
				t.Fatalf("request content length %d, chunked %v", req.ContentLength, tc.chunked)
			}
			resp, err := h.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("got %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
	if got := up.count(); got != 2 {
		t.Errorf("got %d requests upstream, want 2", got)
	}
	for i := range 2 {
		if got := len(up.request(i).Body); got != []int{32, 31}[i] {
			t.Errorf("upstream request %d: got a %d-byte body, want %d", i, got, []int{32, 31}[i])
		}
	}
}

// TestReadExactly: a body with a declared length is read whole and exactly,
// in one allocation up to bodyChunk, and its buffer grows with the bytes
// that arrive: a header announcing 1 MiB, followed by a few bytes, must not
// cost 1 MiB (held per connection until the body timeout).
func TestReadExactly(t *testing.T) {
	data := make([]byte, 3*bodyChunk+5)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		name    string
		sent, n int
		wantErr error
	}{
		{"small", 10, 10, nil},
		{"one chunk", bodyChunk, bodyChunk, nil},
		{"one byte more", bodyChunk + 1, bodyChunk + 1, nil},
		{"several chunks", len(data), len(data), nil},
		{"short in the first chunk", 10, 100, io.ErrUnexpectedEOF},
		{"short after the first chunk", 2*bodyChunk + 3, len(data), io.ErrUnexpectedEOF},
		{"nothing sent", 0, 100, io.EOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readExactly(iotest.HalfReader(bytes.NewReader(data[:tc.sent])), tc.n)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("got error %v, want %v", err, tc.wantErr)
			}
			if err == nil && !bytes.Equal(got, data[:tc.n]) {
				t.Errorf("got %d bytes, want the %d sent", len(got), tc.n)
			}
			if err == nil && cap(got) != tc.n {
				t.Errorf("got a buffer of capacity %d, want exactly %d (it lives as long as the forward)", cap(got), tc.n)
			}
		})
	}

	t.Run("memory follows the bytes, not the header", func(t *testing.T) {
		const announced = 1 << 20
		big := make([]byte, announced)
		for _, tc := range []struct {
			arrived, most int
		}{
			{10, 2 * bodyChunk},
			{announced/2 + 1, 2 * announced}, // the buffers so far: 64, 128, 256, 512 KiB and 1 MiB
			{announced, 2 * announced},
		} {
			least := uint64(math.MaxUint64)
			for range 5 { // the least of several reads: other goroutines allocate too
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				_, _ = readExactly(bytes.NewReader(big[:tc.arrived]), announced)
				runtime.ReadMemStats(&after)
				least = min(least, after.TotalAlloc-before.TotalAlloc)
			}
			if least > uint64(tc.most) {
				t.Errorf("a header announcing %d bytes, then %d bytes: got %d bytes allocated, want at most %d", announced, tc.arrived, least, tc.most)
			}
		}
	})

	t.Run("a small body is one allocation", func(t *testing.T) {
		small := string(data[:1024])
		body := strings.NewReader(small)
		allocs := testing.AllocsPerRun(100, func() {
			body.Reset(small)
			if _, err := readExactly(body, 1024); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 1 {
			t.Errorf("got %v allocations, want 1", allocs)
		}
	})
}

func TestClipForLog(t *testing.T) {
	long := strings.Repeat("a", maxLoggedKey)
	tests := []struct {
		name, in, want string
	}{
		{"plain", "evt_1", "evt_1"},
		{"UTF-8", "ünï", "ünï"},
		{"Latin-1", "\xfcn\xef", `\xFCn\xEF`},
		{"the text of an escape", `caf\xE9`, `caf\\xE9`},
		{"a backslash beside an invalid byte", "a\\\xe9", `a\\\xE9`},
		{"at the bound", long, long},
		{"over the bound", long + "b", long + "…"},
		{"a rune across the bound", long[1:] + "ü", long[1:] + "…"},
		{"an invalid byte over the bound", long + "\xff", long + "…"},
		{"an invalid byte at the bound", long[1:] + "\xff", long[1:] + `\xFF`},
	}
	for _, tt := range tests {
		if got := clipForLog(tt.in); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestDuplicateWithAnotherBody: a duplicate whose body is not the one the
// key's first delivery forwarded is still a duplicate (the key decides),
// but it is counted and its log line says so: a key that names an object,
// not an event, drops that object's later events this way. A copy with
// the same body is not flagged.
func TestDuplicateWithAnotherBody(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) {})
	mem := memstore.New(memstore.Options{SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	gw, srv, logs := observedGateway(t, mem, genericRoute("orders", "/hooks/orders", up.URL)) // keyed by json:id
	deliveries := []struct {
		body        string
		wantDedup   string
		wantDiffers bool
	}{
		{`{"id":"o-1","type":"order.created"}`, "forwarded", false},
		{`{"id":"o-1","type":"order.created"}`, "duplicate", false},
		{`{"id":"o-1","type":"order.refunded"}`, "duplicate", true},
	}
	for i, dl := range deliveries {
		resp := post(t, srv, "/hooks/orders", dl.body)
		if got := resp.Header.Get(HeaderDedupStatus); resp.Status != http.StatusOK || got != dl.wantDedup {
			t.Fatalf("delivery %d: got %d %q, want 200 %q", i+1, resp.Status, got, dl.wantDedup)
		}
		lines := logs.FilterMessage("delivery").All()
		differs, ok := lines[len(lines)-1].ContextMap()["body_differs"]
		if got := ok && differs == true; got != dl.wantDiffers {
			t.Errorf("delivery %d: got body_differs %v on its line, want %v", i+1, differs, dl.wantDiffers)
		}
	}
	if got := counterValue(t, gw.metrics.bodyDiffers, "orders"); got != 1 {
		t.Errorf("dedupgw_duplicate_body_differs_total{route=\"orders\"}: got %v, want 1", got)
	}
	if n := up.count(); n != 1 {
		t.Errorf("upstream: got %d deliveries, want 1", n)
	}
}

// bodyRoute is a generic route "payments" keyed by its body alone.
func bodyRoute(upstreamURL string) Route {
	r := genericRoute("payments", "/api/payments/*", upstreamURL)
	r.Provider.Keys = []string{"body"}
	return r
}

// TestBodyDiffersOnlyForAnotherRequest: body_differs means the key named
// another request than the first. A key that is the body's own hash (the
// body source, canonical JSON) names the payload itself: a copy with its
// keys in another order or other spacing is the same payload. On an API route that fingerprints its
// requests, the fingerprint says what the same request is: a retry whose
// excluded field (request_time) or key order changed is the same request,
// its body bytes aside (on_fingerprint_mismatch: reject answers 422 for
// any other). A record without a body hash (one an older gateway wrote)
// is not compared.
func TestBodyDiffersOnlyForAnotherRequest(t *testing.T) {
	up := newUpstream(t, createPayment)
	tests := []struct {
		name        string
		route       Route
		prior       func(t *testing.T, s dedup.Store) // written before the deliveries
		first, copy string                            // bodies, same Idempotency-Key
		wantDedup   string
		wantDiffers bool
	}{
		{"fingerprinted, an excluded field changed", paymentsRoute(up.URL), nil,
			`{"amount":100,"request_time":1}`, `{"amount":100,"request_time":2}`, "duplicate", false},
		{"fingerprinted, keys reordered", paymentsRoute(up.URL), nil,
			`{"amount":100,"currency":"eur"}`, `{"currency":"eur","amount":100}`, "duplicate", false},
		{"not fingerprinted, a field changed", genericRoute("payments", "/api/payments/*", up.URL), nil,
			`{"amount":100,"request_time":1}`, `{"amount":100,"request_time":2}`, "duplicate", true},
		{"keyed by the body, keys reordered", bodyRoute(up.URL), nil,
			`{"amount":100,"currency":"eur"}`, `{"currency":"eur", "amount":100}`, "duplicate", false},
		{"a record without a body hash", genericRoute("payments", "/api/payments/*", up.URL),
			func(t *testing.T, s dedup.Store) {
				k := dedup.Key{Namespace: "payments", ID: "k-1"}
				res, err := s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Commit(context.Background(), k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
					t.Fatal(err)
				}
			},
			"", `{"amount":100}`, "duplicate", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mem := memstore.New(memstore.Options{SweepInterval: -1})
			t.Cleanup(func() { mem.Close() })
			if tt.prior != nil {
				tt.prior(t, mem)
			}
			gw, srv, logs := observedGateway(t, mem, tt.route)
			if tt.first != "" {
				if resp := post(t, srv, "/api/payments/charge", tt.first, "Idempotency-Key: k-1"); resp.Header.Get(HeaderDedupStatus) != "forwarded" {
					t.Fatalf("first: got %d %q, want forwarded", resp.Status, resp.Header.Get(HeaderDedupStatus))
				}
			}
			resp := post(t, srv, "/api/payments/charge", tt.copy, "Idempotency-Key: k-1")
			if got := resp.Header.Get(HeaderDedupStatus); got != tt.wantDedup {
				t.Fatalf("copy: got %d %q, want %q", resp.Status, got, tt.wantDedup)
			}
			lines := logs.FilterMessage("delivery").All()
			_, got := lines[len(lines)-1].ContextMap()["body_differs"]
			if got != tt.wantDiffers {
				t.Errorf("copy's delivery line: got body_differs %v, want %v", got, tt.wantDiffers)
			}
			want := 0.0
			if tt.wantDiffers {
				want = 1
			}
			if got := counterValue(t, gw.metrics.bodyDiffers, "payments"); got != want {
				t.Errorf("dedupgw_duplicate_body_differs_total: got %v, want %v", got, want)
			}
		})
	}
}
