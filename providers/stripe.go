package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
)

// stripeSignatureHeader carries Stripe's signature.
const stripeSignatureHeader = "Stripe-Signature"

// stripeVerifier checks Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>][,v0=…]:
// a hex HMAC-SHA256 of "{t}.{raw body}" keyed with the secret as written
// (whsec_ included, not decoded). Any v1 entry may match; v0 and unknown
// schemes are ignored.
type stripeVerifier struct {
	secrets [][]byte
	clock   clock
}

var _ Verifier = (*stripeVerifier)(nil)

// stripeSignature is a parsed Stripe-Signature header.
type stripeSignature struct {
	timestamp string // as written, digits only
	unix      int64
	v1        [][]byte
}

// parseStripeSignature parses a Stripe-Signature value. It requires exactly
// one valid t= entry and at least one v1= entry; v1 values that are not hex
// are skipped (they could never match), as stripe-go does.
func parseStripeSignature(h string) (stripeSignature, error) {
	var sig stripeSignature
	seenT, seenV1 := false, false
	for item := range strings.SplitSeq(h, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			ts, ok := parseUnix(v)
			if !ok || seenT {
				return stripeSignature{}, fmt.Errorf("malformed timestamp")
			}
			seenT = true
			sig.timestamp, sig.unix = v, ts
		case "v1":
			seenV1 = true
			if b, err := hex.DecodeString(v); err == nil && len(b) == sha256.Size {
				sig.v1 = append(sig.v1, b)
			}
		}
	}
	if !seenT {
		return stripeSignature{}, fmt.Errorf("no timestamp")
	}
	if len(sig.v1) == 0 && seenV1 {
		return stripeSignature{}, fmt.Errorf("no v1 signature is %d hex digits", 2*sha256.Size)
	}
	if len(sig.v1) == 0 {
		return stripeSignature{}, fmt.Errorf("no v1 signature")
	}
	return sig, nil
}

// Verify implements Verifier.
func (v *stripeVerifier) Verify(r *http.Request, body []byte) error {
	h, err := signedHeader(r, stripeSignatureHeader)
	if err != nil {
		return err
	}
	if h == "" {
		return fmt.Errorf("%w: missing %s header", ErrNoSignature, stripeSignatureHeader)
	}
	sig, err := parseStripeSignature(h)
	if err != nil {
		return fmt.Errorf("%w: %s header: %w", ErrBadSignature, stripeSignatureHeader, err)
	}
	for _, key := range v.secrets {
		want := macOf(sha256.New, key, []byte(sig.timestamp), []byte("."), body)
		for _, got := range sig.v1 {
			if hmac.Equal(got, want) {
				return v.clock.check(sig.unix)
			}
		}
	}
	return fmt.Errorf("%w: no v1 signature in %s matches", ErrBadSignature, stripeSignatureHeader)
}
