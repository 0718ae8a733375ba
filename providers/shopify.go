package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
)

// Shopify's headers.
const (
	shopifyHMACHeader      = "X-Shopify-Hmac-Sha256"
	shopifyWebhookIDHeader = "X-Shopify-Webhook-Id"
	shopifyEventIDHeader   = "X-Shopify-Event-Id"
)

// shopifyVerifier checks X-Shopify-Hmac-Sha256: the base64 HMAC-SHA256 of the
// raw body, keyed with the app's client secret. Shopify signs no timestamp and
// no ID header.
type shopifyVerifier struct {
	secrets [][]byte
}

var _ Verifier = (*shopifyVerifier)(nil)

// Verify implements Verifier.
func (v *shopifyVerifier) Verify(r *http.Request, body []byte) error {
	h := r.Header.Get(shopifyHMACHeader)
	if h == "" {
		return fmt.Errorf("%w: missing %s header", ErrNoSignature, shopifyHMACHeader)
	}
	got, err := base64.StdEncoding.DecodeString(h)
	if err != nil || len(got) != sha256.Size {
		return fmt.Errorf("%w: %s header is not a base64 SHA-256 HMAC", ErrBadSignature, shopifyHMACHeader)
	}
	for _, key := range v.secrets {
		if hmac.Equal(got, macOf(sha256.New, key, body)) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s does not match", ErrBadSignature, shopifyHMACHeader)
}
