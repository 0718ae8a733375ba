package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"net/http"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/providers"
)

// This file holds the API idempotency parts of a delivery (issue 9): the
// request fingerprint and the per-client key scope.

// clientScopeLen is how many hex digits of the client identity's SHA-256
// prefix a scoped key (128 bits).
const clientScopeLen = 32

// fingerprints reports whether rt fingerprints its requests: only routes
// that act on a mismatch (on_fingerprint_mismatch: reject) pay for it.
func (rt *route) fingerprints() bool { return rt.OnFingerprintMismatch == Reject }

// fingerprint returns the hex SHA-256 that binds an idempotency key to one
// request: the method, the path and the payload. The payload is the body's
// canonical JSON without the top-level fields in exclude (so key order,
// spacing and excluded timestamps do not matter), or the raw body when it is
// not JSON. The query string and headers are not part of it. The draft
// (draft-ietf-httpapi-idempotency-key-header) fingerprints the payload; the
// method and path are added so a key reused on another endpoint of a prefix
// route or a shared namespace counts as a different request.
func fingerprint(method, path string, body []byte, exclude []string) string {
	payload, err := providers.CanonicalWithout(body, exclude)
	if err != nil {
		payload = body
	}
	h := sha256.New()
	writeField(h, method)
	writeField(h, path)
	h.Write(payload)
	return hex.EncodeToString(h.Sum(nil))
}

// writeField writes s to h followed by a newline, a byte neither a method nor
// a request path can hold, so fields cannot run into each other.
func writeField(h hash.Hash, s string) {
	h.Write([]byte(s))
	h.Write([]byte{'\n'})
}

// claimOptions are the options d's key is claimed with. On a fingerprinting
// route they bind the key to d's fingerprint, so the store answers Conflict
// for a key first used by another request (a record without a fingerprint,
// written before the route fingerprinted, never conflicts); their Conflicts
// judges a record read otherwise the same way.
func (d *delivery) claimOptions(bodySHA string) dedup.ClaimOptions {
	return dedup.ClaimOptions{Lease: d.rt.Lease, BodySHA256: bodySHA, Fingerprint: d.fingerprint, BindFingerprint: d.fingerprint != ""}
}

// clientScope returns the prefix that scopes a key to the client identified
// by r's header: the first clientScopeLen hex digits of the SHA-256 of the
// header's value. It reports false when the header is absent or empty, and
// ambiguous when it is repeated with different values (which one identifies
// the client depends on who reads it, as for a key header). The scoped key
// is scope + ":" + the client's key.
func clientScope(r *http.Request, header string) (scope string, ok, ambiguous bool) {
	if r.Header.Get(header) == "" {
		return "", false, false
	}
	v, single := providers.HeaderValue(r.Header, header, nil)
	if !single {
		return "", false, true
	}
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:])[:clientScopeLen], true, false
}
