package providers

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// The Standard Webhooks / Svix reference-library vector.
const (
	swSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	swID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	swTS     = 1614265330
	swBody   = `{"test": 2432232314}`
	swSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

// swSign signs content with a whsec_ secret the way Standard Webhooks does.
func swSign(secret, id string, ts int64, body string) string {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		panic(err)
	}
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%s.%d.%s", id, ts, body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// swEd25519 returns a new Ed25519 key as a whpk_ secret, and the v1a entry
// it signs swID, swTS and swBody with.
func swEd25519(t *testing.T) (whpk, v1a string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatalf("GenerateKey: %v", err)
	}
	return "whpk_" + base64.StdEncoding.EncodeToString(pub),
		"v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, []byte(fmt.Sprintf("%s.%d.%s", swID, swTS, swBody))))
}

func TestStandardWebhooksVerify(t *testing.T) {
	whpk, v1a := swEd25519(t)
	otherWhpk, _ := swEd25519(t)
	bareSecret := strings.TrimPrefix(swSecret, "whsec_")
	ts := fmt.Sprint(swTS)

	type hdrs struct{ prefix, id, ts, sig string } // "-" means absent
	std := func(sig string) hdrs { return hdrs{"webhook-", swID, ts, sig} }
	tests := []struct {
		name    string
		secrets []string
		now     int64
		h       hdrs
		body    string
		want    error
	}{
		{"reference vector", []string{swSecret}, swTS, std(swSig), swBody, nil},
		{"svix- headers", []string{swSecret}, swTS, hdrs{"svix-", swID, ts, swSig}, swBody, nil},
		{"bare base64 secret", []string{bareSecret}, swTS, std(swSig), swBody, nil},
		{"rotation", []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("old-key")), swSecret}, swTS, std(swSig), swBody, nil},
		{"one of several entries", []string{swSecret}, swTS, std("v1,AAAA v2,zzz " + swSig + " v1,bm90IGEgc2ln"), swBody, nil},
		{"extra spaces", []string{swSecret}, swTS, std("  " + swSig + "  "), swBody, nil},
		{"within tolerance past", []string{swSecret}, swTS + 300, std(swSig), swBody, nil},
		{"within tolerance future", []string{swSecret}, swTS - 300, std(swSig), swBody, nil},
		{"stale", []string{swSecret}, swTS + 301, std(swSig), swBody, ErrStale},
		{"future", []string{swSecret}, swTS - 301, std(swSig), swBody, ErrStale},
		{"wrong secret", []string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("nope"))}, swTS, std(swSig), swBody, ErrBadSignature},
		{"tampered body", []string{swSecret}, swTS, std(swSig), `{"test": 2432232315}`, ErrBadSignature},
		{"id changed", []string{swSecret}, swTS, hdrs{"webhook-", "msg_other", ts, swSig}, swBody, ErrBadSignature},
		{"timestamp changed", []string{swSecret}, swTS, hdrs{"webhook-", swID, "1614265331", swSig}, swBody, ErrBadSignature},
		{"missing signature", []string{swSecret}, swTS, std("-"), swBody, ErrNoSignature},
		{"missing id", []string{swSecret}, swTS, hdrs{"webhook-", "-", ts, swSig}, swBody, ErrBadSignature},
		{"missing timestamp", []string{swSecret}, swTS, hdrs{"webhook-", swID, "-", swSig}, swBody, ErrBadSignature},
		{"malformed timestamp", []string{swSecret}, swTS, hdrs{"webhook-", swID, "16142653.30", swSig}, swBody, ErrBadSignature},
		{"no version", []string{swSecret}, swTS, std(strings.TrimPrefix(swSig, "v1,")), swBody, ErrBadSignature},
		{"unknown version only", []string{swSecret}, swTS, std("v2," + strings.TrimPrefix(swSig, "v1,")), swBody, ErrBadSignature},
		{"v1a with whpk", []string{whpk}, swTS, std(v1a), swBody, nil},
		{"v1a and v1, whpk with whsec rotation", []string{swSecret, whpk}, swTS, std(swSig + " " + v1a), swBody, nil},
		{"v1a stale", []string{whpk}, swTS + 301, std(v1a), swBody, ErrStale},
		{"v1a wrong key", []string{otherWhpk}, swTS, std(v1a), swBody, ErrBadSignature},
		{"v1a tampered", []string{whpk}, swTS, std(v1a), swBody + " ", ErrBadSignature},
		{"v1a sent as v1", []string{whpk}, swTS, std("v1," + strings.TrimPrefix(v1a, "v1a,")), swBody, ErrBadSignature},
		{"v1 with only whpk", []string{whpk}, swTS, std(swSig), swBody, ErrBadSignature},
		{"fresh signature", []string{swSecret}, 5000, hdrs{"webhook-", "msg_1", "5000", swSign(swSecret, "msg_1", 5000, "{}")}, "{}", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Provider: StandardWebhooks, Secrets: tt.secrets, Now: fixedClock(tt.now)})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			h := map[string]string{}
			for name, v := range map[string]string{"id": tt.h.id, "timestamp": tt.h.ts, "signature": tt.h.sig} {
				if v != "-" {
					h[tt.h.prefix+name] = v
				}
			}
			err = p.Verifier.Verify(newRequest(h), []byte(tt.body))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
		})
	}
}

// TestStandardWebhooksIDsAgree: a delivery signed under svix-id is keyed by
// webhook-id when that header is present, so the two must name one message.
func TestStandardWebhooksIDsAgree(t *testing.T) {
	ts := fmt.Sprint(swTS)
	tests := []struct {
		name    string
		headers map[string]string
		want    error
	}{
		{"svix signed, same webhook-id", map[string]string{"svix-id": swID, "svix-timestamp": ts, "svix-signature": swSig, "webhook-id": swID}, nil},
		{"svix signed, other webhook-id", map[string]string{"svix-id": swID, "svix-timestamp": ts, "svix-signature": swSig, "webhook-id": "replay-1"}, ErrBadSignature},
		{"webhook signed, other svix-id", map[string]string{"webhook-id": swID, "webhook-timestamp": ts, "webhook-signature": swSig, "svix-id": "replay-1"}, ErrBadSignature},
		{"both families, same ids", map[string]string{"webhook-id": swID, "webhook-timestamp": ts, "webhook-signature": swSig, "svix-id": swID, "svix-timestamp": ts, "svix-signature": swSig}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Provider: StandardWebhooks, Secrets: []string{swSecret}, Now: fixedClock(swTS)})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			r := newRequest(tt.headers)
			err = p.Verifier.Verify(r, []byte(swBody))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Verify: got %v, want %v", err, tt.want)
			}
			if err != nil {
				return
			}
			if key, err := p.Key(r, []byte(swBody)); err != nil || key != swID {
				t.Errorf("Key: got %q, %v, want the signed id %q", key, err, swID)
			}
		})
	}
}

// TestStandardWebhooksRepeatedHeaders: a signed delivery with a second,
// different webhook-id (or svix-id, or timestamp) is refused: the signature
// covers the first, and the key or the application might read the other,
// so a captured delivery could be replayed under it. The same value twice
// is harmless.
func TestStandardWebhooksRepeatedHeaders(t *testing.T) {
	ts := fmt.Sprint(swTS)
	tests := []struct {
		name  string
		extra [2]string // a header added after the signed ones
		want  error
	}{
		{"a second webhook-id", [2]string{"webhook-id", "replay-1"}, ErrBadSignature},
		{"a second svix-id", [2]string{"svix-id", "replay-1"}, ErrBadSignature},
		{"a second timestamp", [2]string{"webhook-timestamp", "1614265331"}, ErrBadSignature},
		{"the same webhook-id twice", [2]string{"webhook-id", swID}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Provider: StandardWebhooks, Secrets: []string{swSecret}, Now: fixedClock(swTS)})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			r := newRequest(map[string]string{"webhook-id": swID, "webhook-timestamp": ts, "webhook-signature": swSig})
			if tt.extra[0] == "svix-id" {
				r.Header.Add("svix-id", swID) // agrees with webhook-id: only the repeat differs
			}
			r.Header.Add(tt.extra[0], tt.extra[1])
			if err := p.Verifier.Verify(r, []byte(swBody)); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
		})
	}
}

// FuzzWebhookSignatures checks that the webhook-signature list parser never
// panics, keeps only v1/v1a entries, and that Verify only returns sentinels.
func FuzzWebhookSignatures(f *testing.F) {
	for _, s := range []string{swSig, "v1,AAAA v1a,BBBB", "v1, ", ",,, ", "v1a,=== v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=", "\tv1,x\n"} {
		f.Add(s)
	}
	v, err := newStandardWebhooksVerifier([]string{swSecret}, clock{now: fixedClock(swTS), tolerance: DefaultTolerance})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, h string) {
		for _, s := range parseWebhookSignatures(h) {
			if s.version != "v1" && s.version != "v1a" {
				t.Fatalf("parseWebhookSignatures(%q): kept version %q", h, s.version)
			}
		}
		r := newRequest(map[string]string{"webhook-id": swID, "webhook-timestamp": fmt.Sprint(swTS), "webhook-signature": h})
		err := v.Verify(r, []byte(swBody))
		if err != nil && !errors.Is(err, ErrNoSignature) && !errors.Is(err, ErrBadSignature) && !errors.Is(err, ErrStale) {
			t.Fatalf("Verify(%q): got %v, want a sentinel", h, err)
		}
	})
}

// TestStandardWebhooksBoundsEd25519Work: an Ed25519 check costs tens of
// microseconds, and a 64 KiB header holds some 700 v1a entries, so a
// forged delivery could cost the gateway tens of milliseconds of CPU for
// each whpk_ key. A stale timestamp is refused before any signature is
// checked, and only the first maxV1aSignatures v1a entries are tried (a
// sender signs once per key it holds).
func TestStandardWebhooksBoundsEd25519Work(t *testing.T) {
	whpk, good := swEd25519(t)
	junk := func(n int) string {
		return strings.TrimSpace(strings.Repeat("v1a,"+base64.StdEncoding.EncodeToString(make([]byte, ed25519.SignatureSize))+" ", n))
	}
	tests := []struct {
		name string
		now  int64
		sig  string
		want error
	}{
		{"genuine after fewer junk entries than the bound", swTS, junk(maxV1aSignatures-1) + " " + good, nil},
		{"genuine after as many junk entries as the bound", swTS, junk(maxV1aSignatures) + " " + good, ErrBadSignature},
		{"v1a entries of another size do not count toward the bound", swTS, strings.Repeat("v1a,AAAA ", maxV1aSignatures) + good, nil},
		{"v1 entries do not count toward the bound", swTS, strings.Repeat("v1,AAAA ", 50) + good, nil},
		{"stale with a full header of junk", swTS + 301, junk(600), ErrStale},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Provider: StandardWebhooks, Secrets: []string{whpk}, Now: fixedClock(tt.now)})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			r := newRequest(map[string]string{"webhook-id": swID, "webhook-timestamp": fmt.Sprint(swTS), "webhook-signature": tt.sig})
			if err := p.Verifier.Verify(r, []byte(swBody)); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
		})
	}
}
