// Package dedup defines the per-key state machine that dedupgw enforces and the
// Store contract that every backend (memstore, boltstore, redisstore) implements.
//
// The state machine, per key:
//
//	absent ──Claim──▶ processing(owner, lease) ──Commit──▶ processed(window)
//	   ▲                    │                                   │
//	   │                    └──Release──▶ failed(attempts, last error)
//	   └──── lease expired, window expired, Forget ◀────────────┘  (failed is claimable)
//
// Claim is atomic: of any number of concurrent claims of an absent, failed or
// lease-expired key exactly one returns Claimed with a fresh random owner token.
// Commit and Release compare that token first and return ErrNotOwner when the
// lease was lost to another claimant, so a late finisher never overwrites the
// state of the attempt that took over.
package dedup

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"
)

// State is the persisted state of one key.
type State string

// The states a Record can be in. An absent key has no Record.
const (
	StateProcessing State = "processing"
	StateProcessed  State = "processed"
	StateFailed     State = "failed"
)

// Sentinel errors returned by every Store. Callers test them with errors.Is.
var (
	// ErrNotFound is returned by Get and Forget when the key is absent or
	// expired.
	ErrNotFound = errors.New("dedup: key not found")
	// ErrKept is returned by Forget, with the key's record, when the record
	// does not meet the Forget's ForgetOptions: nothing was deleted.
	ErrKept = errors.New("dedup: key kept: its record does not meet the forget's conditions")
	// ErrNotOwner is returned by Commit and Release when the token does not
	// match the current owner: the lease expired and someone else claimed the
	// key, or the key was forgotten in the meantime.
	ErrNotOwner = errors.New("dedup: not the owner of the key")
	// ErrClosed is returned by operations on a closed Store.
	ErrClosed = errors.New("dedup: store closed")
	// ErrNotReplicated is returned (wrapped) by a Store that waits for its
	// replicas (redisstore with WaitReplicas) when too few acknowledged a
	// write in time. A Claim that returns it holds nothing: its write was
	// undone. A Commit that returns it is recorded on the primary only, and
	// a failover now would lose it.
	ErrNotReplicated = errors.New("dedup: not acknowledged by enough replicas")
)

// Key identifies one event within one route namespace. Backends store it as
// Namespace + ":" + ID (plus a backend prefix); a backend may store long or
// unusual IDs by their SHA-256.
type Key struct {
	// Namespace scopes keys so two routes never collide. It defaults to the
	// route name.
	Namespace string
	// ID is the event identity extracted from the delivery, as the provider
	// sent it.
	ID string
}

// String returns "namespace:id", the form sent upstream in the Dedup-Key header.
func (k Key) String() string { return k.Namespace + ":" + k.ID }

// Response is an upstream answer stored on commit so a duplicate can be
// answered with it (duplicate_response: replay).
type Response struct {
	// Status is the upstream's 2xx status.
	Status int `json:"status"`
	// Header holds the response headers stored with it (the route's
	// replay_headers, plus Content-Encoding when the body is encoded).
	Header map[string][]string `json:"header,omitempty"`
	// Body is the response body as the upstream sent it.
	Body []byte `json:"body,omitempty"`
}

// Record is what a Store remembers about one key: the webhook receipt an
// operator reads through GET /v1/keys/{route}/{key}.
type Record struct {
	// State is processing, processed or failed.
	State State `json:"state"`
	// FirstSeen is when the key was first claimed. It survives failed attempts.
	FirstSeen time.Time `json:"first_seen"`
	// CompletedAt is when the key was committed (processed) or released (failed).
	// Zero while processing.
	CompletedAt time.Time `json:"completed_at,omitzero"`
	// LeaseUntil is when the current claim expires. Zero unless processing.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// ExpiresAt is when the record is forgotten: the end of the window for a
	// processed key, the retention of a failed one, the lease for an in-flight one.
	ExpiresAt time.Time `json:"expires_at"`
	// Attempts counts successful claims of the key, including the current one.
	Attempts int `json:"attempts"`
	// LastStatus is the upstream's last HTTP status, 0 if it never answered.
	LastStatus int `json:"last_status,omitempty"`
	// LastError is the last upstream error ("timeout", "connection refused"…),
	// empty after a 2xx. Never a body or a secret.
	LastError string `json:"last_error,omitempty"`
	// BodySHA256 is the hex SHA-256 of the delivery body that was forwarded.
	BodySHA256 string `json:"body_sha256,omitempty"`
	// Fingerprint is the hex SHA-256 of the request as the route fingerprints it
	// (API idempotency). Empty when the route does not fingerprint.
	Fingerprint string `json:"fingerprint,omitempty"`
	// MaybeProcessed marks a key an attempt of which ended without an
	// answer after the upstream may have received it (cut at the upstream
	// timeout or by a shutdown, the connection lost mid-exchange): the
	// application may have processed the event although the record is
	// failed, so a replay may process it twice. Set by a Release with
	// ReleaseOptions.MaybeProcessed, and by a Claim that takes over a
	// lapsed lease (that attempt ended unseen: its owner crashed, hung or
	// could not settle it); a Claim carries it to the new attempt's
	// record, as it carries LastStatus; a Commit clears it.
	MaybeProcessed bool `json:"maybe_processed,omitempty"`
	// Response is the stored upstream response (duplicate_response: replay).
	Response *Response `json:"-"`
	// Owner is the token of the current claim. Never exposed to clients.
	Owner string `json:"-"`
}

// Outcome is the result of a Claim.
type Outcome int

const (
	// Claimed: the caller now owns the key and must Commit or Release it.
	Claimed Outcome = iota + 1
	// Duplicate: the key is processed and within its window.
	Duplicate
	// InFlight: another claim holds an unexpired lease on the key.
	InFlight
	// Conflict: the key is bound to another request's fingerprint
	// (ClaimOptions.BindFingerprint); nothing changed.
	Conflict
)

func (o Outcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case Duplicate:
		return "duplicate"
	case InFlight:
		return "in-flight"
	case Conflict:
		return "conflict"
	}
	return "unknown"
}

// ClaimOptions parameterise a Claim.
type ClaimOptions struct {
	// Lease is how long the claim holds the key. Must be > 0.
	Lease time.Duration
	// BodySHA256 and Fingerprint are recorded on the record when claimed.
	BodySHA256  string
	Fingerprint string
	// BindFingerprint binds the key to the request that first claimed it (API
	// idempotency): when the key's live record, whatever its state, carries a
	// non-empty fingerprint other than a non-empty Fingerprint, the claim is
	// answered Conflict with that record, atomically, instead of Duplicate,
	// InFlight or taking over a failed or lapsed key.
	BindFingerprint bool
}

// Conflicts reports whether a claim with o must be answered Conflict for a
// live record carrying fingerprint (see BindFingerprint).
func (o ClaimOptions) Conflicts(fingerprint string) bool {
	return o.BindFingerprint && o.Fingerprint != "" && fingerprint != "" && fingerprint != o.Fingerprint
}

// ClaimResult reports the outcome of a Claim.
type ClaimResult struct {
	// Outcome says what the claim found: Claimed, Duplicate, InFlight or
	// Conflict.
	Outcome Outcome
	// Token is the owner token when Outcome is Claimed, empty otherwise.
	Token string
	// Record is the key's record after the claim: the new processing record when
	// Claimed, the existing one for Duplicate, InFlight and Conflict (Response
	// set when one was stored).
	Record Record
	// TookOver reports a Claimed result that took the key over from a lapsed
	// lease: an earlier attempt held it and ended unseen (its owner crashed,
	// hung, or could not commit or release it), so Record is MaybeProcessed.
	// A store reports it when it sees the lease lapse: a bolt or memory
	// store loses its leases with its process, and a claim after a restart
	// finds no lease to take over.
	TookOver bool
}

// CommitOptions parameterise a Commit.
type CommitOptions struct {
	// Window is how long the processed key is remembered. Must be > 0. It is
	// fixed at commit; later duplicates do not extend it.
	Window time.Duration
	// Status is the upstream's 2xx status.
	Status int
	// Response, when non-nil, is stored for replay to duplicates.
	Response *Response
}

// ReleaseOptions parameterise a Release.
type ReleaseOptions struct {
	// Retain is how long the failed record is kept as a receipt. The key is
	// claimable throughout. Zero means the record is deleted at once.
	Retain time.Duration
	// Status is the upstream's status (non-2xx), 0 if it never answered.
	Status int
	// Error describes why the attempt failed when there was no status.
	Error string
	// MaybeProcessed is the failed record's MaybeProcessed. The store
	// writes it as given: a caller whose claim found the key already
	// marked (ClaimResult.Record.MaybeProcessed) passes true again, so
	// the mark lasts the key's life.
	MaybeProcessed bool
}

// ForgetOptions make a Forget conditional. The zero value forgets the key
// whatever its state.
type ForgetOptions struct {
	// State, when not empty, forgets the key only while it is in this
	// state: an operator who listed failed keys to replay them does not
	// forget one that a retry has processed since.
	State State
	// KeepInFlight keeps a key in StateProcessing: a delivery of it is
	// being forwarded now (its lease is live, or the record would be
	// expired), and forgetting it would let the next copy through beside
	// it.
	KeepInFlight bool
	// KeepMaybeProcessed keeps a record marked MaybeProcessed: an
	// operator replaying the failed keys a listing showed unmarked does
	// not forget one that a retry's cut forward marked since.
	KeepMaybeProcessed bool
}

// Forgets reports whether a Forget with o deletes the live record r.
func (o ForgetOptions) Forgets(r Record) bool {
	return (o.State == "" || o.State == r.State) &&
		!(o.KeepInFlight && r.State == StateProcessing) &&
		!(o.KeepMaybeProcessed && r.MaybeProcessed)
}

// Store is the contract every backend implements. All methods are safe for
// concurrent use. Expired records (lease, window or retention passed) behave
// exactly as absent ones.
type Store interface {
	// Claim atomically takes key for one attempt if it is absent, failed or its
	// lease expired; it reports Duplicate for a processed key inside its window
	// and InFlight for a key whose lease is held, and Conflict when
	// opts.BindFingerprint finds the key bound to another fingerprint.
	Claim(ctx context.Context, key Key, opts ClaimOptions) (ClaimResult, error)
	// Commit marks the key processed for opts.Window if token still owns it,
	// else returns ErrNotOwner and changes nothing. A claim whose lease ran out
	// is still owned by its token until another Claim takes the key over (or
	// LeaseGrace passes).
	Commit(ctx context.Context, key Key, token string, opts CommitOptions) error
	// Release marks the key failed (claimable) if token still owns it (as for
	// Commit), else returns ErrNotOwner and changes nothing.
	Release(ctx context.Context, key Key, token string, opts ReleaseOptions) error
	// Get returns the key's record, or ErrNotFound. The record never
	// carries the Owner token: whoever reads a key may not settle it.
	Get(ctx context.Context, key Key) (Record, error)
	// Forget deletes the key, so the next delivery is forwarded, if its
	// record meets opts (the zero ForgetOptions: whatever its state), and
	// returns the record it deleted. The check and the delete are one
	// atomic step: no Claim, Commit or Release lands between them. When
	// the record does not meet opts, Forget deletes nothing and returns
	// the record with ErrKept; when there is no live record, ErrNotFound
	// (an expired one may be deleted all the same). A record the backend
	// cannot decode is deleted by a Forget without a State, the way to
	// repair a key, and returned as a zero Record (KeepInFlight does not
	// keep it: every claim of the key fails, so no delivery holds it); one
	// with a State fails with the decoding error. The returned record
	// never carries the Owner token.
	Forget(ctx context.Context, key Key, opts ForgetOptions) (Record, error)
	// List returns one page of namespace's live records that pass opts's
	// filters (see ListOptions), for operators: it scans the namespace, so
	// it is no operation for a hot path. Expired records (as Get sees them)
	// are never listed. A key whose record is live and passes the filters
	// for the whole listing, from the first page to the last, is returned
	// at least once; a key created, changed or deleted meanwhile may or may
	// not be, in the state it had when its page was read. Keys of other
	// namespaces are never listed.
	//
	// Each backend says how much more it guarantees: memstore and boltstore
	// list in key order and return each key at most once; redisstore
	// follows Redis SCAN, in no order, and may return a key on two pages.
	// IDs a backend keeps only as a SHA-256 (see its key scheme) cannot be
	// given back and are not listed.
	//
	// A page holds at most opts.PageLimit() entries and may hold none
	// while Next is not empty. A Cursor the store did not hand out fails
	// with an error wrapping ErrBadCursor.
	List(ctx context.Context, namespace string, opts ListOptions) (ListPage, error)
	// Ping reports whether the backend is reachable and would record a
	// claim (readiness): an error when it cannot be reached, and when it
	// answers but refuses writes (a full disk, a Redis at maxmemory or
	// read-only), as claims of new keys then fail.
	Ping(ctx context.Context) error
	// Close releases resources and stops background goroutines.
	Close() error
}

// LeaseGrace is how long a store keeps a claim whose lease ran out but that
// nobody took over. Within it the owner's late Commit or Release still lands
// (the token proves no other attempt claimed the key since), so an upstream
// 2xx that arrived just after the lease is recorded instead of letting the
// next retry be forwarded again. Sweepers must not drop such claims earlier.
const LeaseGrace = time.Hour

// Clock returns the current time. Stores take one so tests can move time.
type Clock func() time.Time

// Millis returns c's current time in UTC, truncated to the millisecond: the
// precision of every time a Store records (Redis keeps Unix milliseconds).
// Stores read their clock through it, so a record's times look alike on
// every backend, in memory or on disk.
func (c Clock) Millis() time.Time {
	return c().UTC().Truncate(time.Millisecond)
}

// NewToken returns a random 128-bit owner token, hex encoded.
func NewToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
