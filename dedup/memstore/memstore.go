// Package memstore is the in-memory dedup.Store: a map under one mutex, with a
// sweeper goroutine that bounds memory by deleting expired records. It backs
// `store.backend: memory` (one process, nothing survives a restart) and the
// proxy's unit tests.
package memstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

// DefaultSweepInterval is the sweep period used when Options.SweepInterval is zero.
const DefaultSweepInterval = time.Minute

// Options configure a Store. The zero value is ready to use.
type Options struct {
	// Now is the clock for every lease, window and retention. Nil means time.Now.
	Now dedup.Clock
	// SweepInterval is how often expired records are deleted. Zero means
	// DefaultSweepInterval; negative disables the sweeper (call Sweep yourself).
	SweepInterval time.Duration
}

// Store is an in-memory dedup.Store. It is safe for concurrent use; Close
// stops its sweeper.
type Store struct {
	now dedup.Clock

	mu      sync.Mutex
	records map[dedup.Key]*dedup.Record // Owner set while processing
	closed  bool

	stop chan struct{}
	done chan struct{}
}

var _ dedup.Store = (*Store)(nil)

// New returns an empty Store and starts its sweeper (unless disabled).
func New(opts Options) *Store {
	s := &Store{
		now:     opts.Now,
		records: make(map[dedup.Key]*dedup.Record),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	// Every time the store records has the same millisecond precision in
	// UTC as on disk and on Redis (see dedup.Clock.Millis).
	s.now = s.now.Millis
	interval := opts.SweepInterval
	if interval == 0 {
		interval = DefaultSweepInterval
	}
	if interval < 0 {
		close(s.done)
		return s
	}
	go s.sweepLoop(interval)
	return s
}

func (s *Store) sweepLoop(interval time.Duration) {
	defer close(s.done)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			s.Sweep()
		}
	}
}

// Sweep deletes every record whose expiry has passed (processing records
// once their lease ran out more than dedup.LeaseGrace ago) and returns how
// many it deleted.
func (s *Store) Sweep() int {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, r := range s.records {
		exp := r.ExpiresAt
		if r.State == dedup.StateProcessing {
			exp = exp.Add(dedup.LeaseGrace) // its owner may still commit
		}
		if now.After(exp) {
			delete(s.records, k)
			n++
		}
	}
	return n
}

// Len returns the number of records held, expired or not (until swept).
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.records)
}

// begin checks ctx and takes the lock; on success the caller must unlock.
func (s *Store) begin(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %s: %w", op, err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("memstore: %s: %w", op, dedup.ErrClosed)
	}
	return nil
}

// Claim implements dedup.Store. A processing record whose lease ran out is
// taken over keeping its FirstSeen and Attempts, as a failed one is.
func (s *Store) Claim(ctx context.Context, key dedup.Key, opts dedup.ClaimOptions) (dedup.ClaimResult, error) {
	if err := s.begin(ctx, "claim"); err != nil {
		return dedup.ClaimResult{}, err
	}
	defer s.mu.Unlock()
	now := s.now()
	r := s.records[key]
	if r != nil && r.State != dedup.StateProcessing && now.After(r.ExpiresAt) {
		r = nil // window or retention over: the key is absent
	}
	if r != nil {
		switch {
		case opts.Conflicts(r.Fingerprint): // live, bound to another request
			return dedup.ClaimResult{Outcome: dedup.Conflict, Record: export(r)}, nil
		case r.State == dedup.StateProcessed:
			return dedup.ClaimResult{Outcome: dedup.Duplicate, Record: export(r)}, nil
		case r.State == dedup.StateProcessing && !now.After(r.LeaseUntil):
			return dedup.ClaimResult{Outcome: dedup.InFlight, Record: export(r)}, nil
		}
	}
	next := &dedup.Record{
		State:       dedup.StateProcessing,
		FirstSeen:   now,
		LeaseUntil:  now.Add(opts.Lease),
		ExpiresAt:   now.Add(opts.Lease),
		Attempts:    1,
		BodySHA256:  opts.BodySHA256,
		Fingerprint: opts.Fingerprint,
		Owner:       dedup.NewToken(),
	}
	if r != nil { // failed, or a lease that ran out: keep the history
		next.FirstSeen = r.FirstSeen
		next.Attempts = r.Attempts + 1
		next.LastStatus = r.LastStatus
		next.LastError = r.LastError
		// A lapsed lease's attempt ended unseen (its owner crashed, hung
		// or could not settle it): the application may have processed it.
		next.MaybeProcessed = r.MaybeProcessed || r.State == dedup.StateProcessing
	}
	s.records[key] = next
	return dedup.ClaimResult{Outcome: dedup.Claimed, Token: next.Owner, Record: export(next),
		TookOver: r != nil && r.State == dedup.StateProcessing}, nil
}

// owned returns key's record if token owns it. A lease that ran out but was
// not taken over still belongs to its owner: the upstream did answer.
func (s *Store) owned(key dedup.Key, token string) (*dedup.Record, error) {
	r := s.records[key]
	if r == nil || token == "" || r.State != dedup.StateProcessing || r.Owner != token {
		return nil, dedup.ErrNotOwner
	}
	return r, nil
}

// Commit implements dedup.Store.
func (s *Store) Commit(ctx context.Context, key dedup.Key, token string, opts dedup.CommitOptions) error {
	if err := s.begin(ctx, "commit"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	r, err := s.owned(key, token)
	if err != nil {
		return err
	}
	now := s.now()
	r.State = dedup.StateProcessed
	r.CompletedAt = now
	r.LeaseUntil = time.Time{}
	r.ExpiresAt = now.Add(opts.Window)
	r.LastStatus = opts.Status
	r.LastError = ""
	r.MaybeProcessed = false
	r.Response = copyResponse(opts.Response)
	r.Owner = ""
	return nil
}

// Release implements dedup.Store.
func (s *Store) Release(ctx context.Context, key dedup.Key, token string, opts dedup.ReleaseOptions) error {
	if err := s.begin(ctx, "release"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	r, err := s.owned(key, token)
	if err != nil {
		return err
	}
	if opts.Retain <= 0 {
		delete(s.records, key)
		return nil
	}
	now := s.now()
	r.State = dedup.StateFailed
	r.CompletedAt = now
	r.LeaseUntil = time.Time{}
	r.ExpiresAt = now.Add(opts.Retain)
	r.LastStatus = opts.Status
	r.LastError = opts.Error
	r.MaybeProcessed = opts.MaybeProcessed
	r.Response = nil
	r.Owner = ""
	return nil
}

// Get implements dedup.Store.
func (s *Store) Get(ctx context.Context, key dedup.Key) (dedup.Record, error) {
	if err := s.begin(ctx, "get"); err != nil {
		return dedup.Record{}, err
	}
	defer s.mu.Unlock()
	r := s.records[key]
	if r == nil || s.now().After(r.ExpiresAt) {
		return dedup.Record{}, dedup.ErrNotFound
	}
	return export(r), nil
}

// Forget implements dedup.Store.
func (s *Store) Forget(ctx context.Context, key dedup.Key, opts dedup.ForgetOptions) (dedup.Record, error) {
	if err := s.begin(ctx, "forget"); err != nil {
		return dedup.Record{}, err
	}
	defer s.mu.Unlock()
	r := s.records[key]
	if r == nil {
		return dedup.Record{}, dedup.ErrNotFound
	}
	if s.now().After(r.ExpiresAt) {
		delete(s.records, key)
		return dedup.Record{}, dedup.ErrNotFound
	}
	if !opts.Forgets(*r) {
		return export(r), dedup.ErrKept
	}
	delete(s.records, key)
	return export(r), nil
}

// List implements dedup.Store in key (ID) order, each key at most once.
// A page sorts the namespace's IDs past the cursor under the store's lock:
// O(n log n) for n keys of the namespace, for operators and tests.
func (s *Store) List(ctx context.Context, namespace string, opts dedup.ListOptions) (dedup.ListPage, error) {
	after, err := dedup.ParseKeyCursor(opts.Cursor)
	if err != nil {
		return dedup.ListPage{}, fmt.Errorf("memstore: list: %w", err)
	}
	if err := s.begin(ctx, "list"); err != nil {
		return dedup.ListPage{}, err
	}
	defer s.mu.Unlock()
	now := s.now()
	var ids []string
	for k := range s.records {
		if k.Namespace == namespace && (opts.Cursor == "" || k.ID > after) {
			ids = append(ids, k.ID)
		}
	}
	slices.Sort(ids)
	limit := opts.PageLimit()
	var page dedup.ListPage
	for _, id := range ids {
		r := s.records[dedup.Key{Namespace: namespace, ID: id}]
		if now.After(r.ExpiresAt) || !opts.Match(*r) {
			continue
		}
		rec := *r // as export, without copying the Response it drops
		rec.Owner, rec.Response = "", nil
		page.Entries = append(page.Entries, dedup.ListEntry{ID: id, Record: rec})
		if len(page.Entries) == limit {
			page.Next = dedup.KeyCursor(id)
			break
		}
	}
	return page, nil
}

// Ping implements dedup.Store: nil unless ctx is done or the store closed.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.begin(ctx, "ping"); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

// Close stops the sweeper and drops every record. Later calls return
// ErrClosed; Close itself is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.records = nil
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	return nil
}

// export returns a copy of r safe to hand out: no owner token, own Response.
func export(r *dedup.Record) dedup.Record {
	out := *r
	out.Owner = ""
	out.Response = copyResponse(r.Response)
	return out
}

func copyResponse(r *dedup.Response) *dedup.Response {
	if r == nil {
		return nil
	}
	out := &dedup.Response{Status: r.Status}
	if r.Header != nil {
		out.Header = make(map[string][]string, len(r.Header))
		for k, v := range r.Header {
			out.Header[k] = append([]string(nil), v...)
		}
	}
	if r.Body != nil {
		out.Body = append([]byte{}, r.Body...)
	}
	return out
}
