package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/providers"
)

// stripeSigned returns a Stripe-Signature header for body signed with secret
// at ts.
func stripeSigned(secret, body string, ts time.Time) string {
	t := strconv.FormatInt(ts.Unix(), 10)
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(t + "." + body))
	return "Stripe-Signature: t=" + t + ",v1=" + hex.EncodeToString(m.Sum(nil))
}

// githubSigned returns an X-Hub-Signature-256 header for body.
func githubSigned(secret, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return "X-Hub-Signature-256: sha256=" + hex.EncodeToString(m.Sum(nil))
}

// githubRoute is a GitHub route on /webhooks/github to upstreamURL, its
// signatures checked with the secret "gh-secret".
func githubRoute(upstreamURL string) Route {
	return Route{
		Name:     "github",
		Path:     "/webhooks/github",
		Upstream: upstreamURL,
		Provider: providers.Config{Provider: providers.GitHub, Secrets: []string{"gh-secret"}},
	}
}

// stripeRoute is a Stripe route named name on path, verifying with
// stripeSecret.
func stripeRoute(name, path, upstreamURL string) Route {
	return Route{
		Name:     name,
		Path:     path,
		Upstream: upstreamURL,
		Provider: providers.Config{Provider: providers.Stripe, Secrets: []string{stripeSecret}},
	}
}

// forge posts n deliveries signed with another secret than stripeSecret to
// path and wants each refused with 401.
func forge(t *testing.T, h *harness, path string, n int) {
	t.Helper()
	for i := range n {
		body := fmt.Sprintf(`{"id":"evt_%d"}`, i)
		if resp := h.send(path, body, stripeSigned("whsec_attacker", body, time.Now())); resp.Status != http.StatusUnauthorized {
			t.Fatalf("forgery %d on %s: got %d, want 401", i, path, resp.Status)
		}
	}
}

// TestSignedStripeDeliveries (issue 4): a forged delivery carrying a real
// event ID is refused with 401 and records nothing, so it can neither reach
// the application nor block the genuine delivery, which is forwarded once;
// Stripe's retry (signed again, later) is a duplicate.
func TestSignedStripeDeliveries(t *testing.T) {
	up := newUpstream(t, nil)
	h := newHarness(t, Config{Routes: []Route{stripeRoute("stripe", "/webhooks/stripe", up.URL)}}, harnessOpts{})
	const event = `{"id":"evt_real","type":"payment_intent.succeeded","data":{"object":{"amount":1000}}}`
	const altered = `{"id":"evt_real","type":"payment_intent.succeeded","data":{"object":{"amount":1}}}`
	now := time.Now()
	genuine := stripeSigned(stripeSecret, event, now)

	steps := []struct {
		name       string
		body       string
		headers    []string
		wantStatus int
		wantDedup  string
		wantUp     int
	}{
		{"forged: unsigned", event, nil, 401, "rejected", 0},
		{"forged: signed with another secret", event, []string{stripeSigned("whsec_attacker", event, now)}, 401, "rejected", 0},
		{"forged: a genuine signature on an altered body", altered, []string{genuine}, 401, "rejected", 0},
		{"forged: a genuine signature, stale", event, []string{stripeSigned(stripeSecret, event, now.Add(-time.Hour))}, 401, "rejected", 0},
		{"genuine delivery", event, []string{genuine}, 200, "forwarded", 1},
		{"Stripe's retry, signed again", event, []string{stripeSigned(stripeSecret, event, now.Add(time.Minute))}, 200, "duplicate", 1},
		{"forged after the genuine one", event, []string{stripeSigned("whsec_attacker", event, now)}, 401, "rejected", 1},
	}
	for i, s := range steps {
		resp := h.send("/webhooks/stripe", s.body, s.headers...)
		if resp.Status != s.wantStatus || resp.Header.Get(HeaderDedupStatus) != s.wantDedup {
			t.Errorf("step %d (%s): got %d %q, want %d %q", i, s.name, resp.Status, resp.Header.Get(HeaderDedupStatus), s.wantStatus, s.wantDedup)
		}
		if got := up.count(); got != s.wantUp {
			t.Errorf("step %d (%s): got %d requests upstream, want %d", i, s.name, got, s.wantUp)
		}
		if i == 3 { // every forgery so far left no trace
			if rec, err := h.record("stripe", "evt_real"); !errors.Is(err, dedup.ErrNotFound) {
				t.Errorf("after the forgeries: got record %+v, %v; want ErrNotFound", rec, err)
			}
		}
	}
	if got := string(up.request(0).Body); got != event {
		t.Errorf("upstream body: got %s, want the delivery byte for byte", got)
	}
	if got := counterValue(t, h.gw.metrics.deliveries, "stripe", outcomeRejectedSignature); got != 5 {
		t.Errorf("rejected_signature: got %v, want 5", got)
	}
}

// TestGitHubBodyKey: X-GitHub-Delivery is not covered by the signature, so a
// captured delivery resent under a fresh delivery ID still verifies. With the
// preset key it is forwarded again; with keys: ["body"] it is a duplicate.
func TestGitHubBodyKey(t *testing.T) {
	const secret = "github-secret"
	const push = `{"ref":"refs/heads/main","after":"6113728f27ae82c7b1a177c8d03f9e96e0adf246"}`
	tests := []struct {
		name       string
		keys       []string
		wantReplay string
		wantUp     int
	}{
		{"preset key (X-GitHub-Delivery)", nil, "forwarded", 2},
		{`keys: ["body"]`, []string{"body"}, "duplicate", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, nil)
			r := Route{
				Name:     "github",
				Path:     "/webhooks/github",
				Upstream: up.URL,
				Provider: providers.Config{Provider: providers.GitHub, Keys: tt.keys, Secrets: []string{secret}},
			}
			h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
			send := func(delivery, body string) response {
				return h.send("/webhooks/github", body, "X-GitHub-Event: push", "X-GitHub-Delivery: "+delivery, githubSigned(secret, body))
			}
			if resp := send("d-1", push); resp.Header.Get(HeaderDedupStatus) != "forwarded" {
				t.Errorf("first delivery: got %d %q, want forwarded", resp.Status, resp.Header.Get(HeaderDedupStatus))
			}
			if resp := send("d-1", push); resp.Header.Get(HeaderDedupStatus) != "duplicate" {
				t.Errorf("GitHub's redelivery (same ID): got %d %q, want duplicate", resp.Status, resp.Header.Get(HeaderDedupStatus))
			}
			if resp := send("d-2-fresh", push); resp.Header.Get(HeaderDedupStatus) != tt.wantReplay {
				t.Errorf("captured body under a fresh ID: got %d %q, want %q", resp.Status, resp.Header.Get(HeaderDedupStatus), tt.wantReplay)
			}
			if got := up.count(); got != tt.wantUp {
				t.Errorf("got %d requests upstream, want %d", got, tt.wantUp)
			}
			other := `{"ref":"refs/heads/main","after":"0000000000000000000000000000000000000001"}`
			if resp := send("d-3", other); resp.Status != http.StatusOK || resp.Header.Get(HeaderDedupStatus) != "forwarded" {
				t.Errorf("another push: got %d %q, want 200 forwarded", resp.Status, resp.Header.Get(HeaderDedupStatus))
			}
		})
	}
}

// TestConnectionNamedHeadersAreNotTrusted: headers the Connection header
// names are hop-by-hop and never reach the upstream, so the gateway must not
// verify a signature or take a key from them either.
func TestConnectionNamedHeadersAreNotTrusted(t *testing.T) {
	up := newUpstream(t, nil)
	gh := githubRoute(up.URL)
	orders := genericRoute("orders", "/hooks/orders", up.URL)
	h := newHarness(t, Config{Routes: []Route{gh, orders}}, harnessOpts{})
	const body = `{"action":"opened"}`

	resp := h.send("/webhooks/github", body, githubSigned("gh-secret", body), "X-GitHub-Delivery: d-1", "Connection: X-Hub-Signature-256")
	if resp.Status != http.StatusUnauthorized || up.count() != 0 {
		t.Errorf("signature named in Connection: got %d with %d upstream requests, want 401 and none", resp.Status, up.count())
	}
	resp = h.send("/webhooks/github", body, githubSigned("gh-secret", body), "X-GitHub-Delivery: d-1")
	if resp.Status != http.StatusOK || resp.Header.Get(HeaderDedupStatus) != statusForwarded {
		t.Errorf("the genuine delivery: got %d %q, want 200 forwarded", resp.Status, resp.Header.Get(HeaderDedupStatus))
	}

	resp = h.send("/hooks/orders", `{"no":"id"}`, "Idempotency-Key: k-1", "Connection: keep-alive, Idempotency-Key")
	if got := resp.Header.Get(HeaderDedupStatus); got != statusUnkeyed {
		t.Errorf("key header named in Connection: got Dedup-Status %q, want %q", got, statusUnkeyed)
	}
	if got := up.request(up.count() - 1).Header.Get("Idempotency-Key"); got != "" {
		t.Errorf("upstream Idempotency-Key: got %q, want none", got)
	}
}

// TestLongRequestIDIsClippedInLogs: the delivery ID header comes from the
// sender, before any signature check, so it is bounded in log lines like a
// key.
func TestLongRequestIDIsClippedInLogs(t *testing.T) {
	up := newUpstream(t, nil)
	gh := githubRoute(up.URL)
	store := memstore.New(memstore.Options{SweepInterval: -1})
	t.Cleanup(func() { _ = store.Close() })
	_, srv, logs := observedGateway(t, store, gh)
	long := strings.Repeat("d", 60000)
	if resp := post(t, srv, "/webhooks/github", `{}`, "X-GitHub-Delivery: "+long, githubSigned("wrong", `{}`)); resp.Status != http.StatusUnauthorized {
		t.Fatalf("got %d, want 401", resp.Status)
	}
	entries := logs.FilterFieldKey("request_id").All()
	if len(entries) == 0 {
		t.Fatal("got no log line with request_id, want the rejection logged")
	}
	for _, e := range entries {
		if got := len(e.ContextMap()["request_id"].(string)); got > maxLoggedKey+len("…") {
			t.Errorf("%q: got a request_id of %d bytes, want at most %d", e.Message, got, maxLoggedKey+len("…"))
		}
	}
}

// TestRejectedSignaturesAreSampledInTheLog: anyone can post forged
// deliveries as fast as they like, so their warnings are sampled (at most
// sampledLogsPerSecond a second), while the metric counts every one.
func TestRejectedSignaturesAreSampledInTheLog(t *testing.T) {
	up := newUpstream(t, nil)
	h := newHarness(t, Config{Routes: []Route{stripeRoute("stripe", "/webhooks/stripe", up.URL)}}, harnessOpts{logClock: fixedLogClock{}})
	const forgeries = 3 * sampledLogsPerSecond
	forge(t, h, "/webhooks/stripe", forgeries)
	if got := len(h.logs.FilterMessage("signature rejected").All()); got != sampledLogsPerSecond {
		t.Errorf("signature rejected log lines within one second: got %d, want %d (sampled)", got, sampledLogsPerSecond)
	}
	if got := counterValue(t, h.gw.metrics.deliveries, "stripe", outcomeRejectedSignature); got != forgeries {
		t.Errorf("rejected_signature: got %v, want %d", got, forgeries)
	}
	// Nor does each forgery's delivery line show at the default level.
	var shown int
	for _, e := range h.logs.FilterMessage("delivery").All() {
		if e.Level >= zapcore.InfoLevel {
			shown++
		}
	}
	if shown != 0 {
		t.Errorf("delivery lines at info or above: got %d, want 0 (a forgery's is at debug)", shown)
	}
}

// TestRejectedSignatureSamplingIsPerRoute: forgeries flooding one route
// must not hide another route's rejected signatures (a secret rotated at
// the provider but not in the gateway), which the log is there to show.
func TestRejectedSignatureSamplingIsPerRoute(t *testing.T) {
	up := newUpstream(t, nil)
	routes := []Route{stripeRoute("flooded", "/webhooks/flooded", up.URL), stripeRoute("quiet", "/webhooks/quiet", up.URL)}
	h := newHarness(t, Config{Routes: routes}, harnessOpts{logClock: fixedLogClock{}})
	forge(t, h, "/webhooks/flooded", 3*sampledLogsPerSecond)
	body := `{"id":"evt_real"}`
	if resp := h.send("/webhooks/quiet", body, stripeSigned("whsec_rotated", body, time.Now())); resp.Status != http.StatusUnauthorized {
		t.Fatalf("quiet route: got %d, want 401", resp.Status)
	}
	quiet := 0
	for _, e := range h.logs.FilterMessage("signature rejected").All() {
		if e.ContextMap()["route"] == "quiet" {
			quiet++
		}
	}
	if quiet != 1 {
		t.Errorf("quiet route's signature rejected lines after a flood on another route: got %d, want 1", quiet)
	}
}
