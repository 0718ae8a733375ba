package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// stripeVectorBody is event_test_signature.json from stripe-dotnet's tests
// (484 bytes); see /work/shared/providers/vectors.md.
const stripeVectorBody = "{\n  \"id\": \"evt_123\",\n  \"object\": \"event\",\n  \"account\": \"acct_123\",\n  \"api_version\": \"2017-05-25\",\n  \"created\": 1533204620,\n  \"data\": {\n    \"object\": {\n      \"id\": \"cus_123\",\n      \"object\": \"customer\",\n      \"created\": 123456789,\n      \"email\": \"test@stripe.com\",\n      \"livemode\": false,\n      \"metadata\": {}\n    }\n  },\n  \"livemode\": false,\n  \"pending_webhooks\": 1,\n  \"request\": {\n    \"id\": \"req_123\",\n    \"idempotency_key\": \"idempotency-key-123\"\n  },\n  \"type\": \"customer.created\"\n}\n"

const (
	stripeVectorSecret = "webhook_secret"
	stripeVectorT      = 1533204620
	stripeVectorHeader = "t=1533204620,v1=2220f87ef101a04665f11cdf770523143f875572008577fa0f20882ddb9cc3c7,v0=63f3a72374a733066c4be69ed7f8e5ac85c22c9f0a6a612ab9a025a9e4ee7eef"
)

// fixedClock returns a Now func pinned to Unix second sec.
func fixedClock(sec int64) func() time.Time {
	return func() time.Time { return time.Unix(sec, 0) }
}

// stripeSign signs body the way Stripe does.
func stripeSign(secret string, ts int64, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(m, "%d.%s", ts, body)
	return fmt.Sprintf("t=%d,v1=%s", ts, hex.EncodeToString(m.Sum(nil)))
}

func newRequest(headers map[string]string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/webhooks", nil)
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	return r
}

func TestStripeVerify(t *testing.T) {
	const now = stripeVectorT + 100
	body := stripeVectorBody
	tests := []struct {
		name    string
		secrets []string
		now     int64
		tol     time.Duration
		header  string // "-" means absent
		body    string
		want    error
	}{
		{"public vector", []string{stripeVectorSecret}, now, 0, stripeVectorHeader, body, nil},
		{"public vector, too old", []string{stripeVectorSecret}, stripeVectorT + 400, 0, stripeVectorHeader, body, ErrStale},
		{"public vector, wider tolerance", []string{stripeVectorSecret}, stripeVectorT + 400, 10 * time.Minute, stripeVectorHeader, body, nil},
		{"future timestamp", []string{stripeVectorSecret}, stripeVectorT - 301, 0, stripeVectorHeader, body, ErrStale},
		{"future within tolerance", []string{stripeVectorSecret}, stripeVectorT - 299, 0, stripeVectorHeader, body, nil},
		{"wrong secret", []string{"whsec_other"}, now, 0, stripeVectorHeader, body, ErrBadSignature},
		{"rotation, new first", []string{"whsec_new", stripeVectorSecret}, now, 0, stripeVectorHeader, body, nil},
		{"rotation, old first", []string{stripeVectorSecret, "whsec_new"}, now, 0, stripeVectorHeader, body, nil},
		{"tampered body", []string{stripeVectorSecret}, now, 0, stripeVectorHeader, strings.Replace(body, "cus_123", "cus_124", 1), ErrBadSignature},
		{"missing header", []string{stripeVectorSecret}, now, 0, "-", body, ErrNoSignature},
		{"empty header", []string{stripeVectorSecret}, now, 0, "", body, ErrNoSignature},
		{"only v0 (ignored)", []string{stripeVectorSecret}, now, 0, "t=1533204620,v0=63f3a72374a733066c4be69ed7f8e5ac85c22c9f0a6a612ab9a025a9e4ee7eef", body, ErrBadSignature},
		{"no timestamp", []string{stripeVectorSecret}, now, 0, "v1=2220f87ef101a04665f11cdf770523143f875572008577fa0f20882ddb9cc3c7", body, ErrBadSignature},
		{"timestamp changed", []string{stripeVectorSecret}, now, 0, strings.Replace(stripeVectorHeader, "t=1533204620", "t=1533204621", 1), body, ErrBadSignature},
		{"two timestamps", []string{stripeVectorSecret}, now, 0, "t=1533204620," + stripeVectorHeader, body, ErrBadSignature},
		{"non-numeric timestamp", []string{stripeVectorSecret}, now, 0, "t=abc,v1=00", body, ErrBadSignature},
		{"bad hex", []string{stripeVectorSecret}, now, 0, "t=1533204620,v1=zz", body, ErrBadSignature},
		{"garbage", []string{stripeVectorSecret}, now, 0, ",,,=,", body, ErrBadSignature},
		{"second v1 matches", []string{stripeVectorSecret}, now, 0, "t=1533204620,v1=" + strings.Repeat("0", 64) + ",v1=2220f87ef101a04665f11cdf770523143f875572008577fa0f20882ddb9cc3c7", body, nil},
		{"whsec_ prefix used as written", []string{"whsec_abc"}, 1000, 0, stripeSign("whsec_abc", 1000, "{}"), "{}", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Provider: Stripe, Secrets: tt.secrets, Tolerance: tt.tol, Now: fixedClock(tt.now)})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			h := map[string]string{}
			if tt.header != "-" {
				h["Stripe-Signature"] = tt.header
			}
			err = p.Verifier.Verify(newRequest(h), []byte(tt.body))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
			if err != nil {
				for _, s := range tt.secrets {
					if strings.Contains(err.Error(), s) {
						t.Errorf("Verify error %q contains the secret", err)
					}
				}
			}
		})
	}
}

// TestStripeSignatureErrors: the error (logged at warn) says what is wrong
// with the header, so an operator can tell a truncated signature from a
// missing one or a wrong secret.
func TestStripeSignatureErrors(t *testing.T) {
	p, err := New(Config{Provider: Stripe, Secrets: []string{stripeVectorSecret}, Now: fixedClock(stripeVectorT)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ header, want string }{
		{"t=1533204620,v1=deadbeef", "no v1 signature is 64 hex digits"},
		{"t=1533204620,v0=" + strings.Repeat("0", 64), "header: no v1 signature"},
		{"t=1533204620,v1=" + strings.Repeat("0", 64), "no v1 signature in Stripe-Signature matches"},
		{"v1=" + strings.Repeat("0", 64), "no timestamp"},
	} {
		err := p.Verifier.Verify(newRequest(map[string]string{"Stripe-Signature": tt.header}), []byte("{}"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Verify(%q): got %v, want an error saying %q", tt.header, err, tt.want)
		}
	}
}

// FuzzStripeSignature checks that the Stripe-Signature parser never panics and
// that whatever it accepts has a timestamp and a 32-byte v1.
func FuzzStripeSignature(f *testing.F) {
	for _, s := range []string{stripeVectorHeader, "t=1,v1=00", "t=,v1=", ",,=", "t=1533204620,t=1,v1=aa", " t = 1 , v1 = 00 "} {
		f.Add(s)
	}
	v := &stripeVerifier{secrets: [][]byte{[]byte(stripeVectorSecret)}, clock: clock{now: fixedClock(stripeVectorT), tolerance: DefaultTolerance}}
	f.Fuzz(func(t *testing.T, h string) {
		sig, err := parseStripeSignature(h)
		if err == nil {
			if sig.timestamp == "" || len(sig.v1) == 0 {
				t.Fatalf("parseStripeSignature(%q): got %+v, want a timestamp and a v1", h, sig)
			}
			for _, b := range sig.v1 {
				if len(b) != sha256.Size {
					t.Fatalf("parseStripeSignature(%q): v1 of %d bytes, want %d", h, len(b), sha256.Size)
				}
			}
		}
		r := newRequest(map[string]string{"Stripe-Signature": h})
		err = v.Verify(r, []byte(stripeVectorBody))
		if err != nil && !errors.Is(err, ErrNoSignature) && !errors.Is(err, ErrBadSignature) && !errors.Is(err, ErrStale) {
			t.Fatalf("Verify(%q): got %v, want a sentinel", h, err)
		}
	})
}
