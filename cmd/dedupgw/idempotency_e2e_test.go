package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// apiReply is a fully read answer, with its headers.
type apiReply struct {
	status int
	header http.Header
	body   string
}

// postWith sends body to url with headers ("Name: value").
func postWith(t *testing.T, url, body string, headers ...string) apiReply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for _, kv := range headers {
		k, v, _ := strings.Cut(kv, ":")
		req.Header.Set(k, strings.TrimSpace(v))
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: reading the body: %v", url, err)
	}
	return apiReply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// want checks status, Dedup-Status and (when not empty) the exact body.
func (r apiReply) want(t *testing.T, what string, status int, dedup, body string) {
	t.Helper()
	if r.status != status || r.header.Get("Dedup-Status") != dedup {
		t.Errorf("%s: got %d Dedup-Status %q (%s), want %d %q", what, r.status, r.header.Get("Dedup-Status"), r.body, status, dedup)
	}
	if body != "" && r.body != body {
		t.Errorf("%s: got body %q, want %q", what, r.body, body)
	}
}

// paymentsRoute is the README's API idempotency route "payments" on
// /api/payments/* to upstreamURL, keys scoped by Authorization, with extra
// appended to it.
func paymentsRoute(upstreamURL, extra string) string {
	return fmt.Sprintf(`  - name: payments
    path: /api/payments/*
    upstream: %q
    provider: generic
    keys: ["header:Idempotency-Key"]
    on_missing_key: reject
    on_fingerprint_mismatch: reject
    client_identity: Authorization
    duplicate_response: replay
%s`, upstreamURL, extra)
}

// TestE2EAPIIdempotency runs the API idempotency route of the README with
// the real binary on a bolt file: replay, 422, 400, per-client keys, the
// keys CLI addressing a client's key, and a replay after kill -9.
func TestE2EAPIIdempotency(t *testing.T) {
	u := newUpstream(t)
	u.setHandler(func(w http.ResponseWriter, r *http.Request, _ int) {
		n := u.total.Load()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/payments/pay_%d", n))
		w.Header().Set("X-Dedup-Key-Seen", r.Header.Get("Dedup-Key"))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, n)
	})
	cfg := gatewayConfig(t, t.TempDir(), "", paymentsRoute(u.URL, `    fingerprint_exclude: [request_time]
    replay_headers: [Content-Type, Location, X-Dedup-Key-Seen]
`))
	g := startGateway(t, cfg)
	url := g.url("/api/payments/charge")
	const alice, bob = "Authorization: Bearer alice", "Authorization: Bearer bob"

	first := postWith(t, url, `{"amount":100,"request_time":"10:00:00"}`, "Idempotency-Key: k1", alice)
	first.want(t, "first request", 201, "forwarded", `{"id":"pay_1"}`)
	postWith(t, url, `{"request_time":"10:00:05", "amount":100}`, "Idempotency-Key: k1", alice).
		want(t, "retry, other request_time", 201, "duplicate", `{"id":"pay_1"}`)
	postWith(t, url, `{"amount":200}`, "Idempotency-Key: k1", alice).want(t, "changed payload", 422, "rejected", "")
	postWith(t, url, `{"amount":200}`, "Idempotency-Key: k1", bob).want(t, "another client, same key", 201, "forwarded", `{"id":"pay_2"}`)
	postWith(t, url, `{"amount":100}`, alice).want(t, "no key", 400, "rejected", "")
	postWith(t, url, `{"amount":100}`, "Idempotency-Key: "+strings.Repeat("k", 256), alice).want(t, "256-character key", 400, "rejected", "")
	postWith(t, url, `{"amount":100}`, "Idempotency-Key: k1").want(t, "no Authorization", 400, "rejected", "")

	// The upstream saw the stored key in Dedup-Key; the keys CLI finds it.
	stored, ok := strings.CutPrefix(first.header.Get("X-Dedup-Key-Seen"), "payments:")
	sum := sha256.Sum256([]byte("Bearer alice"))
	if want := hex.EncodeToString(sum[:])[:32] + ":k1"; !ok || stored != want {
		t.Fatalf("upstream Dedup-Key: got %q, want payments:%s", first.header.Get("X-Dedup-Key-Seen"), want)
	}
	code, stdout, stderr := runCLI(t, nil, "keys", "get", "--admin="+g.adminURL(""), "payments", stored)
	if code != 0 || !strings.Contains(stdout, `"state": "processed"`) || !strings.Contains(stdout, `"fingerprint": "`) {
		t.Errorf("keys get payments %s: got exit %d, stdout %s, stderr %s; want the processed record with its fingerprint", stored, code, stdout, stderr)
	}
	for series, want := range map[string]string{
		`dedupgw_deliveries_total{outcome="rejected_fingerprint",route="payments"}`: "1",
		`dedupgw_deliveries_total{outcome="rejected_key",route="payments"}`:         "3",
	} {
		if got := metricValue(t, g, series); got != want {
			t.Errorf("%s: got %q, want %q", series, got, want)
		}
	}

	g.kill()
	g2 := startGateway(t, cfg)
	again := postWith(t, g2.url("/api/payments/charge"), `{"amount":100}`, "Idempotency-Key: k1", alice)
	again.want(t, "retry after kill -9", 201, "duplicate", `{"id":"pay_1"}`)
	for _, h := range []string{"Content-Type", "Location"} {
		if got, want := again.header.Get(h), first.header.Get(h); got != want {
			t.Errorf("replayed %s after restart: got %q, want %q", h, got, want)
		}
	}
	postWith(t, g2.url("/api/payments/charge"), `{"amount":300}`, "Idempotency-Key: k1", alice).want(t, "changed payload after restart", 422, "rejected", "")
	if got := u.total.Load(); got != 2 {
		t.Errorf("upstream requests: got %d, want 2", got)
	}
}

// TestE2EClientIdentitySecret runs an API idempotency route with
// client_identity_secret from the environment, with the real binary: the
// application's Dedup-Key carries the HMAC scope (openssl dgst -sha256
// -hmac 0123456789abcdef of "Bearer alice", first 32 hex digits), the retry
// is replayed, and the keys CLI finds the stored key. A SIGHUP to another
// secret re-scopes every key: it is warned about, without the secret, and
// the same retry is forwarded again under the new scope. Neither secret is
// ever logged.
func TestE2EClientIdentitySecret(t *testing.T) {
	const (
		secret    = "0123456789abcdef"
		rotated   = "fedcba9876543210"
		scope     = "11691c11553143099b4c71476cf11581" // HMAC-SHA256(secret, "Bearer alice")
		newScope  = "0aec81b0bb87a798460a38892fc8d293" // HMAC-SHA256(rotated, "Bearer alice")
		alice     = "Authorization: Bearer alice"
		request   = `{"amount":100}`
		reloadMsg = "route's key sources changed"
	)
	u := newUpstream(t)
	u.setHandler(func(w http.ResponseWriter, r *http.Request, _ int) {
		n := u.total.Load()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Dedup-Key-Seen", r.Header.Get("Dedup-Key"))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, n)
	})
	dir := t.TempDir()
	config := func(secretVar string) string {
		return gatewayConfig(t, dir, "", paymentsRoute(u.URL, fmt.Sprintf(`    client_identity_secret: "${%s}"
    replay_headers: [Content-Type, X-Dedup-Key-Seen]
`, secretVar)))
	}
	cfg := config("CLIENT_IDENTITY_SECRET")
	g := startGateway(t, cfg, "CLIENT_IDENTITY_SECRET="+secret, "CLIENT_IDENTITY_SECRET_NEW="+rotated)
	url := g.url("/api/payments/charge")

	first := postWith(t, url, request, "Idempotency-Key: k1", alice)
	first.want(t, "first request", 201, "forwarded", `{"id":"pay_1"}`)
	if got, want := first.header.Get("X-Dedup-Key-Seen"), "payments:"+scope+":k1"; got != want {
		t.Errorf("upstream Dedup-Key: got %q, want %q", got, want)
	}
	postWith(t, url, request, "Idempotency-Key: k1", alice).want(t, "retry", 201, "duplicate", `{"id":"pay_1"}`)
	code, stdout, stderr := runCLI(t, nil, "keys", "get", "--admin="+g.adminURL(""), "payments", scope+":k1")
	if code != 0 || !strings.Contains(stdout, `"state": "processed"`) {
		t.Errorf("keys get payments %s:k1: got exit %d, stdout %s, stderr %s; want the processed record", scope, code, stdout, stderr)
	}

	config("CLIENT_IDENTITY_SECRET_NEW")
	g.signal(syscall.SIGHUP)
	g.waitLog(`"msg":"config reloaded"`, 1)
	if n := strings.Count(g.logs(), reloadMsg); n != 1 || !strings.Contains(g.logs(), `"client_identity_secret":"changed"`) {
		t.Errorf("log: got %d %q warnings, want 1 with client_identity_secret \"changed\"; log:\n%s", n, reloadMsg, g.logs())
	}
	again := postWith(t, url, request, "Idempotency-Key: k1", alice)
	again.want(t, "the retry after the secret changed", 201, "forwarded", `{"id":"pay_2"}`)
	if got, want := again.header.Get("X-Dedup-Key-Seen"), "payments:"+newScope+":k1"; got != want {
		t.Errorf("upstream Dedup-Key after the reload: got %q, want %q", got, want)
	}
	postWith(t, url, request, "Idempotency-Key: k1", alice).want(t, "its retry", 201, "duplicate", `{"id":"pay_2"}`)

	for _, s := range []string{secret, rotated} {
		if strings.Contains(g.logs(), s) {
			t.Errorf("log shows a client_identity_secret:\n%s", g.logs())
		}
	}
	if got := u.total.Load(); got != 2 {
		t.Errorf("upstream requests: got %d, want 2", got)
	}
}

// TestE2ESignedStripe (issue 4) with the real binary: a forged delivery with
// a real event ID gets 401 and records nothing; the genuine one is forwarded
// once and Stripe's re-signed retry is a duplicate.
func TestE2ESignedStripe(t *testing.T) {
	const secret = "whsec_e2e_secret"
	u := newUpstream(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	writeFileAtomic(t, cfg, fmt.Sprintf(`listen: "127.0.0.1:0"
admin:
  listen: "127.0.0.1:0"
store:
  backend: bolt
  bolt:
    path: %q
routes:
  - name: stripe
    path: /webhooks/stripe
    upstream: %q
    provider: stripe
    secrets: ["${STRIPE_WEBHOOK_SECRET}"]
`, filepath.Join(dir, "dedupgw.db"), u.URL))
	g := startGateway(t, cfg, "STRIPE_WEBHOOK_SECRET="+secret)
	url := g.url("/webhooks/stripe")
	sign := func(key string, ts time.Time, body string) string {
		m := hmac.New(sha256.New, []byte(key))
		fmt.Fprintf(m, "%d.%s", ts.Unix(), body)
		return "Stripe-Signature: t=" + strconv.FormatInt(ts.Unix(), 10) + ",v1=" + hex.EncodeToString(m.Sum(nil))
	}
	const event = `{"id":"evt_e2e","type":"invoice.paid"}`
	now := time.Now()

	postWith(t, url, event, sign("whsec_forged", now, event)).want(t, "forged", 401, "rejected", "")
	code, _, _ := runCLI(t, nil, "keys", "get", "--admin="+g.adminURL(""), "stripe", "evt_e2e")
	if code != 1 {
		t.Errorf("keys get after the forgery: got exit %d, want 1 (not found)", code)
	}
	postWith(t, url, event, sign(secret, now, event)).want(t, "genuine", 200, "forwarded", `{"ok":true}`)
	postWith(t, url, event, sign(secret, now.Add(time.Minute), event)).want(t, "Stripe's retry", 200, "duplicate", "")
	if got := u.count("stripe:evt_e2e"); got != 1 {
		t.Errorf("upstream deliveries of evt_e2e: got %d, want 1", got)
	}
}
