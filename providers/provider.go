// Package providers knows how webhook providers identify and sign their
// deliveries: where a delivery's event ID lives (key sources) and how its
// signature is checked (verifiers).
//
// Providers are a closed set built by New from plain configuration; there is no
// registry.
package providers

import (
	"errors"
	"net/http"
	"time"
)

// Names of the supported providers, as written in a route's provider: key.
const (
	Stripe           = "stripe"
	Shopify          = "shopify"
	GitHub           = "github"
	StandardWebhooks = "standard-webhooks"
	Slack            = "slack"
	Generic          = "generic"
)

// Sentinel errors returned by verifiers. The gateway answers all of them with 401.
var (
	ErrNoSignature  = errors.New("providers: no signature")
	ErrBadSignature = errors.New("providers: signature does not match")
	ErrStale        = errors.New("providers: timestamp outside tolerance")
)

// ErrNoKey is returned by KeyFunc when no source produced a non-empty value.
var ErrNoKey = errors.New("providers: no key in delivery")

// Verifier checks a delivery's signature over the raw body.
type Verifier interface {
	// Verify returns nil when the delivery is signed by one of the configured
	// secrets and its timestamp (if any) is within tolerance; otherwise an error
	// wrapping ErrNoSignature, ErrBadSignature or ErrStale.
	Verify(r *http.Request, body []byte) error
}

// Config is the plain-data description of a route's provider.
type Config struct {
	// Provider is one of the names above. Empty means Generic.
	Provider string
	// Keys overrides the preset's ordered key sources ("header:NAME",
	// "json:PATH", "query:NAME", "body"). Required for Generic.
	Keys []string
	// Secrets enables signature verification when non-empty; any one may
	// verify (rotation). An empty string is an error, never a skip.
	Secrets []string
	// Tolerance is the allowed clock difference for signed timestamps, both
	// past and future. Zero means 300s.
	Tolerance time.Duration
	// Signature configures the generic HMAC verifier. Ignored by the other
	// providers.
	Signature GenericSignature
	// Now is the clock used for timestamp tolerance. Nil means time.Now.
	Now func() time.Time
}

// GenericSignature configures the generic HMAC verifier.
type GenericSignature struct {
	// Header carries the signature. Empty means "X-Signature".
	Header string
	// Algorithm is sha1, sha256 or sha512. Empty means sha256.
	Algorithm string
	// Encoding is hex or base64. Empty means hex.
	Encoding string
	// Prefix is stripped from the header value before decoding ("sha256=").
	Prefix string
	// TimestampHeader, when set, carries a Unix timestamp checked against
	// Tolerance and available to Template as {timestamp}.
	TimestampHeader string
	// Template is the signed content; {body}, {timestamp} and {header:NAME}
	// are substituted. Empty means "{body}".
	Template string
}

// Provider is a route's ready-to-use key extraction and verification.
type Provider struct {
	// Name is the provider name.
	Name string
	// Key extracts the delivery's key.
	Key KeyFunc
	// Verifier is nil when the route has no secrets.
	Verifier Verifier
	// RequestID returns the provider's delivery ID for logs (may be empty).
	RequestID func(r *http.Request) string
}

// KeyFunc returns the first non-empty key from a route's sources, or ErrNoKey.
type KeyFunc func(r *http.Request, body []byte) (string, error)
