package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"net/http"
	"sync"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/providers"
)

// This file holds the API idempotency parts of a delivery (issue 9): the
// request fingerprint and the per-client key scope.

// clientScopeLen is how many hex digits of the client identity's SHA-256
// (or HMAC-SHA256) prefix a scoped key (128 bits).
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
// by r's header rt.ClientIdentity: the first clientScopeLen hex digits of the
// SHA-256 of the header's value, or of its HMAC-SHA256 with the route's
// client_identity_secret when it has one. It reports false when the header
// is absent or empty, and ambiguous when it is repeated with different
// values (which one identifies the client depends on who reads it, as for a
// key header). The scoped key is scope + ":" + the client's key.
func (rt *route) clientScope(r *http.Request) (scope string, ok, ambiguous bool) {
	if r.Header.Get(rt.ClientIdentity) == "" {
		return "", false, false
	}
	v, single := providers.HeaderValue(r.Header, rt.ClientIdentity, nil)
	if !single {
		return "", false, true
	}
	if rt.scopeMAC != nil {
		return rt.scopeMAC.scope(v), true, false
	}
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:clientScopeLen/2]), true, false
}

// scopeMAC computes the client scopes of a route with a
// client_identity_secret. It is safe for concurrent use.
//
// Each delivery takes a keyed HMAC-SHA256 from a pool instead of calling
// hmac.New: after its first Reset an HMAC restores its key's padded inner
// and outer states rather than hashing them again, and the pooled state
// carries the buffers that a Write and a Sum through an interface would
// otherwise allocate. A scope then costs what the plain SHA-256 one does:
// one allocation, its hex string.
type scopeMAC struct {
	pool sync.Pool // of *scopeState
}

// scopeState is one pooled HMAC with its buffers.
type scopeState struct {
	mac hash.Hash
	in  [128]byte // the header's value goes through it, a chunk at a time
	sum [sha256.Size]byte
}

// newScopeMAC returns the scopeMAC for secret, its pool holding one state
// ready to use.
func newScopeMAC(secret string) *scopeMAC {
	key := []byte(secret)
	m := &scopeMAC{}
	m.pool.New = func() any {
		s := &scopeState{mac: hmac.New(sha256.New, key)}
		s.mac.Reset() // saves the padded key's states for every later Reset
		return s
	}
	m.pool.Put(m.pool.New())
	return m
}

// scope returns the first clientScopeLen hex digits of the HMAC-SHA256 of v.
func (m *scopeMAC) scope(v string) string {
	s := m.pool.Get().(*scopeState)
	for rest := v; rest != ""; {
		n := copy(s.in[:], rest)
		s.mac.Write(s.in[:n])
		rest = rest[n:]
	}
	scope := hex.EncodeToString(s.mac.Sum(s.sum[:0])[:clientScopeLen/2])
	// A pooled state keeps nothing of the credential.
	s.mac.Reset()
	clear(s.in[:])
	m.pool.Put(s)
	return scope
}
