package providers

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
)

// Standard Webhooks header names; Svix sends the same headers with a "svix-"
// prefix instead of "webhook-".
const (
	webhookIDHeader        = "webhook-id"
	webhookTimestampHeader = "webhook-timestamp"
	webhookSignatureHeader = "webhook-signature"
	svixIDHeader           = "svix-id"
	svixTimestampHeader    = "svix-timestamp"
	svixSignatureHeader    = "svix-signature"
)

// Standard Webhooks secret prefixes.
const (
	whsecPrefix = "whsec_" // symmetric: base64 HMAC key
	whpkPrefix  = "whpk_"  // asymmetric: base64 Ed25519 public key
)

// maxV1aSignatures bounds the v1a entries of one webhook-signature header
// that are checked: a sender signs once per key it holds (two during a
// rotation), and each Ed25519 check costs tens of microseconds, so a forged
// header of some 700 entries (64 KiB) would cost tens of milliseconds of CPU
// per whpk_ key. Later v1a entries are ignored; v1 (HMAC) entries, checked
// with one MAC per key, are not bounded.
const maxV1aSignatures = 4

// standardWebhooksVerifier checks Standard Webhooks (and Svix) signatures.
// The signed content is "{id}.{timestamp}.{raw body}". The signature header is
// a space-separated list of "v1,<base64 HMAC-SHA256>" (for whsec_ secrets) and
// "v1a,<base64 Ed25519 signature>" (for whpk_ public keys); any match passes and
// unknown versions are ignored, as are v1a entries after the first
// maxV1aSignatures. The timestamp is checked before the signatures.
type standardWebhooksVerifier struct {
	hmacKeys   [][]byte
	publicKeys []ed25519.PublicKey
	clock      clock
}

var _ Verifier = (*standardWebhooksVerifier)(nil)

// newStandardWebhooksVerifier decodes the secrets: "whsec_<base64>" or bare
// base64 is an HMAC key, "whpk_<base64>" an Ed25519 public key. The error
// names the secret by index, never by value.
func newStandardWebhooksVerifier(secrets []string, c clock) (*standardWebhooksVerifier, error) {
	v := &standardWebhooksVerifier{clock: c}
	for i, s := range secrets {
		if rest, ok := strings.CutPrefix(s, whpkPrefix); ok {
			k, err := base64.StdEncoding.DecodeString(rest)
			if err != nil || len(k) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("secrets[%d]: a whpk_ secret must be a base64 Ed25519 public key", i)
			}
			v.publicKeys = append(v.publicKeys, ed25519.PublicKey(k))
			continue
		}
		k, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, whsecPrefix))
		if err != nil || len(k) == 0 {
			return nil, fmt.Errorf("secrets[%d]: a standard-webhooks secret must be whsec_ followed by base64", i)
		}
		v.hmacKeys = append(v.hmacKeys, k)
	}
	return v, nil
}

// webhookSignature is one entry of a webhook-signature list.
type webhookSignature struct {
	version string // "v1" or "v1a"
	sig     []byte
}

// parseWebhookSignatures parses a space-separated "version,base64" list,
// keeping the v1 and v1a entries whose base64 decodes, v1a entries only
// when they are Ed25519 signatures in size and only the first
// maxV1aSignatures of those; the rest is ignored.
func parseWebhookSignatures(h string) []webhookSignature {
	var out []webhookSignature
	v1a := 0
	for item := range strings.FieldsSeq(h) {
		version, b64, ok := strings.Cut(item, ",")
		if !ok || (version != "v1" && version != "v1a") || (version == "v1a" && v1a == maxV1aSignatures) {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			continue
		}
		if version == "v1a" {
			if len(sig) != ed25519.SignatureSize {
				continue
			}
			v1a++
		}
		out = append(out, webhookSignature{version: version, sig: sig})
	}
	return out
}

// Verify implements Verifier.
func (v *standardWebhooksVerifier) Verify(r *http.Request, body []byte) error {
	// Svix sends its svix-* headers, perhaps the webhook-* ones as well,
	// with the same values; the set whose signature header is present is
	// checked, and the other must not say anything else.
	sigH, h, err := signedPair(r, webhookSignatureHeader, svixSignatureHeader)
	if err != nil {
		return err
	}
	idH, tsH := webhookIDHeader, webhookTimestampHeader
	if sigH == svixSignatureHeader {
		idH, tsH = svixIDHeader, svixTimestampHeader
	}
	if _, _, err := signedPair(r, webhookTimestampHeader, svixTimestampHeader); err != nil {
		return err
	}
	if h == "" {
		return fmt.Errorf("%w: missing %s header", ErrNoSignature, sigH)
	}
	id := r.Header.Get(idH)
	if id == "" {
		return fmt.Errorf("%w: missing %s header", ErrBadSignature, idH)
	}
	// The signature covers the first id; a second one is what the key (or
	// the application) might read instead: a captured delivery could be
	// replayed under it.
	// (The timestamps were checked with the signature headers.)
	for _, name := range []string{webhookIDHeader, svixIDHeader} {
		if _, err := signedHeader(r, name); err != nil {
			return err
		}
	}
	// The preset keys by webhook-id, then svix-id: whichever the signature
	// covers, the other must not name another message, or a captured Svix
	// delivery could be replayed under a fresh, unsigned webhook-id.
	if w, s := r.Header.Get(webhookIDHeader), r.Header.Get(svixIDHeader); w != "" && s != "" && w != s {
		return fmt.Errorf("%w: %s and %s differ", ErrBadSignature, webhookIDHeader, svixIDHeader)
	}
	tsText := r.Header.Get(tsH)
	ts, ok := parseUnix(tsText)
	if !ok {
		return fmt.Errorf("%w: missing or malformed %s header", ErrBadSignature, tsH)
	}
	// Before any signature is checked: a stale delivery costs no Ed25519
	// check (the answer is 401 either way).
	if err := v.clock.check(ts); err != nil {
		return err
	}
	sigs := parseWebhookSignatures(h)
	if len(sigs) == 0 {
		return fmt.Errorf("%w: no v1 or v1a entry in %s", ErrBadSignature, sigH)
	}
	content := make([]byte, 0, len(id)+len(tsText)+2+len(body))
	content = append(append(append(append(append(content, id...), '.'), tsText...), '.'), body...)
	for _, key := range v.hmacKeys {
		want := macOf(sha256.New, key, content)
		for _, s := range sigs {
			if s.version == "v1" && hmac.Equal(s.sig, want) {
				return nil
			}
		}
	}
	for _, pub := range v.publicKeys {
		for _, s := range sigs {
			if s.version == "v1a" && ed25519.Verify(pub, content, s.sig) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: no entry in %s matches", ErrBadSignature, sigH)
}
