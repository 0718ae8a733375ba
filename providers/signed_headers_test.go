package providers

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
)

// TestRepeatedSignedHeaders: a header a signature check reads (the
// signature, its timestamp, a header the template signs) repeated with
// another value is refused with ErrBadSignature, whichever value comes
// first: the check would cover one line and the application might read the
// other. Repeated with the same value it verifies.
func TestRepeatedSignedHeaders(t *testing.T) {
	const body = `{"id":"evt_1"}`
	const now = 1000
	generic := GenericSignature{TimestampHeader: "X-Ts", Template: "{timestamp}:{header:X-Id}:{body}"}
	tests := []struct {
		name    string
		cfg     Config
		headers map[string]string // a valid delivery
		repeat  string            // the header sent twice
		other   string            // its second value
	}{
		{"stripe signature", Config{Provider: Stripe, Secrets: []string{"s"}},
			map[string]string{"Stripe-Signature": stripeSign("s", now, body)}, "Stripe-Signature", stripeSign("forged", now, body)},
		{"github signature", Config{Provider: GitHub, Secrets: []string{"s"}},
			map[string]string{"X-Hub-Signature-256": githubSign("s", body)}, "X-Hub-Signature-256", githubSign("forged", body)},
		{"shopify signature", Config{Provider: Shopify, Secrets: []string{"s"}},
			map[string]string{"X-Shopify-Hmac-Sha256": shopifySign("s", body)}, "X-Shopify-Hmac-Sha256", shopifySign("forged", body)},
		{"slack timestamp", Config{Provider: Slack, Secrets: []string{"s"}},
			map[string]string{"X-Slack-Signature": slackSign("s", now, body), "X-Slack-Request-Timestamp": "1000"}, "X-Slack-Request-Timestamp", "1001"},
		{"standard webhooks signature", Config{Provider: StandardWebhooks, Secrets: []string{swSecret}},
			map[string]string{"webhook-id": "msg_1", "webhook-timestamp": "1000", "webhook-signature": swSign(swSecret, "msg_1", now, body)}, "webhook-signature", swSign(swSecret, "msg_2", now, body)},
		{"generic signature", Config{Keys: []string{"json:id"}, Secrets: []string{"s"}, Signature: generic},
			map[string]string{"X-Ts": "990", "X-Id": "abc", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "990:abc:"+body))}, "X-Signature", "00"},
		{"generic timestamp", Config{Keys: []string{"json:id"}, Secrets: []string{"s"}, Signature: generic},
			map[string]string{"X-Ts": "990", "X-Id": "abc", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "990:abc:"+body))}, "X-Ts", "991"},
		{"generic template header", Config{Keys: []string{"json:id"}, Secrets: []string{"s"}, Signature: generic},
			map[string]string{"X-Ts": "990", "X-Id": "abc", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "990:abc:"+body))}, "X-Id", "abd"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Now = fixedClock(now)
			p, err := New(tt.cfg)
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			verify := func(values ...string) error {
				r := newRequest(tt.headers)
				r.Header.Del(tt.repeat)
				for _, v := range values {
					r.Header.Add(tt.repeat, v)
				}
				return p.Verifier.Verify(r, []byte(body))
			}
			valid := tt.headers[tt.repeat]
			if err := verify(valid); err != nil {
				t.Fatalf("the valid delivery: got %v, want nil", err)
			}
			if err := verify(valid, valid); err != nil {
				t.Errorf("repeated with the same value: got %v, want nil", err)
			}
			for _, order := range [][]string{{valid, tt.other}, {tt.other, valid}} {
				if err := verify(order...); !errors.Is(err, ErrBadSignature) {
					t.Errorf("%s: %q: got %v, want %v", tt.repeat, order, err, ErrBadSignature)
				}
			}
		})
	}
}

// TestAlternateSignedHeaders: Standard Webhooks headers sent under both
// names (webhook-* and svix-*) must agree, as Svix sends them; an empty or
// forged header of the set not checked is refused, not ignored.
func TestAlternateSignedHeaders(t *testing.T) {
	const body = `{"id":"evt_1"}`
	const now = 1000
	sig := swSign(swSecret, "msg_1", now, body)
	svix := map[string]string{"svix-id": "msg_1", "svix-timestamp": "1000", "svix-signature": sig}
	both := map[string]string{"webhook-id": "msg_1", "webhook-timestamp": "1000", "webhook-signature": sig,
		"svix-id": "msg_1", "svix-timestamp": "1000", "svix-signature": sig}
	with := func(base map[string]string, k, v string) map[string]string {
		m := map[string]string{k: v}
		for bk, bv := range base {
			if bk != k {
				m[bk] = bv
			}
		}
		return m
	}
	tests := []struct {
		name    string
		headers map[string]string
		want    error
	}{
		{"svix only", svix, nil},
		{"both sets, the same values", both, nil},
		{"svix set and an empty webhook-signature", with(svix, "webhook-signature", ""), ErrBadSignature},
		{"svix set and a forged webhook-signature", with(svix, "webhook-signature", swSign(swSecret, "msg_2", now, body)), ErrBadSignature},
		{"both sets, a forged svix-signature", with(both, "svix-signature", swSign("whsec_"+"AAAAAAAAAAAAAAAAAAAAAAAA", "msg_1", now, body)), ErrBadSignature},
		{"svix set and another webhook-timestamp", with(svix, "webhook-timestamp", "999999"), ErrBadSignature},
	}
	p, err := New(Config{Provider: StandardWebhooks, Secrets: []string{swSecret}, Now: fixedClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		if err := p.Verifier.Verify(newRequest(tt.headers), []byte(body)); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("%s: got %v, want %v", tt.name, err, tt.want)
		}
	}
}
