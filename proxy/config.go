package proxy

import (
	"time"

	"github.com/dedupgw/dedupgw/providers"
)

// Policy values accepted by Route's policy fields.
const (
	Forward = "forward" // on_missing_key, on_store_error, on_other_method
	Reject  = "reject"  // on_missing_key, on_store_error, on_in_flight, on_fingerprint_mismatch, on_other_method
	Wait    = "wait"    // on_in_flight
	Ack     = "ack"     // duplicate_response, on_fingerprint_mismatch
	Replay  = "replay"  // duplicate_response
)

// MinClientIdentitySecret is the shortest Route.ClientIdentitySecret New
// accepts, in bytes.
const MinClientIdentitySecret = 16

// Config is the plain-data configuration of a Gateway. The command line builds
// it from the YAML file; tests build it directly.
type Config struct {
	// Routes are matched in order of specificity: an exact path beats a
	// prefix, and a longer prefix beats a shorter one.
	Routes []Route
}

// Route is one webhook endpoint. Every field is already defaulted by the
// caller (the config loader applies the file's defaults: block); New fills in
// the remaining zero values as documented.
type Route struct {
	// Name is unique among routes and used as a metric label.
	Name string
	// Path is an exact path ("/webhooks/stripe") or a prefix ending in "/*".
	Path string
	// Upstream is the application's base URL (scheme://host[:port][/path]).
	Upstream string
	// Namespace scopes keys in the store. Empty means Name. It must not
	// contain ':', which separates namespace and key.
	Namespace string
	// Methods accepted on the route. Empty means POST only; others get 405,
	// or pass through (OnOtherMethod).
	Methods []string
	// OnOtherMethod is what a request whose method is not in Methods gets:
	// Reject (default: 405 with Allow) or Forward: forwarded unchanged and
	// not deduplicated (no key, no claim, Dedup-Status unkeyed), as the GET,
	// DELETE and CORS preflight requests an API serves beside its POSTs.
	// Such a request is not a delivery: dedupgw_deliveries_total does not
	// count it, and its log line is at debug level. A method of Methods in
	// another case ("post") still gets 405: an application that upper-cases
	// the method would take it for one whose key was never claimed. On a
	// route with secrets, Forward passes only a GET or HEAD without a body
	// (Meta's subscription check, GET ?hub.challenge=…), unverified, since
	// no provider signs one; any other request of another method gets 405,
	// so no body reaches the application unverified. The GET's query and
	// headers do: the application must answer such a GET only as the
	// subscription check, never act on it.
	OnOtherMethod string
	// PreserveHost sends the sender's Host header to the upstream. False
	// (the default) sends the upstream URL's host, as
	// httputil.ProxyRequest.SetURL does; the sender's stays in
	// X-Forwarded-Host either way. An application that checks Host against
	// its own names (Django's ALLOWED_HOSTS, Rails' config.hosts) or builds
	// URLs from it wants it preserved; an upstream reached through a
	// virtual-hosted load balancer or ingress wants its own.
	PreserveHost bool
	// StripPath removes the route's own path from the request's before it
	// is appended to the upstream URL's: all of it on an exact route, the
	// prefix (without its trailing "/") on a "/prefix/*" route. So
	// /webhooks/stripe with upstream http://billing:3000/stripe/webhook
	// reaches /stripe/webhook, and /billing/x under "/billing/*" reaches
	// /x. False (the default) appends the whole request path.
	StripPath bool

	// Window is how long a processed key is remembered. Zero means 24h.
	Window time.Duration
	// FailedRetention is how long a failed key's record (its receipt, and on
	// fingerprinting routes its binding to the first payload) is kept; the
	// key is claimable throughout. Zero means Window.
	FailedRetention time.Duration
	// Lease is how long an in-flight claim holds its key. Zero means 60s.
	// It must be longer than UpstreamTimeout.
	Lease time.Duration
	// UpstreamTimeout bounds one forward, from sending the request to the end
	// of the response body. Zero means 30s. A forward of a claimed key is
	// also cut when its claim's lease, minus the time kept to commit (the
	// store timeout, at most half of Lease - UpstreamTimeout), runs out: it
	// is then answered 504 and the key released, like a timeout.
	UpstreamTimeout time.Duration
	// MaxBodyBytes bounds the request body (413 beyond). Zero means 1 MiB.
	MaxBodyBytes int64

	// OnMissingKey is Forward (default) or Reject (400).
	OnMissingKey string
	// OnStoreError is Forward (default, fail open) or Reject (503).
	OnStoreError string
	// OnInFlight is Reject (default, 409) or Wait.
	OnInFlight string
	// DuplicateResponse is Ack (default, a small JSON 200) or Replay (the
	// stored upstream response).
	DuplicateResponse string

	// OnFingerprintMismatch is Ack (default) or Reject: what a delivery gets
	// when its key was first used for a different request. Only Reject
	// routes fingerprint requests (Ack routes compute and store none, and
	// answer a reused key like any duplicate). The fingerprint is the
	// SHA-256 of the method, the path and the payload: the body's canonical
	// JSON (object keys sorted, insignificant white space removed) without
	// the top-level fields in FingerprintExclude, or the raw body when it is
	// not JSON. The query string and headers are not part of it. A mismatch
	// is answered 422, for a processed, in-flight or failed key alike, and
	// nothing is forwarded or recorded.
	OnFingerprintMismatch string
	// FingerprintExclude lists top-level JSON fields left out of the
	// fingerprint (timestamps).
	FingerprintExclude []string
	// MaxReplayBytes bounds a stored response body. Zero means 64 KiB.
	MaxReplayBytes int64
	// ReplayHeaders are the response headers stored for replay. Nil means
	// [Content-Type].
	ReplayHeaders []string
	// ClientIdentity, when set, names a request header (Authorization, an API
	// key header) that scopes keys per client, so two clients using the same
	// key never collide. The stored key (what /v1/keys addresses, and what
	// Dedup-Key carries after the namespace) is "<scope>:<key>", where scope
	// is the first 32 hex digits of the SHA-256 of the header's first value
	// (of its HMAC-SHA256 with ClientIdentitySecret when that is set); the
	// header's value itself is never stored. A delivery without the header
	// (or with it empty) counts as having no key: on_missing_key decides
	// (reject: 400; forward: forwarded unkeyed). Empty means keys are not
	// scoped.
	ClientIdentity string
	// ClientIdentitySecret, when set, keys the client scope: it is the first
	// 32 hex digits of HMAC-SHA256(ClientIdentitySecret, header's value), so
	// a stored key, which the application sees in Dedup-Key and the admin
	// API shows, says nothing about the credential (an unsalted SHA-256 of
	// a weak HTTP Basic password can be cracked offline). It needs
	// ClientIdentity and at least MinClientIdentitySecret bytes. Changing it
	// re-scopes every key: keys recorded under the old one are no longer
	// found. Empty means the plain SHA-256.
	ClientIdentitySecret string

	// Provider configures key extraction and signature verification.
	Provider providers.Config
}
