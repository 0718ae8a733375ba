package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"net/http"
	"strings"
	"time"
)

// DefaultTolerance is the signed-timestamp tolerance used when a route sets none.
const DefaultTolerance = 300 * time.Second

// maxTimestampDigits bounds a Unix timestamp header; more digits is malformed.
const maxTimestampDigits = 12

// clock checks signed timestamps against a tolerance, both ways.
type clock struct {
	now       func() time.Time
	tolerance time.Duration
}

// check returns an error wrapping ErrStale when ts (Unix seconds) is further
// than the tolerance from now, in the past or in the future.
func (c clock) check(ts int64) error {
	// Seconds, not Durations: a 12-digit timestamp would overflow nanoseconds.
	diff := c.now().Unix() - ts
	tol := int64(c.tolerance / time.Second)
	switch {
	case diff > tol:
		return fmt.Errorf("%w: timestamp is %ds old (tolerance %s)", ErrStale, diff, c.tolerance)
	case -diff > tol:
		return fmt.Errorf("%w: timestamp is %ds in the future (tolerance %s)", ErrStale, -diff, c.tolerance)
	}
	return nil
}

// signedHeader returns the value of header name that a signature check
// reads ("" when absent), and an error wrapping ErrBadSignature when the
// header is repeated with different values: the check would cover the
// first, while the application may read another (the last, or all of them
// joined), which nothing verified. Standard Webhooks' id and timestamp
// headers had this rule first.
func signedHeader(r *http.Request, name string) (string, error) {
	v, ok := HeaderValue(r.Header, name, nil)
	if !ok {
		return "", fmt.Errorf("%w: %s repeated with different values", ErrBadSignature, name)
	}
	return v, nil
}

// signedPair is signedHeader for a header a provider sends under two names
// (Shopify's X-Shopify-Hmac-Sha256 and Shopify-Hmac-Sha256, Standard
// Webhooks' webhook-* and svix-*): it returns the name present, a's when
// both are, and its value; an error wrapping ErrBadSignature when either is
// repeated with different values, or both are present and differ, since
// the check covers one and the application may read the other. Present
// means sent, even empty.
func signedPair(r *http.Request, a, b string) (name, value string, err error) {
	va, err := signedHeader(r, a)
	if err != nil {
		return "", "", err
	}
	vb, err := signedHeader(r, b)
	if err != nil {
		return "", "", err
	}
	hasA, hasB := len(r.Header.Values(a)) > 0, len(r.Header.Values(b)) > 0
	switch {
	case hasA && hasB && va != vb:
		return "", "", fmt.Errorf("%w: %s and %s differ", ErrBadSignature, a, b)
	case hasA || !hasB:
		return a, va, nil
	}
	return b, vb, nil
}

// parseUnix parses a Unix timestamp in seconds: 1 to 12 ASCII digits, nothing
// else, and no leading zero. The bound keeps the arithmetic in check far from
// overflow. Each timestamp has one form, as with RFC 3339 ones (see
// genericVerifier.parseTimestamp): a template that signs an ID and the
// timestamp with nothing between them ("{header:ID}{timestamp}") would
// otherwise let whoever captured a delivery move an ID's trailing zeros
// into the timestamp ("msg-880", "0…") under the same signature, a new key
// each time. No provider sends a leading zero.
func parseUnix(s string) (int64, bool) {
	if s == "" || len(s) > maxTimestampDigits || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// secretBytes returns the configured secrets as raw HMAC keys.
func secretBytes(secrets []string) [][]byte {
	keys := make([][]byte, len(secrets))
	for i, s := range secrets {
		keys[i] = []byte(s)
	}
	return keys
}

// macOf returns the HMAC of the concatenated parts under key.
func macOf(h func() hash.Hash, key []byte, parts ...[]byte) []byte {
	m := hmac.New(h, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// hexSHA256Header reads a "<prefix><hex HMAC-SHA256>" signature header (GitHub's
// "sha256=", Slack's "v0="): ErrNoSignature when it is missing,
// ErrBadSignature when the prefix, hex or length is wrong.
func hexSHA256Header(r *http.Request, header, prefix string) ([]byte, error) {
	h, err := signedHeader(r, header)
	if err != nil {
		return nil, err
	}
	if h == "" {
		return nil, fmt.Errorf("%w: missing %s header", ErrNoSignature, header)
	}
	hexSig, ok := strings.CutPrefix(h, prefix)
	if !ok {
		return nil, fmt.Errorf("%w: %s header lacks the %s prefix", ErrBadSignature, header, prefix)
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil || len(got) != sha256.Size {
		return nil, fmt.Errorf("%w: %s header is not a hex SHA-256 HMAC", ErrBadSignature, header)
	}
	return got, nil
}
