// Package providers knows how webhook providers identify and sign their
// deliveries: where a delivery's event ID lives (key sources) and how its
// signature is checked (verifiers).
//
// Providers are a closed set built by New from plain configuration; there is no
// registry.
package providers

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
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

// RetrySpan returns how long after its first attempt provider (one of the
// names above) may deliver an event again on its own, as its documentation
// states, and that statement; zero when its retries end within the gateway's
// default window of a day (Shopify, Slack), it does not retry by itself
// (GitHub) or the schedule is the sender's own (generic). A route's window
// shorter than the span forgets a processed key while the provider may
// still deliver it.
func RetrySpan(provider string) (time.Duration, string) {
	switch provider {
	case Stripe:
		return 72 * time.Hour, "Stripe retries for up to 3 days in live mode"
	case StandardWebhooks:
		// Svix: at once, then 5s, 5m, 30m, 2h, 5h, 10h and 10h later.
		return 27*time.Hour + 35*time.Minute + 5*time.Second, "Svix retries for up to 27h35m5s after the first attempt"
	}
	return 0, ""
}

// Sentinel errors returned by verifiers. The gateway answers all of them with 401.
var (
	ErrNoSignature  = errors.New("providers: no signature")
	ErrBadSignature = errors.New("providers: signature does not match")
	ErrStale        = errors.New("providers: timestamp outside tolerance")
)

// ErrNoKey is returned by KeyFunc when no source produced a non-empty value.
var ErrNoKey = errors.New("providers: no key in delivery")

// ErrAmbiguousKey is returned, wrapped with ErrNoKey, by a KeyFunc whose
// header: source found its header more than once with different values:
// the gateway and the application could read different keys.
var ErrAmbiguousKey = errors.New("providers: key header repeated with different values")

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
	// verify (rotation). An empty string is an error, never a skip. With
	// the generic ecdsa-sha256 algorithm they are the verification (public)
	// keys: base64 DER, or PEM.
	Secrets []string
	// Tolerance is the allowed clock difference for signed timestamps, both
	// past and future. Zero means 300s.
	Tolerance time.Duration
	// Signature configures the generic verifier. Ignored by the other
	// providers.
	Signature GenericSignature
	// Now is the clock used for timestamp tolerance. Nil means time.Now.
	Now func() time.Time
}

// GenericSignature configures the generic verifier: an HMAC, or an ECDSA
// signature, over a templated content.
type GenericSignature struct {
	// Header carries the signature. Empty means "X-Signature".
	Header string
	// Algorithm is sha1, sha256 or sha512 (an HMAC keyed with each secret),
	// or ecdsa-sha256: an ECDSA signature (ASN.1 DER) of the content's
	// SHA-256, checked with each secret read as a public key (SendGrid's
	// Signed Event Webhook). Empty means sha256.
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
	// SignatureField, when set, makes Header a list of key=value items
	// separated by Separator (Paddle's "ts=…;h1=…", Calendly's
	// "t=…,v1=…"): every item with this key is a signature, any of which
	// may match, and Prefix must be empty.
	SignatureField string
	// TimestampField, with SignatureField, names the item of Header that
	// holds the Unix timestamp: {timestamp} in Template, checked against
	// Tolerance. It excludes TimestampHeader.
	TimestampField string
	// Separator splits Header's items: "," or ";". Empty means ",".
	Separator string
	// TimestampFormat is how the timestamp (TimestampHeader's value or
	// TimestampField's item) is written: unix (seconds) or rfc3339
	// (Twitch's "2019-11-16T10:11:12.634234626Z", parsed strictly). Empty
	// means unix. Needs TimestampHeader or TimestampField.
	TimestampFormat string
}

// ECDSASHA256 is the generic algorithm that checks an ECDSA signature
// with public keys (see GenericSignature.Algorithm).
const ECDSASHA256 = "ecdsa-sha256"

// PublicKeys reports whether s checks signatures with public keys
// (Algorithm ECDSASHA256, in any case): a route's secrets are then
// verification keys.
func (s GenericSignature) PublicKeys() bool { return strings.EqualFold(s.Algorithm, ECDSASHA256) }

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

// New builds a route's Provider from plain configuration. It is the one place
// that knows the closed set of providers.
//
//   - An empty cfg.Provider means Generic; an unknown name is an error.
//   - Keys come from the provider's preset (see PresetKeys) unless cfg.Keys
//     is set; Generic has no preset and needs cfg.Keys.
//   - With no secrets, Verifier is nil. Any empty secret is an error, never a
//     skipped check (it is usually an unset environment variable).
//   - A zero Tolerance means DefaultTolerance; a negative one is an error. A
//     nil Now means time.Now.
//   - RequestID is never nil; it returns the provider's delivery ID header
//     (X-GitHub-Delivery, X-Shopify-Webhook-Id or Shopify-Webhook-Id,
//     webhook-id or svix-id) and ""
//     for providers that send none.
//
// Errors name the offending field as written in a route ("provider: …",
// "keys[1]: …", "secrets[0] is empty …", "signature.algorithm: …",
// "tolerance: …") and never contain a secret.
func New(cfg Config) (*Provider, error) {
	name := cfg.Provider
	if name == "" {
		name = Generic
	}
	if cfg.Tolerance < 0 {
		return nil, fmt.Errorf("tolerance: must not be negative, got %s", cfg.Tolerance)
	}
	c := clock{now: cfg.Now, tolerance: cfg.Tolerance}
	if c.now == nil {
		c.now = time.Now
	}
	if c.tolerance == 0 {
		c.tolerance = DefaultTolerance
	}
	for i, s := range cfg.Secrets {
		if s == "" {
			return nil, fmt.Errorf("secrets[%d] is empty (unset environment variable?)", i)
		}
	}
	hasSecrets := len(cfg.Secrets) > 0

	p := &Provider{Name: name, RequestID: noRequestID}
	var verifier Verifier
	switch name {
	case Stripe:
		if hasSecrets {
			verifier = &stripeVerifier{secrets: secretBytes(cfg.Secrets), clock: c}
		}
	case Shopify:
		p.RequestID = headerRequestID(shopifyWebhookIDHeader, shopifyWebhookIDHeaderNew)
		if hasSecrets {
			verifier = &shopifyVerifier{secrets: secretBytes(cfg.Secrets)}
		}
	case GitHub:
		p.RequestID = headerRequestID(githubDeliveryHeader)
		if hasSecrets {
			verifier = &githubVerifier{secrets: secretBytes(cfg.Secrets)}
		}
	case StandardWebhooks:
		p.RequestID = headerRequestID(webhookIDHeader, svixIDHeader)
		if hasSecrets {
			v, err := newStandardWebhooksVerifier(cfg.Secrets, c)
			if err != nil {
				return nil, err
			}
			verifier = v
		}
	case Slack:
		if hasSecrets {
			verifier = &slackVerifier{secrets: secretBytes(cfg.Secrets), clock: c}
		}
	case Generic:
		if len(cfg.Keys) == 0 {
			return nil, fmt.Errorf("keys: the generic provider needs a keys: list")
		}
		v, err := newGenericVerifier(cfg.Signature, cfg.Secrets, c)
		if err != nil {
			return nil, err
		}
		if hasSecrets {
			verifier = v
		}
	default:
		return nil, fmt.Errorf("provider: unknown provider %q (want stripe, shopify, github, standard-webhooks, slack or generic)", cfg.Provider)
	}
	key, err := ParseKeys(cfg.KeySources())
	if err != nil {
		return nil, err
	}
	p.Key = key
	p.Verifier = verifier
	return p, nil
}

// Validate reports whether New would accept cfg, with the same errors.
func (cfg Config) Validate() error {
	_, err := New(cfg)
	return err
}

// KeySources returns the key sources a route configured with cfg keys on:
// cfg.Keys, else its provider's preset (see PresetKeys).
func (cfg Config) KeySources() []string {
	if len(cfg.Keys) > 0 {
		return cfg.Keys
	}
	return PresetKeys(cfg.Provider)
}

// PresetKeys returns a copy of a provider's preset key sources, or nil for
// Generic and unknown names:
//
//   - stripe: json:id
//   - shopify: header:X-Shopify-Event-Id, header:Shopify-Event-Id, then
//     header:X-Shopify-Webhook-Id, header:Shopify-Webhook-Id (the event ID
//     in either spelling before the delivery ID in either spelling, so a
//     delivery mixing the two spellings is still keyed by its event)
//   - github: header:X-GitHub-Delivery
//   - standard-webhooks: header:webhook-id, then header:svix-id
//   - slack: json:event_id
func PresetKeys(provider string) []string {
	switch provider {
	case Stripe:
		return []string{"json:id"}
	case Shopify:
		return []string{
			"header:" + shopifyEventIDHeader, "header:" + shopifyEventIDHeaderNew,
			"header:" + shopifyWebhookIDHeader, "header:" + shopifyWebhookIDHeaderNew,
		}
	case GitHub:
		return []string{"header:" + githubDeliveryHeader}
	case StandardWebhooks:
		return []string{"header:" + webhookIDHeader, "header:" + svixIDHeader}
	case Slack:
		return []string{"json:event_id"}
	default:
		return nil
	}
}

func noRequestID(*http.Request) string { return "" }

// headerRequestID returns the first non-empty of the named headers.
func headerRequestID(names ...string) func(*http.Request) string {
	return func(r *http.Request) string {
		for _, n := range names {
			if v := r.Header.Get(n); v != "" {
				return v
			}
		}
		return ""
	}
}
