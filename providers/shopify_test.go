package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"slices"
	"testing"
)

// shopifySign signs body the way Shopify does.
func shopifySign(secret, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

func TestShopifyVerify(t *testing.T) {
	const (
		vecSecret = "test_secret_key"
		vecBody   = `{"foo": "bar"}`
		vecSig    = "B23tXN681gZ0qIWNRrgtzBE9XSDo5yaUu6wfmhu3a7g="
	)
	tests := []struct {
		name    string
		secrets []string
		header  string // "-" means absent
		body    string
		want    error
	}{
		{"shopify-app-js vector", []string{vecSecret}, vecSig, vecBody, nil},
		{"rotation", []string{"old", vecSecret}, vecSig, vecBody, nil},
		{"wrong secret", []string{"nope"}, vecSig, vecBody, ErrBadSignature},
		{"tampered body", []string{vecSecret}, vecSig, `{"foo":"bar"}`, ErrBadSignature},
		{"missing header", []string{vecSecret}, "-", vecBody, ErrNoSignature},
		{"not base64", []string{vecSecret}, "!!!", vecBody, ErrBadSignature},
		{"hex instead of base64", []string{vecSecret}, "076ded5cdebad60674a8858d46b82dcc113d5d20e8e72694bbac1f9a1bb76bb8", vecBody, ErrBadSignature},
		{"short", []string{vecSecret}, "AAAA", vecBody, ErrBadSignature},
		{"fresh signature", []string{"k"}, shopifySign("k", "{}"), "{}", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Provider: Shopify, Secrets: tt.secrets})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			h := map[string]string{}
			if tt.header != "-" {
				h["X-Shopify-Hmac-Sha256"] = tt.header
			}
			err = p.Verifier.Verify(newRequest(h), []byte(tt.body))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
		})
	}
}

// FuzzShopifySignature checks the X-Shopify-Hmac-Sha256 parsing never panics
// and only ever returns a sentinel.
func FuzzShopifySignature(f *testing.F) {
	for _, s := range []string{"B23tXN681gZ0qIWNRrgtzBE9XSDo5yaUu6wfmhu3a7g=", "B23t", "====", ""} {
		f.Add(s)
	}
	v := &shopifyVerifier{secrets: [][]byte{[]byte("test_secret_key")}}
	f.Fuzz(func(t *testing.T, h string) {
		err := v.Verify(newRequest(map[string]string{"X-Shopify-Hmac-Sha256": h}), []byte(`{"foo": "bar"}`))
		if err != nil && !errors.Is(err, ErrNoSignature) && !errors.Is(err, ErrBadSignature) {
			t.Fatalf("Verify(%q): got %v, want a sentinel", h, err)
		}
	})
}

// TestShopifyUnprefixedHeaders: Shopify's headers without the "X-" prefix are
// accepted wherever the X- ones are (signature, key, request ID), the X- one
// first; the event ID in either spelling comes before the delivery ID.
func TestShopifyUnprefixedHeaders(t *testing.T) {
	const (
		secret = "test_secret_key"
		body   = `{"foo": "bar"}`
		good   = "B23tXN681gZ0qIWNRrgtzBE9XSDo5yaUu6wfmhu3a7g="
		bad    = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
	)
	tests := []struct {
		name      string
		headers   map[string]string
		wantErr   error
		wantKey   string
		wantReqID string
	}{
		{"only unprefixed", map[string]string{
			"Shopify-Hmac-Sha256": good, "Shopify-Event-Id": "se1", "Shopify-Webhook-Id": "sw1",
		}, nil, "se1", "sw1"},
		{"unprefixed delivery ID only", map[string]string{
			"Shopify-Hmac-Sha256": good, "Shopify-Webhook-Id": "sw1",
		}, nil, "sw1", "sw1"},
		{"both spellings: the X- ones win", map[string]string{
			"X-Shopify-Hmac-Sha256": good, "Shopify-Hmac-Sha256": good,
			"X-Shopify-Event-Id": "xe1", "Shopify-Event-Id": "se1",
			"X-Shopify-Webhook-Id": "xw1", "Shopify-Webhook-Id": "sw1",
		}, nil, "xe1", "xw1"},
		// Shopify sends both with the same value: a second signature that
		// differs is one nothing checked, which the application may read.
		{"both spellings, signatures that differ", map[string]string{
			"X-Shopify-Hmac-Sha256": good, "Shopify-Hmac-Sha256": bad, "X-Shopify-Event-Id": "xe1",
		}, ErrBadSignature, "xe1", ""},
		{"a bad X- signature is not rescued by the unprefixed one", map[string]string{
			"X-Shopify-Hmac-Sha256": bad, "Shopify-Hmac-Sha256": good, "X-Shopify-Event-Id": "xe1",
		}, ErrBadSignature, "xe1", ""},
		{"mixed: the event ID beats the X- delivery ID", map[string]string{
			"X-Shopify-Hmac-Sha256": good, "X-Shopify-Webhook-Id": "xw1", "Shopify-Event-Id": "se1",
		}, nil, "se1", "xw1"},
		{"bad unprefixed signature", map[string]string{
			"Shopify-Hmac-Sha256": bad, "Shopify-Event-Id": "se1",
		}, ErrBadSignature, "se1", ""},
		{"no signature in either spelling", map[string]string{
			"Shopify-Event-Id": "se1",
		}, ErrNoSignature, "se1", ""},
	}
	p, err := New(Config{Provider: Shopify, Secrets: []string{secret}})
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRequest(tt.headers)
			err := p.Verifier.Verify(r, []byte(body))
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.wantErr)
			}
			if got, err := p.Key(r, []byte(body)); got != tt.wantKey || err != nil {
				t.Errorf("Key: got (%q, %v), want (%q, nil)", got, err, tt.wantKey)
			}
			if got := p.RequestID(r); got != tt.wantReqID {
				t.Errorf("RequestID: got %q, want %q", got, tt.wantReqID)
			}
		})
	}
	want := []string{"header:X-Shopify-Event-Id", "header:Shopify-Event-Id", "header:X-Shopify-Webhook-Id", "header:Shopify-Webhook-Id"}
	if got := PresetKeys(Shopify); !slices.Equal(got, want) {
		t.Errorf("PresetKeys(shopify): got %q, want %q", got, want)
	}
}
