package providers

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// The presets, as DESIGN.md and the README list them: each provider's own
// event (or delivery) ID, nothing else.
func TestPresetKeys(t *testing.T) {
	tests := []struct {
		provider string
		want     []string
	}{
		{Stripe, []string{"json:id"}},
		{Shopify, []string{"header:X-Shopify-Event-Id", "header:Shopify-Event-Id", "header:X-Shopify-Webhook-Id", "header:Shopify-Webhook-Id"}},
		{GitHub, []string{"header:X-GitHub-Delivery"}},
		{StandardWebhooks, []string{"header:webhook-id", "header:svix-id"}},
		{Slack, []string{"json:event_id"}},
		{Generic, nil},
	}
	for _, tt := range tests {
		if got := PresetKeys(tt.provider); !slices.Equal(got, tt.want) {
			t.Errorf("PresetKeys(%q): got %q, want %q", tt.provider, got, tt.want)
		}
	}
}

func TestNewPresets(t *testing.T) {
	// Shaped like the real events: other IDs beside the event's own (a
	// Stripe event's object, a Slack event's timestamp) must not key it.
	body := []byte(`{"id":"evt_1","object":"event","data":{"object":{"id":"cus_123"}},"event_id":"Ev1","event":{"type":"message","event_ts":"1700000000.000100"}}`)
	tests := []struct {
		provider string
		keys     []string
		headers  map[string]string
		wantKey  string
		wantReq  string
	}{
		{Stripe, nil, nil, "evt_1", ""},
		{Shopify, nil, map[string]string{"X-Shopify-Event-Id": "se1", "X-Shopify-Webhook-Id": "sw1"}, "se1", "sw1"},
		{Shopify, nil, map[string]string{"X-Shopify-Webhook-Id": "sw1"}, "sw1", "sw1"},
		{GitHub, nil, map[string]string{"X-GitHub-Hook-Id": "hook7", "X-GitHub-Delivery": "gd1"}, "gd1", "gd1"},
		{StandardWebhooks, nil, map[string]string{"webhook-id": "msg_1", "svix-id": "msg_2"}, "msg_1", "msg_1"},
		{StandardWebhooks, nil, map[string]string{"svix-id": "msg_2"}, "msg_2", "msg_2"},
		{Slack, nil, nil, "Ev1", ""},
		{Generic, []string{"json:id"}, nil, "evt_1", ""},
		{"", []string{"header:X-Id"}, map[string]string{"X-Id": "g1"}, "g1", ""},
		{GitHub, []string{"body"}, map[string]string{"X-GitHub-Delivery": "gd1"}, BodyKey(body), "gd1"},
	}
	for _, tt := range tests {
		t.Run(tt.provider+strings.Join(tt.keys, ","), func(t *testing.T) {
			p, err := New(Config{Provider: tt.provider, Keys: tt.keys})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			if p.Verifier != nil {
				t.Errorf("Verifier without secrets: got %T, want nil", p.Verifier)
			}
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			if got, err := p.Key(r, body); got != tt.wantKey || err != nil {
				t.Errorf("Key: got (%q, %v), want (%q, nil)", got, err, tt.wantKey)
			}
			if got := p.RequestID(r); got != tt.wantReq {
				t.Errorf("RequestID: got %q, want %q", got, tt.wantReq)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown provider", Config{Provider: "paypal"}, `provider: unknown provider "paypal"`},
		{"generic without keys", Config{Provider: Generic}, "keys: the generic provider needs a keys: list"},
		{"empty provider without keys", Config{}, "keys: the generic provider needs a keys: list"},
		{"empty secret", Config{Provider: Stripe, Secrets: []string{"whsec_a", ""}}, "secrets[1] is empty (unset environment variable?)"},
		{"bad key source", Config{Provider: Stripe, Keys: []string{"foo:bar"}}, `keys[0]: unknown source "foo:bar"`},
		{"negative tolerance", Config{Provider: Stripe, Tolerance: -time.Second}, "tolerance: must not be negative"},
		{"bad algorithm", Config{Keys: []string{"body"}, Signature: GenericSignature{Algorithm: "md5"}}, `signature.algorithm: unknown algorithm "md5"`},
		{"bad encoding", Config{Keys: []string{"body"}, Signature: GenericSignature{Encoding: "base32"}}, `signature.encoding: unknown encoding "base32"`},
		{"bad svix secret", Config{Provider: StandardWebhooks, Secrets: []string{"whsec_!!notbase64"}}, "secrets[0]: a standard-webhooks secret must be whsec_ followed by base64"},
		{"bad whpk secret", Config{Provider: StandardWebhooks, Secrets: []string{"whpk_AAAA"}}, "secrets[0]: a whpk_ secret must be a base64 Ed25519 public key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("New: got %v, want prefix %q", err, tt.want)
			}
			if verr := tt.cfg.Validate(); verr == nil || verr.Error() != err.Error() {
				t.Errorf("Validate: got %v, want %v", verr, err)
			}
			for _, s := range tt.cfg.Secrets {
				if len(s) > 5 && strings.Contains(err.Error(), s) {
					t.Errorf("error %q contains the secret", err)
				}
			}
		})
	}
}

func TestNewVerifierAndTolerance(t *testing.T) {
	// A zero tolerance means 300s: signed 299s ago passes, 301s ago is stale.
	for _, tt := range []struct {
		age  int64
		want error
	}{{299, nil}, {301, ErrStale}} {
		p, err := New(Config{Provider: Stripe, Secrets: []string{"s"}, Now: fixedClock(1000 + tt.age)})
		if err != nil {
			t.Fatalf("New: got %v, want nil", err)
		}
		r := newRequest(map[string]string{"Stripe-Signature": stripeSign("s", 1000, "{}")})
		if err := p.Verifier.Verify(r, []byte("{}")); !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
			t.Errorf("age %ds: got %v, want %v", tt.age, err, tt.want)
		}
	}
	// A nil Now means the real clock.
	p, err := New(Config{Provider: Stripe, Secrets: []string{"s"}})
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	r := newRequest(map[string]string{"Stripe-Signature": stripeSign("s", time.Now().Unix(), "{}")})
	if err := p.Verifier.Verify(r, []byte("{}")); err != nil {
		t.Errorf("Verify with the real clock: got %v, want nil", err)
	}
}

// TestProviderConcurrentUse runs Key and Verify from many goroutines on one
// Provider, so -race sees the pooled scanners and shared verifier state.
func TestProviderConcurrentUse(t *testing.T) {
	p, err := New(Config{Provider: Stripe, Keys: []string{"json:data.object.id", "body"}, Secrets: []string{"s"}, Now: fixedClock(1000)})
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	const workers, rounds = 8, 200
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range rounds {
				body := fmt.Sprintf(`{"data":{"object":{"id":"obj_%d_%d"}},"z":[1,{"b":2,"a":1}]}`, w, i)
				r := newRequest(map[string]string{"Stripe-Signature": stripeSign("s", 1000, body)})
				if err := p.Verifier.Verify(r, []byte(body)); err != nil {
					errs <- fmt.Errorf("Verify: got %v, want nil", err)
					return
				}
				want := fmt.Sprintf("obj_%d_%d", w, i)
				if got, err := p.Key(r, []byte(body)); got != want || err != nil {
					errs <- fmt.Errorf("Key: got (%q, %v), want (%q, nil)", got, err, want)
					return
				}
				if BodyKey([]byte(body)) != BodyKey([]byte(strings.ReplaceAll(body, `"b":2,"a":1`, `"a":1,"b":2`))) {
					errs <- fmt.Errorf("BodyKey differs for reordered keys")
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestKeySources(t *testing.T) {
	tests := []struct {
		cfg  Config
		want []string
	}{
		{Config{Provider: Stripe}, []string{"json:id"}},
		{Config{Provider: Stripe, Keys: []string{"body"}}, []string{"body"}},
		{Config{Provider: Generic}, nil},
		{Config{}, nil},
	}
	for _, tt := range tests {
		if got := tt.cfg.KeySources(); !slices.Equal(got, tt.want) {
			t.Errorf("%+v.KeySources(): got %q, want %q", tt.cfg, got, tt.want)
		}
	}
}
