package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
)

// Shopify's headers. Shopify also sends each without the "X-" prefix
// (Shopify-Hmac-Sha256, Shopify-Webhook-Id, Shopify-Event-Id); both
// spellings are accepted, the X- one first.
const (
	shopifyHMACHeader      = "X-Shopify-Hmac-Sha256"
	shopifyWebhookIDHeader = "X-Shopify-Webhook-Id"
	shopifyEventIDHeader   = "X-Shopify-Event-Id"

	shopifyHMACHeaderNew      = "Shopify-Hmac-Sha256"
	shopifyWebhookIDHeaderNew = "Shopify-Webhook-Id"
	shopifyEventIDHeaderNew   = "Shopify-Event-Id"
)

// shopifyVerifier checks X-Shopify-Hmac-Sha256 (or, when that header is
// absent or empty, Shopify-Hmac-Sha256): the base64 HMAC-SHA256 of the raw
// body, keyed with the app's client secret. Only the first non-empty of the
// two is checked. Shopify signs no timestamp and no ID header.
type shopifyVerifier struct {
	secrets [][]byte
}

var _ Verifier = (*shopifyVerifier)(nil)

// Verify implements Verifier.
func (v *shopifyVerifier) Verify(r *http.Request, body []byte) error {
	name, h, err := signedPair(r, shopifyHMACHeader, shopifyHMACHeaderNew)
	if err != nil {
		return err
	}
	if h == "" {
		return fmt.Errorf("%w: missing %s (or %s) header", ErrNoSignature, shopifyHMACHeader, shopifyHMACHeaderNew)
	}
	got, err := base64.StdEncoding.DecodeString(h)
	if err != nil || len(got) != sha256.Size {
		return fmt.Errorf("%w: %s header is not a base64 SHA-256 HMAC", ErrBadSignature, name)
	}
	for _, key := range v.secrets {
		if hmac.Equal(got, macOf(sha256.New, key, body)) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s does not match", ErrBadSignature, name)
}
