package proxy

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/boltstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
	"github.com/dedupgw/dedupgw/providers"
)

// paymentsRoute is an API idempotency route as config.example.yaml shows it:
// Idempotency-Key required, fingerprints checked, responses replayed.
func paymentsRoute(upstreamURL string) Route {
	return Route{
		Name:                  "payments",
		Path:                  "/api/payments/*",
		Upstream:              upstreamURL,
		Provider:              providers.Config{Provider: providers.Generic, Keys: []string{"header:Idempotency-Key"}},
		OnMissingKey:          Reject,
		OnFingerprintMismatch: Reject,
		FingerprintExclude:    []string{"request_time"},
		DuplicateResponse:     Replay,
	}
}

// createPayment answers like a payment API: 201, a JSON body and a Location
// naming the n-th payment. A request with "X-Test-Fail: 1" gets a 500.
func createPayment(w http.ResponseWriter, r *http.Request, n int) {
	if r.Header.Get("X-Test-Fail") != "" {
		http.Error(w, "declined", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/pay_%d", n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"pay_%d"}`, n)
}

// apiStep is one API request and what the client must get.
type apiStep struct {
	path        string // empty: /api/payments/charge
	body        string
	headers     []string
	wantStatus  int
	wantDedup   string
	wantCT      string            // Content-Type prefix, if set
	wantBody    string            // exact body, if set
	wantBodyHas string            // body substring, if set
	wantHeader  map[string]string // "" means absent
}

const (
	key1      = "Idempotency-Key: k1"
	asAlice   = "Authorization: Bearer alice-token"
	asBob     = "Authorization: Bearer bob-token"
	probJSON  = "application/problem+json"
	appJSON   = "application/json"
	payCharge = "/api/payments/charge"
)

// TestIdempotencyKeyMode walks issue 9 on a memory store: replay, 422 on a
// changed payload, excluded fields, 400 on missing or invalid keys, per-client
// key scopes.
func TestIdempotencyKeyMode(t *testing.T) {
	created := func(n int) string { return fmt.Sprintf(`{"id":"pay_%d"}`, n) }
	tests := []struct {
		name         string
		route        func(*Route)
		steps        []apiStep
		wantUpstream int
		wantOutcomes map[string]float64
	}{
		{
			name: "a retry gets the same status, body and Content-Type; other headers only when listed",
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "forwarded", wantCT: appJSON, wantBody: created(0)},
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "duplicate", wantCT: appJSON, wantBody: created(0),
					wantHeader: map[string]string{"Location": ""}},
			},
			wantUpstream: 1,
			wantOutcomes: map[string]float64{outcomeForwarded: 1, outcomeDuplicate: 1},
		},
		{
			name:  "replay_headers lists Location",
			route: func(r *Route) { r.ReplayHeaders = []string{"Content-Type", "Location"} },
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "forwarded"},
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "duplicate", wantBody: created(0),
					wantHeader: map[string]string{"Location": "/payments/pay_0", "Content-Type": appJSON}},
			},
			wantUpstream: 1,
		},
		{
			name: "a key quoted as the draft writes it is the same key unquoted",
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{`Idempotency-Key: "k1"`}, wantStatus: 201, wantDedup: "forwarded"},
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "duplicate", wantBody: created(0)},
			},
			wantUpstream: 1,
		},
		{
			name: "two different keys in one request get 400",
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1, "Idempotency-Key: k2"}, wantStatus: 400, wantDedup: "rejected", wantCT: probJSON,
					wantBodyHas: "the key header appears more than once, with different values"},
				{body: `{"amount":100}`, headers: []string{key1, `Idempotency-Key: "k1"`}, wantStatus: 201, wantDedup: "forwarded"}, // one key, quoted and bare
				{body: `{"amount":100}`, headers: []string{key1, key1}, wantStatus: 201, wantDedup: "duplicate"},
			},
			wantUpstream: 1,
			wantOutcomes: map[string]float64{outcomeRejectedKey: 1, outcomeForwarded: 1, outcomeDuplicate: 1},
		},
		{
			name: "a changed payload gets 422; the original still replays",
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "forwarded"},
				{body: `{"amount":200}`, headers: []string{key1}, wantStatus: 422, wantDedup: "rejected", wantCT: probJSON, wantBodyHas: "key reused with a different payload"},
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "duplicate", wantBody: created(0)},
			},
			wantUpstream: 1,
			wantOutcomes: map[string]float64{outcomeForwarded: 1, outcomeRejectedFingerprint: 1, outcomeDuplicate: 1},
		},
		{
			name: "excluded fields, key order and spacing do not change the fingerprint",
			steps: []apiStep{
				{body: `{"amount":100,"currency":"eur","request_time":"2026-11-30T10:00:00Z"}`, headers: []string{key1}, wantStatus: 201, wantDedup: "forwarded"},
				{body: "{ \"request_time\": \"2026-11-30T10:00:07Z\",\n  \"currency\": \"eur\", \"amount\": 100 }", headers: []string{key1}, wantStatus: 201, wantDedup: "duplicate", wantBody: created(0)},
				{body: `{"amount":100,"currency":"eur"}`, headers: []string{key1}, wantStatus: 201, wantDedup: "duplicate"},
			},
			wantUpstream: 1,
		},
		{
			name: "a nested field of an excluded name still counts",
			steps: []apiStep{
				{body: `{"amount":100,"meta":{"request_time":"a"}}`, headers: []string{key1}, wantStatus: 201, wantDedup: "forwarded"},
				{body: `{"amount":100,"meta":{"request_time":"b"}}`, headers: []string{key1}, wantStatus: 422, wantDedup: "rejected"},
			},
			wantUpstream: 1,
		},
		{
			name: "a non-JSON payload is fingerprinted byte for byte",
			steps: []apiStep{
				{body: `amount=100&currency=eur`, headers: []string{key1}, wantStatus: 201, wantDedup: "forwarded"},
				{body: `amount=100&currency=eur`, headers: []string{key1}, wantStatus: 201, wantDedup: "duplicate"},
				{body: `currency=eur&amount=100`, headers: []string{key1}, wantStatus: 422, wantDedup: "rejected"},
			},
			wantUpstream: 1,
		},
		{
			name: "the same key and payload on another endpoint gets 422",
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "forwarded"},
				{path: "/api/payments/refund", body: `{"amount":100}`, headers: []string{key1}, wantStatus: 422, wantDedup: "rejected"},
			},
			wantUpstream: 1,
		},
		{
			name:  "on_fingerprint_mismatch: ack answers a changed payload as a duplicate",
			route: func(r *Route) { r.OnFingerprintMismatch = Ack },
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "forwarded"},
				{body: `{"amount":200}`, headers: []string{key1}, wantStatus: 201, wantDedup: "duplicate", wantBody: created(0)},
			},
			wantUpstream: 1,
		},
		{
			name: "a failed key stays bound to its payload; the same payload is retried",
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1, "X-Test-Fail: 1"}, wantStatus: 500, wantDedup: "forwarded"},
				{body: `{"amount":200}`, headers: []string{key1}, wantStatus: 422, wantDedup: "rejected"},
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "forwarded", wantBody: created(1)},
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "duplicate", wantBody: created(1)},
			},
			wantUpstream: 2,
			wantOutcomes: map[string]float64{outcomeForwarded: 2, outcomeRejectedFingerprint: 1, outcomeDuplicate: 1},
		},
		{
			name: "a missing, oversized or non-printable key gets 400 naming the header",
			steps: []apiStep{
				{body: `{"amount":100}`, wantStatus: 400, wantDedup: "rejected", wantCT: probJSON, wantBodyHas: "header:Idempotency-Key"},
				{body: `{"amount":100}`, headers: []string{"Idempotency-Key: " + strings.Repeat("k", 256)}, wantStatus: 400, wantDedup: "rejected", wantCT: probJSON, wantBodyHas: "255 printable ASCII"},
				{body: `{"amount":100}`, headers: []string{"Idempotency-Key: caf\u00e9"}, wantStatus: 400, wantDedup: "rejected"},
				{body: `{"amount":100}`, headers: []string{"Idempotency-Key: tab\there"}, wantStatus: 400, wantDedup: "rejected"},
				{body: `{"amount":100}`, headers: []string{"Idempotency-Key: " + strings.Repeat("k", 255)}, wantStatus: 201, wantDedup: "forwarded"},
			},
			wantUpstream: 1,
			wantOutcomes: map[string]float64{outcomeRejectedKey: 4, outcomeForwarded: 1},
		},
		{
			name:  "client_identity: two clients using one key never collide",
			route: func(r *Route) { r.ClientIdentity = "Authorization" },
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1, asAlice}, wantStatus: 201, wantDedup: "forwarded", wantBody: created(0)},
				{body: `{"amount":999}`, headers: []string{key1, asBob}, wantStatus: 201, wantDedup: "forwarded", wantBody: created(1)},
				{body: `{"amount":100}`, headers: []string{key1, asAlice}, wantStatus: 201, wantDedup: "duplicate", wantBody: created(0)},
				{body: `{"amount":999}`, headers: []string{key1, asBob}, wantStatus: 201, wantDedup: "duplicate", wantBody: created(1)},
				{body: `{"amount":999}`, headers: []string{key1, asAlice}, wantStatus: 422, wantDedup: "rejected"},
			},
			wantUpstream: 2,
		},
		{
			name: "client_identity_secret: replayed per client, as without it",
			route: func(r *Route) {
				r.ClientIdentity, r.ClientIdentitySecret = "Authorization", "0123456789abcdef"
			},
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1, asAlice}, wantStatus: 201, wantDedup: "forwarded", wantBody: created(0)},
				{body: `{"amount":999}`, headers: []string{key1, asBob}, wantStatus: 201, wantDedup: "forwarded", wantBody: created(1)},
				{body: `{"amount":100}`, headers: []string{key1, asAlice}, wantStatus: 201, wantDedup: "duplicate", wantBody: created(0)},
				{body: `{"amount":999}`, headers: []string{key1, asAlice}, wantStatus: 422, wantDedup: "rejected"},
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 400, wantDedup: "rejected", wantBodyHas: "no Authorization header"},
			},
			wantUpstream: 2,
		},
		{
			name:  "client_identity: no identity header is a missing key",
			route: func(r *Route) { r.ClientIdentity = "Authorization" },
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 400, wantDedup: "rejected", wantCT: probJSON, wantBodyHas: "no Authorization header"},
				{body: `{"amount":100}`, headers: []string{key1, "Authorization:"}, wantStatus: 400, wantDedup: "rejected"},
			},
			wantOutcomes: map[string]float64{outcomeRejectedKey: 2},
		},
		{
			name: "client_identity on an on_missing_key: forward route: forwarded unkeyed",
			route: func(r *Route) {
				r.ClientIdentity = "Authorization"
				r.OnMissingKey = Forward
			},
			steps: []apiStep{
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "unkeyed"},
				{body: `{"amount":100}`, headers: []string{key1}, wantStatus: 201, wantDedup: "unkeyed"},
			},
			wantUpstream: 2,
			wantOutcomes: map[string]float64{outcomeUnkeyed: 2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, createPayment)
			r := paymentsRoute(up.URL)
			if tc.route != nil {
				tc.route(&r)
			}
			h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
			for i, s := range tc.steps {
				s.check(t, i, h.send(s.pathOr(payCharge), s.body, s.headers...))
			}
			if got := up.count(); got != tc.wantUpstream {
				t.Errorf("got %d requests upstream, want %d", got, tc.wantUpstream)
			}
			for outcome, want := range tc.wantOutcomes {
				if got := counterValue(t, h.gw.metrics.deliveries, "payments", outcome); got != want {
					t.Errorf("deliveries_total{outcome=%q}: got %v, want %v", outcome, got, want)
				}
			}
		})
	}
}

func (s apiStep) pathOr(def string) string {
	if s.path == "" {
		return def
	}
	return s.path
}

// check compares resp with what step i wants.
func (s apiStep) check(t *testing.T, i int, resp response) {
	t.Helper()
	if resp.Status != s.wantStatus {
		t.Errorf("step %d: got status %d, want %d (body %s)", i, resp.Status, s.wantStatus, resp.Body)
	}
	if got := resp.Header.Get(HeaderDedupStatus); got != s.wantDedup {
		t.Errorf("step %d: got Dedup-Status %q, want %q", i, got, s.wantDedup)
	}
	if s.wantCT != "" && !strings.HasPrefix(resp.Header.Get("Content-Type"), s.wantCT) {
		t.Errorf("step %d: got Content-Type %q, want %q", i, resp.Header.Get("Content-Type"), s.wantCT)
	}
	if s.wantBody != "" && string(resp.Body) != s.wantBody {
		t.Errorf("step %d: got body %s, want %s", i, resp.Body, s.wantBody)
	}
	if s.wantBodyHas != "" && !hasBody(resp.Body, s.wantBodyHas) {
		t.Errorf("step %d: got body %s, want it to contain %s", i, resp.Body, s.wantBodyHas)
	}
	for name, want := range s.wantHeader {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("step %d: got %s %q, want %q", i, name, got, want)
		}
	}
}

// scopedKey is the stored key of a client_identity route: the first 32 hex
// digits of the SHA-256 of the identity header's value, ":", the client's key.
func scopedKey(identity, key string) string {
	sum := sha256.Sum256([]byte(identity))
	return hex.EncodeToString(sum[:])[:32] + ":" + key
}

// scopedRoute builds the payments route scoping keys by Authorization, with
// secret as its client_identity_secret ("" for none).
func scopedRoute(tb testing.TB, secret string) *route {
	tb.Helper()
	r := paymentsRoute("http://127.0.0.1:3000")
	r.ClientIdentity, r.ClientIdentitySecret = "Authorization", secret
	rt, errs := buildRoute(0, r, providers.New, time.Now)
	if len(errs) > 0 {
		tb.Fatal(errs)
	}
	return rt
}

// TestClientScope: the scope is the start of the header value's SHA-256,
// or with client_identity_secret of its HMAC-SHA256 keyed with the secret.
// The wanted values come from outside Go:
//
//	printf '%s' 'Bearer alice-token' | sha256sum
//	printf '%s' 'Bearer alice-token' | openssl dgst -sha256 -hmac 0123456789abcdef
//
// Each route scopes its values twice, in turn, so a pooled HMAC that kept
// anything of the value before shows.
func TestClientScope(t *testing.T) {
	const (
		secret  = "0123456789abcdef"
		other   = "fedcba9876543210"
		oneByte = "0123456789abcdeg"
	)
	alice, bob := "Bearer alice-token", "Bearer bob-token"
	long := "Basic " + strings.Repeat("a", 300) // more than one 128-byte chunk
	tests := []struct {
		name, secret, value, want string
	}{
		{"no secret: SHA-256", "", alice, "d747bee75cd0ee92b8d91359dd7d5e52"},
		{"secret: HMAC-SHA256", secret, alice, "953c104bf982ad78a94dbd5cee2a3fd4"},
		{"secret, another client", secret, bob, "927d7b9189d138c8f9584d9621f4b949"},
		{"secret, a value longer than the buffer", secret, long, "8ad1bf10f96186f3fc0e5f36a6f8176e"},
		{"another secret", other, alice, "37254d3faf35c7a216f16b2f59c3224e"},
		{"a secret one byte off", oneByte, alice, "80992e9bf5d9c620c0ed0d026f3362ac"},
		{"a secret longer than SHA-256's block", strings.Repeat("k", 70), alice, "9ec15d94bdbb76e71521c2421a395eed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := scopedRoute(t, tt.secret)
			for i, v := range []string{tt.value, alice + "x", tt.value} {
				req := httptest.NewRequest(http.MethodPost, payCharge, nil)
				req.Header.Set("Authorization", v)
				scope, ok, ambiguous := rt.clientScope(req)
				if !ok || ambiguous {
					t.Fatalf("call %d: got ok %v, ambiguous %v; want a scope", i, ok, ambiguous)
				}
				if i != 1 && scope != tt.want {
					t.Errorf("call %d: got scope %q, want %q", i, scope, tt.want)
				}
			}
		})
	}
	// Two secrets, or none, scope one client apart.
	seen := map[string]string{}
	for _, tt := range tests {
		if tt.value != alice {
			continue
		}
		if prev, dup := seen[tt.want]; dup {
			t.Errorf("%q and %q: got one scope %s for alice, want each secret its own", prev, tt.name, tt.want)
		}
		seen[tt.want] = tt.name
	}
}

// TestClientScopeConcurrent: deliveries scope their clients at once, each
// from a pooled HMAC of its own: every scope equals the HMAC-SHA256 that
// crypto/hmac computes alone, so a state two deliveries shared (or one that
// kept a previous value) shows, and -race names it. A state back in the pool
// holds none of the value it hashed.
func TestClientScopeConcurrent(t *testing.T) {
	const secret = "0123456789abcdef"
	rt := scopedRoute(t, secret)
	want := func(v string) string {
		mac := hmac.New(sha256.New, []byte(secret))
		mac.Write([]byte(v))
		return hex.EncodeToString(mac.Sum(nil))[:clientScopeLen]
	}
	// Values of many lengths, some over the 128-byte chunk.
	value := func(g, i int) string { return fmt.Sprintf("Bearer %d-%d-%s", g, i, strings.Repeat("x", (g*31+i)%200)) }
	const goroutines, each = 8, 300
	var wg sync.WaitGroup
	errc := make(chan string, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				v := value(g, i)
				req := httptest.NewRequest(http.MethodPost, payCharge, nil)
				req.Header.Set("Authorization", v)
				if got, ok, _ := rt.clientScope(req); !ok || got != want(v) {
					errc <- fmt.Sprintf("scope of %q: got %q, want %q", v, got, want(v))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	for e := range errc {
		t.Error(e)
	}

	// The pool hands back, on this goroutine, the state it was just given
	// (or, when it dropped it, a new one): its buffer is cleared either way.
	for i := range 50 {
		v := "Basic " + strings.Repeat(strconv.Itoa(i%10), 100+i)
		rt.scopeMAC.scope(v)
		s := rt.scopeMAC.pool.Get().(*scopeState)
		if s.in != ([128]byte{}) {
			t.Fatalf("a pooled state after scoping %q: got %q in its buffer, want it cleared", v, s.in)
		}
		rt.scopeMAC.pool.Put(s)
	}
}

// TestClientScopedKeyAddressing: the upstream's Dedup-Key names the stored
// key, which the keys API finds; the ack names the client's own key. With
// client_identity_secret the stored key's scope is the HMAC one (openssl
// dgst -sha256 -hmac 0123456789abcdef, as in TestClientScope), the
// unkeyed scope finds nothing, and the secret is in no answer or log line.
func TestClientScopedKeyAddressing(t *testing.T) {
	const secret = "0123456789abcdef"
	tests := []struct {
		name, secret string
		stored       string // the stored key of alice's k1
		other        string // a scoped key of alice's k1 that must not be found
		hint         string // in the 404 for the client's own key
	}{
		{"no secret", "", scopedKey("Bearer alice-token", "k1"), scopedKey("Bearer bob-token", "k1"),
			"scopes keys per client (client_identity: Authorization): a stored key is the first 32 hex digits of the SHA-256 of the client's Authorization value, a colon, then the client's key"},
		{"client_identity_secret", secret, "953c104bf982ad78a94dbd5cee2a3fd4:k1", scopedKey("Bearer alice-token", "k1"),
			"scopes keys per client (client_identity: Authorization): a stored key is the first 32 hex digits of the HMAC-SHA256 of the client's Authorization value, keyed with the route's client_identity_secret, a colon, then the client's key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, createPayment)
			r := paymentsRoute(up.URL)
			r.ClientIdentity, r.ClientIdentitySecret = "Authorization", tc.secret
			r.DuplicateResponse = Ack
			h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
			h.send(payCharge, `{"amount":100}`, key1, asAlice)
			dup := h.send(payCharge, `{"amount":100}`, key1, asAlice)

			if got, want := up.request(0).Header.Get(HeaderDedupKey), "payments:"+tc.stored; got != want {
				t.Errorf("upstream Dedup-Key: got %q, want %q", got, want)
			}
			if dup.Header.Get(HeaderDedupStatus) != "duplicate" || !hasBody(dup.Body, `"key":"k1"`) {
				t.Errorf("duplicate ack: got %s %s, want a duplicate naming the client's key \"k1\"", dup.Header.Get(HeaderDedupStatus), dup.Body)
			}
			admin := httptest.NewServer(NewAdmin(h.gw, h.store, AdminOptions{}))
			defer admin.Close()
			resp, err := admin.Client().Get(admin.URL + "/v1/keys/payments/" + tc.stored)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("GET /v1/keys/payments/%s: got %d, want 200", tc.stored, resp.StatusCode)
			}
			// An identity header repeated with different values identifies no one:
			// which one the application reads is not the gateway's to guess.
			if resp := h.send(payCharge, `{"amount":100}`, key1, asAlice, asBob); resp.Status != http.StatusBadRequest || !hasBody(resp.Body, "the Authorization header appears more than once, with different values") {
				t.Errorf("two different identities: got %d %s, want 400 naming Authorization", resp.Status, resp.Body)
			}
			if resp := h.send(payCharge, `{"amount":100}`, key1, asAlice, asAlice); resp.Status != http.StatusOK || resp.Header.Get(HeaderDedupStatus) != "duplicate" {
				t.Errorf("one identity sent twice: got %d %s, want the duplicate ack", resp.Status, resp.Header.Get(HeaderDedupStatus))
			}
			// The client's own key is not the stored one: the 404 says how to
			// spell it; a scoped key that is absent gets the plain answer.
			for _, tt := range []struct{ key, want, not string }{
				{"k1", tc.hint, ""},
				{tc.other, "the store has no live record of this key", "scopes keys"},
			} {
				resp, err := admin.Client().Get(admin.URL + "/v1/keys/payments/" + tt.key)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), tt.want) || tt.not != "" && strings.Contains(string(body), tt.not) {
					t.Errorf("GET /v1/keys/payments/%s: got %d %s, want 404 saying %q", tt.key, resp.StatusCode, body, tt.want)
				}
				if tc.secret != "" && strings.Contains(string(body), tc.secret) {
					t.Errorf("GET /v1/keys/payments/%s: got %s, want the secret not shown", tt.key, body)
				}
			}
			rec, err := h.record("payments", tc.stored)
			if err != nil || rec.Fingerprint == "" {
				t.Errorf("stored record: got %+v, %v; want one with a fingerprint", rec, err)
			}
			if tc.secret != "" {
				for _, e := range h.logs.All() {
					if line := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(line, tc.secret) {
						t.Errorf("log line shows the client_identity_secret: %s", line)
					}
				}
			}
		})
	}
}

// TestIdempotencyInFlight: a retry while the first request runs gets 409 with
// Retry-After; a different payload under that key gets 422.
func TestIdempotencyInFlight(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		arrived <- struct{}{}
		<-release
		createPayment(w, r, n)
	})
	r := paymentsRoute(up.URL)
	r.Lease = 45 * time.Second
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
	first := make(chan response, 1)
	go func() {
		resp, _ := h.try(context.Background(), http.MethodPost, payCharge, `{"amount":100}`, key1)
		first <- resp
	}()
	recv(t, arrived, "the first request at the upstream")
	same := h.send(payCharge, `{"amount":100}`, key1)
	other := h.send(payCharge, `{"amount":200}`, key1)
	close(release)

	apiStep{wantStatus: 409, wantDedup: "in-flight", wantCT: probJSON}.check(t, 0, same)
	if ra, err := strconv.Atoi(same.Header.Get("Retry-After")); err != nil || ra < 1 || ra > 45 {
		t.Errorf("Retry-After: got %q, want 1..45 seconds", same.Header.Get("Retry-After"))
	}
	apiStep{wantStatus: 422, wantDedup: "rejected", wantCT: probJSON}.check(t, 1, other)
	apiStep{wantStatus: 201, wantDedup: "forwarded", wantBody: `{"id":"pay_0"}`}.check(t, 2, <-first)
	if got := up.count(); got != 1 {
		t.Errorf("got %d requests upstream, want 1", got)
	}
}

// TestIdempotencyReplaySurvivesBoltRestart: the stored response and
// fingerprint are on disk; a gateway on the reopened file replays the answer
// and still rejects a changed payload.
func TestIdempotencyReplaySurvivesBoltRestart(t *testing.T) {
	up := newUpstream(t, createPayment)
	r := paymentsRoute(up.URL)
	r.ClientIdentity = "Authorization"
	path := filepath.Join(t.TempDir(), "dedupgw.db")

	serve := func(steps ...apiStep) {
		t.Helper()
		st, err := boltstore.Open(path, boltstore.Options{SweepInterval: -1})
		if err != nil {
			t.Fatalf("open %s: %v", path, err)
		}
		h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{store: st})
		for i, s := range steps {
			s.check(t, i, h.send(payCharge, s.body, s.headers...))
		}
		h.srv.Close()
		_ = h.gw.Close()
		if err := st.Close(); err != nil {
			t.Fatalf("close bolt store: %v", err)
		}
	}
	serve(apiStep{body: `{"amount":100}`, headers: []string{key1, asAlice}, wantStatus: 201, wantDedup: "forwarded", wantBody: `{"id":"pay_0"}`})
	serve(
		apiStep{body: `{"amount":100}`, headers: []string{key1, asAlice}, wantStatus: 201, wantDedup: "duplicate", wantCT: appJSON, wantBody: `{"id":"pay_0"}`},
		apiStep{body: `{"amount":200}`, headers: []string{key1, asAlice}, wantStatus: 422, wantDedup: "rejected"},
		apiStep{body: `{"amount":200}`, headers: []string{key1, asBob}, wantStatus: 201, wantDedup: "forwarded", wantBody: `{"id":"pay_1"}`},
	)
	if got := up.count(); got != 2 {
		t.Errorf("got %d requests upstream, want 2", got)
	}
}

// TestIdempotencyReplaySharedOnRedis: two gateways (replicas) on one real
// redis-server: the response stored by one is replayed by the other, which
// also rejects a changed payload and sees the first's in-flight claim.
func TestIdempotencyReplaySharedOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	open := func() dedup.Store {
		st, err := redisstore.New(redisstore.Config{Addrs: []string{srv.Addr()}}, redisstore.Options{Logger: zaptest.NewLogger(t)})
		if err != nil {
			t.Fatalf("redis store: %v", err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("X-Test-Hold") != "" {
			arrived <- struct{}{}
			<-release
		}
		createPayment(w, r, n)
	})
	r := paymentsRoute(up.URL)
	r.ReplayHeaders = []string{"Content-Type", "Location"}
	a := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{store: open()})
	b := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{store: open()})

	apiStep{wantStatus: 201, wantDedup: "forwarded", wantBody: `{"id":"pay_0"}`}.check(t, 0, a.send(payCharge, `{"amount":100}`, key1))
	apiStep{wantStatus: 201, wantDedup: "duplicate", wantCT: appJSON, wantBody: `{"id":"pay_0"}`,
		wantHeader: map[string]string{"Location": "/payments/pay_0"}}.check(t, 1, b.send(payCharge, `{"amount":100}`, key1))
	apiStep{wantStatus: 422, wantDedup: "rejected"}.check(t, 2, b.send(payCharge, `{"amount":200}`, key1))

	first := make(chan response, 1)
	go func() {
		resp, _ := a.try(context.Background(), http.MethodPost, payCharge, `{"amount":300}`, "Idempotency-Key: k2", "X-Test-Hold: 1")
		first <- resp
	}()
	recv(t, arrived, "the first request at the upstream")
	apiStep{wantStatus: 409, wantDedup: "in-flight"}.check(t, 3, b.send(payCharge, `{"amount":300}`, "Idempotency-Key: k2"))
	close(release)
	apiStep{wantStatus: 201, wantDedup: "forwarded"}.check(t, 4, <-first)
	apiStep{wantStatus: 201, wantDedup: "duplicate", wantBody: `{"id":"pay_1"}`}.check(t, 5, b.send(payCharge, `{"amount":300}`, "Idempotency-Key: k2"))
	if got := up.count(); got != 2 {
		t.Errorf("got %d requests upstream, want 2", got)
	}
	if got := counterValue(t, b.gw.metrics.deliveries, "payments", outcomeRejectedFingerprint); got != 1 {
		t.Errorf("replica B rejected_fingerprint: got %v, want 1", got)
	}
}

// TestAmbiguousClientIdentityIsRefused: a client_identity header repeated
// with different values is refused with 400 on a route that forwards
// requests without a key too: which client it is depends on who reads it.
func TestAmbiguousClientIdentityIsRefused(t *testing.T) {
	up := newUpstream(t, createPayment)
	r := paymentsRoute(up.URL)
	r.ClientIdentity = "Authorization"
	r.OnMissingKey = Forward
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
	resp := h.send(payCharge, `{"amount":100}`, key1, asAlice, asBob)
	if resp.Status != http.StatusBadRequest || resp.Header.Get(HeaderDedupStatus) != "rejected" {
		t.Errorf("two identities on a forwarding route: got %d %q %s, want 400 rejected", resp.Status, resp.Header.Get(HeaderDedupStatus), resp.Body)
	}
	if resp := h.send(payCharge, `{"amount":100}`, key1); resp.Header.Get(HeaderDedupStatus) != "unkeyed" {
		t.Errorf("no identity on a forwarding route: got %d %q, want forwarded unkeyed", resp.Status, resp.Header.Get(HeaderDedupStatus))
	}
	if got := up.count(); got != 1 {
		t.Errorf("upstream requests: got %d, want 1 (the unkeyed one)", got)
	}
}

// TestAnswerWithoutContentTypeKeepsNone checks that an upstream answer
// without a Content-Type reaches the sender without one, forwarded and
// replayed: net/http would otherwise sniff one from the body and add it
// (a JSON answer would arrive as "text/plain; charset=utf-8"), and the
// sender would not get the upstream's response as it was sent.
func TestAnswerWithoutContentTypeKeepsNone(t *testing.T) {
	tests := []struct {
		name   string
		ct     []string // the upstream's Content-Type; nil: none
		wantCT []string // what the sender gets, forwarded and replayed
	}{
		{name: "none", ct: nil, wantCT: nil},
		{name: "json", ct: []string{appJSON}, wantCT: []string{appJSON}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if tc.ct != nil {
					w.Header()["Content-Type"] = tc.ct
				} else {
					w.Header()["Content-Type"] = nil // the upstream sends none
				}
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"id":"pay_%d"}`, n)
			})
			h := newHarness(t, Config{Routes: []Route{paymentsRoute(up.URL)}}, harnessOpts{})
			for i, wantDedup := range []string{statusForwarded, statusDuplicate} {
				resp := h.send(payCharge, `{"amount":1}`, key1)
				if resp.Status != http.StatusCreated || resp.Header.Get(HeaderDedupStatus) != wantDedup {
					t.Fatalf("request %d: got %d %s, want 201 %s", i, resp.Status, resp.Header.Get(HeaderDedupStatus), wantDedup)
				}
				if got := resp.Header.Values("Content-Type"); !slices.Equal(got, tc.wantCT) {
					t.Errorf("request %d (%s): got Content-Type %q, want %q", i, wantDedup, got, tc.wantCT)
				}
				if got, want := string(resp.Body), `{"id":"pay_0"}`; got != want {
					t.Errorf("request %d (%s): got body %q, want %q", i, wantDedup, got, want)
				}
			}
			if got := up.count(); got != 1 {
				t.Errorf("got %d requests upstream, want 1", got)
			}
		})
	}
}
