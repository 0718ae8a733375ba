// Package redisstore is the Redis backend of dedup.Store: one shared view of
// which events were seen for every gateway replica that points at the same
// Redis, on a single node, behind Sentinel, or on a Cluster.
//
// Each operation is one command on one key, so it is atomic and
// Cluster-safe: a Lua script (claim.lua, commit.lua, release.lua,
// forget.lua), or a plain GET for Get. Claim first tries a fast path without
// Lua (Redis >= 7.0, see claim.go): a plain SET NX GET claims an absent key,
// or returns the record it found, which decides a duplicate, a held lease or
// a conflict in Go by claim.lua's rule without changing anything; only a
// claim that takes a key over (a lapsed lease, a failed record) runs
// claim.lua as well. Commit has one too (see commit.go): a SET XX GET of
// the processed record, which the Store builds from the record its claim
// wrote, and which is the commit when it replaced exactly that record;
// when it replaced another (a rare race, which the fast path's margin on
// the lease keeps rare), the Store puts that back at once. So a delivery
// costs one command for a duplicate and two (claim, commit) for a first
// delivery, none of them Lua. A server that refuses SET … GET (Redis < 7.0)
// turns the fast paths off, and every claim and commit runs its script.
//
// Concurrent operations share round trips: the Store auto-pipelines them
// (see pipeliner in pipeline.go), so under load many deliveries' commands
// travel in one pipeline, while a lone command goes out at once, never
// waiting for a timer. The scripts take the caller's clock as an argument
// and compare it with the times stored in the record (the fast path compares
// the same times in Go), so every replica's decisions follow the same rule
// and tests can move time. Each key also gets a Redis TTL, the record's
// remaining life (plus leaseGrace for a processing record), so Redis drops
// expired records by itself. Every command but Forget's is safe to run twice
// with the same arguments, as go-redis does when it retries a command or a
// pipeline after a lost reply: a repeated SET NX GET or claim script finds
// its own owner token and answers Claimed again. Forget deletes whatever the
// key holds, so it is sent on its own and never resent (see forgetOnce).
//
// Keys are "{KeyPrefix}{namespace}:{id}" (see redisKey for ids stored by
// their SHA-256) and values are one compact string (see record.go).
package redisstore

import (
	"context"
	_ "embed" // Lua scripts
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

var (
	//go:embed result.lua
	resultLua string
	//go:embed claim.lua
	claimLua string
	//go:embed commit.lua
	commitSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed forget.lua
	forgetLua string
	//go:embed restore.lua
	restoreSrc string

	// The scripts that read a record's result part start with result.lua's
	// helpers: a script cannot call another.
	claimSrc  = resultLua + claimLua
	forgetSrc = resultLua + forgetLua

	// The scripts run with EVALSHA; the pipeliner falls back to EVAL (which
	// also caches the script again) for each command the server answers
	// NOSCRIPT, after a restart or SCRIPT FLUSH, as Script.Run does.
	claimScript   = redis.NewScript(claimSrc)
	commitScript  = redis.NewScript(commitSrc)
	releaseScript = redis.NewScript(releaseSrc)
	forgetScript  = redis.NewScript(forgetSrc)
	restoreScript = redis.NewScript(restoreSrc)
)

// leaseGrace is how long Redis keeps a processing record after its lease
// lapsed. A record whose lease lapsed reads as absent, but a claim within the
// grace keeps its first_seen and counts attempts on, so the receipt of an
// attempt that crashed is not lost.
const leaseGrace = dedup.LeaseGrace

// Claim script result codes (the first element of its reply).
const (
	claimClaimed   = 0
	claimDuplicate = 1
	claimInFlight  = 2
	claimConflict  = 3
	// claimTookOver: claimed by taking over a lapsed lease (claim.lua only).
	claimTookOver = 4
)

var _ dedup.Store = (*Store)(nil)

// Options are the store's collaborators.
type Options struct {
	// Now is the clock for every lease, window and retention decision. Nil
	// means time.Now. All replicas sharing a Redis should have synchronised
	// clocks (NTP); a skew of s shifts each lease and window by up to s.
	Now dedup.Clock
	// Logger receives one line from New naming the topology it chose
	// (single, cluster or sentinel), and one warning if the server refuses
	// the claim fast path (Redis < 7.0); operation errors are returned, and
	// only the commits and releases sent again are logged (at debug). Nil
	// means zap.NewNop().
	Logger *zap.Logger
}

// Store is a dedup.Store backed by Redis. It is safe for concurrent use.
type Store struct {
	client     redis.UniversalClient
	ownsClient bool
	prefix     string
	// probeFound caches probe keys found by search (see probeKey), by
	// slot; "" when none was.
	probeMu    sync.Mutex
	probeFound map[int]string
	now        dedup.Clock
	log        *zap.Logger
	pipe       *pipeliner
	nodes      *nodePipes // on a Cluster: a pipeliner per master; else nil
	closed     atomic.Bool
	scriptOnly atomic.Bool // the server refused SET … GET: claims and commits run their scripts
	held       heldKeys    // keys this Store claimed and has not finished
	masterName string      // Config.MasterName, for Ping's hint

	// undos are the claims being undone after an unclear failure (see
	// undoIfUnclear); Close waits for them before it closes the client.
	undoMu     sync.Mutex
	undoClosed bool
	undos      sync.WaitGroup
}

// New builds a go-redis client from cfg (single node, Cluster or Sentinel;
// see Config.Addrs) and returns a Store using it. It does not contact Redis:
// use Ping to check reachability. Close closes the client.
func New(cfg Config, opts Options) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	client := redis.NewUniversalClient(cfg.universalOptions())
	s := newStore(client, cfg.KeyPrefix, opts, cfg.WaitReplicas, cfg.waitTimeout())
	s.ownsClient = true
	s.masterName = cfg.MasterName
	fields := []zap.Field{zap.String("mode", cfg.mode()), zap.Strings("addrs", cfg.Addrs),
		zap.String("key_prefix", s.prefix), zap.Bool("tls", cfg.TLS)}
	if cfg.WaitReplicas > 0 {
		fields = append(fields, zap.Int("wait_replicas", cfg.WaitReplicas), zap.Duration("wait_timeout", cfg.waitTimeout()))
	}
	s.log.Info("redis store configured", fields...)
	return s, nil
}

// NewFromClient returns a Store using client, whose lifetime stays with the
// caller: Close does not close it, but must be called to stop the Store's
// pipeline workers. An empty prefix means "dedupgw:". It waits for no
// replicas (see Config.WaitReplicas).
func NewFromClient(client redis.UniversalClient, prefix string, opts Options) *Store {
	return newStore(client, prefix, opts, 0, 0)
}

// newStore is NewFromClient, waiting for waitReplicas replicas for at most
// waitTimeout after each write when waitReplicas is positive.
func newStore(client redis.UniversalClient, prefix string, opts Options, waitReplicas int, waitTimeout time.Duration) *Store {
	if prefix == "" {
		prefix = DefaultKeyPrefix
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	s := &Store{
		client: client,
		prefix: prefix,
		now:    opts.Now,
		log:    opts.Logger.Named("redisstore"),
		pipe:   newPipeliner(client, defaultInFlight, defaultMaxBatch, waitReplicas, waitTimeout),
	}
	if cc, ok := client.(*redis.ClusterClient); ok && waitReplicas == 0 {
		s.nodes = newNodePipes(cc)
	}
	return s
}

// pipeFor returns the pipeliner that sends key's commands: on a Cluster
// its master's own (see nodePipes), else the Store's one. On a Cluster it
// also returns its nodePipe, which the caller hands to donePipe once its
// command returned; nil elsewhere. Its error means nothing was sent: a
// *slotMapError, or dedup.ErrClosed.
func (s *Store) pipeFor(ctx context.Context, key string) (*pipeliner, *nodePipe, error) {
	if s.nodes == nil {
		return s.pipe, nil, nil
	}
	np, err := s.nodes.forKey(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	return np.p, np, nil
}

// donePipe ends the use of np, from pipeFor.
func (s *Store) donePipe(np *nodePipe) {
	if np != nil {
		s.nodes.release(np)
	}
}

// runWaited is pipeliner.runWaited on key's pipeliner (see pipeFor); an
// error finding it is the reply's.
func (s *Store) runWaited(ctx context.Context, script *redis.Script, key string, args ...any) (*redis.Cmd, error) {
	p, np, err := s.pipeFor(ctx, key)
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd, nil
	}
	defer s.donePipe(np)
	return p.runWaited(ctx, script, key, args...)
}

// get runs GET key on key's pipeliner (see pipeFor); an error finding it
// is the reply's. A GET writes nothing, so no replicas are waited for.
func (s *Store) get(ctx context.Context, key string) *redis.StringCmd {
	cmd, _ := s.commandWaited(ctx, key, "get", key)
	return cmd
}

// commandWaited is pipeliner.commandWaited on key's pipeliner (see
// pipeFor), key being the command's; an error finding it is the reply's.
func (s *Store) commandWaited(ctx context.Context, key string, args ...any) (*redis.StringCmd, error) {
	p, np, err := s.pipeFor(ctx, key)
	if err != nil {
		cmd := redis.NewStringCmd(ctx)
		cmd.SetErr(err)
		return cmd, nil
	}
	defer s.donePipe(np)
	return p.commandWaited(ctx, args...)
}

// Key returns the Redis key that holds k's record, for operators and tests.
func (s *Store) Key(k dedup.Key) string { return redisKey(s.prefix, k) }

// Client returns the underlying go-redis client.
func (s *Store) Client() redis.UniversalClient { return s.client }

// Claim implements dedup.Store, in one round trip for a first delivery, a
// duplicate, a held lease and a conflict: SET NX GET either claims an absent
// key or returns the record that decides the claim, so Record (with the
// stored Response) is filled without a second call. A claim that takes a key
// over (a lapsed lease, a failed record) costs a second round trip, for
// claim.lua (see claim.go). Once the server refused SET NX GET, every claim
// is claim.lua alone, in one round trip.
func (s *Store) Claim(ctx context.Context, key dedup.Key, opts dedup.ClaimOptions) (dedup.ClaimResult, error) {
	if s.closed.Load() {
		return dedup.ClaimResult{}, dedup.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return dedup.ClaimResult{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	if opts.Lease <= 0 {
		return dedup.ClaimResult{}, fmt.Errorf("redisstore: claim: lease %s must be positive", opts.Lease)
	}
	c := &claimCall{
		key:     s.Key(key),
		now:     s.nowMS(),
		leaseMS: durationMS(opts.Lease),
		token:   dedup.NewToken(),
		claim:   encodeClaim(opts.BodySHA256, opts.Fingerprint),
		opts:    opts,
	}
	if opts.BindFingerprint && opts.Fingerprint != "" {
		c.bind = string(appendField(nil, opts.Fingerprint))
	}
	if !s.scriptOnly.Load() && !s.held.has(c.key) {
		res, ok, err := s.claimFast(ctx, c)
		switch {
		case err != nil && !RefusesWrites(err):
			s.undoIfUnclear(c, err)
			return dedup.ClaimResult{}, fmt.Errorf("redisstore: claim: %w", err)
		case ok:
			return s.claimed(ctx, c, res)
		}
		// Otherwise claim.lua decides, and when Redis refused the SET NX
		// GET as a write it will not take now (see RefusesWrites): the
		// script reads the record before it writes, so it still answers a
		// processed key as a duplicate, a held lease as in flight and a
		// fingerprint conflict, and fails with the same refusal only where
		// the claim needs a write. Without it, every copy of an event
		// already processed would fail its claim, and a route failing
		// open would forward it again.
	}
	res, err := s.claimScript(ctx, c)
	if err != nil {
		s.undoIfUnclear(c, err)
		return dedup.ClaimResult{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	return s.claimed(ctx, c, res)
}

// RefusesWrites reports whether err, from any Store method (Ping
// included), is Redis refusing a write it did not run while it still
// serves reads: OOM (used memory above maxmemory, under
// noeviction or with nothing left to evict), READONLY (a replica, or a
// master being demoted), MISCONF (an RDB save failed, with
// stop-writes-on-bgsave-error) or NOREPLICAS (fewer replicas than
// min-replicas-to-write). A claim then still answers from the record a key
// holds, and Ping fails until Redis takes writes again.
func RefusesWrites(err error) bool {
	return redis.IsOOMError(err) || redis.IsReadOnlyError(err) ||
		redis.HasErrorPrefix(err, "MISCONF ") || redis.IsNoReplicasError(err)
}

// undoIfUnclear undoes c in the background when its claim failed in a way
// that leaves open whether Redis applied it (a lost reply, a timeout): a
// claim applied but never answered would hold the key, in flight, for a
// lease. Without replicas to wait for, go-redis re-sends the command once
// first (MaxRetries), and the re-sent claim finds its own lease and wins.
// The undo is token-guarded, so it cannot remove anyone else's claim.
func (s *Store) undoIfUnclear(c *claimCall, err error) {
	var rerr redis.Error
	if errors.As(err, &rerr) || errors.Is(err, dedup.ErrClosed) || nothingSent(err) {
		return // Redis answered with an error, or nothing was sent
	}
	s.undoMu.Lock()
	defer s.undoMu.Unlock()
	if s.undoClosed {
		return
	}
	s.undos.Go(func() { _ = s.undoClaim(context.Background(), c) })
}

// nothingSent reports whether err says the command was never sent, so
// there is nothing to undo: a failure to connect (see dialFailed), or a
// Cluster key whose master could not be found (a *slotMapError, whatever
// it wraps).
func nothingSent(err error) bool {
	var sm *slotMapError
	return dialFailed(err) || errors.As(err, &sm)
}

// dialFailed reports whether err is a failure to connect: the command was
// never sent.
func dialFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// claimed settles c, answered res. A grant too few replicas acknowledged
// (see Config.WaitReplicas) is undone and fails: forwarded on it, the event
// could be forwarded again after a failover. Other answers wrote nothing,
// and stand.
func (s *Store) claimed(ctx context.Context, c *claimCall, res dedup.ClaimResult) (dedup.ClaimResult, error) {
	if c.waitErr != nil && res.Outcome == dedup.Claimed {
		if err := s.undoClaim(ctx, c); err != nil {
			return dedup.ClaimResult{}, fmt.Errorf("redisstore: claim: %w (undoing it failed too, so the key stays in flight until its lease ends: %w)", c.waitErr, err)
		}
		return dedup.ClaimResult{}, fmt.Errorf("redisstore: claim: %w", c.waitErr)
	}
	s.held.claimed(c.key, res, c.now, c.record)
	return res, nil
}

// undoTimeout bounds undoClaim, which runs after the claim's own context
// may have been spent waiting for replicas.
const undoTimeout = time.Second

// undoClaim deletes c's key if it still holds c's claim (a taken-over failed
// record loses its attempt count): release.lua with no retention. It is
// sent on its own, outside the pipelines, so it waits for no replica, and
// under its own timeout (undoTimeout), not ctx's deadline.
func (s *Store) undoClaim(ctx context.Context, c *claimCall) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	now := s.nowMS()
	return releaseScript.Run(ctx, s.client, []string{c.key}, now, c.token, base36(now), base36(now), 0, "").Err()
}

// Commit implements dedup.Store. The window is fixed here: later duplicates
// do not extend it.
func (s *Store) Commit(ctx context.Context, key dedup.Key, token string, opts dedup.CommitOptions) error {
	if s.closed.Load() {
		return dedup.ErrClosed
	}
	rk := s.Key(key)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: commit: %w", err)
	}
	if opts.Window <= 0 {
		return fmt.Errorf("redisstore: commit: window %s must be positive", opts.Window)
	}
	n, waitErr, err := s.settle(ctx, "commit", commitScript, rk, token, opts.Window,
		encodeResult(opts.Status, "", false, opts.Response), true)
	if err != nil {
		return fmt.Errorf("redisstore: commit: %w", err)
	}
	if n != 1 {
		return dedup.ErrNotOwner
	}
	if waitErr != nil {
		return fmt.Errorf("redisstore: commit: %w", waitErr)
	}
	return nil
}

// Commit and Release retry.
//
// A commit or release that fails leaves its key processing until the lease
// ends: the provider's retries get 409 meanwhile and are forwarded again
// after it, although the application already answered. A failover is the
// usual cause, and lasts seconds: the old master refuses connections until
// the sentinels name the new one. So Commit and Release try again, after
// 50ms, 100ms, … at most a second apart, for as long as their context
// allows (the gateway gives each store operation 5s; without a deadline,
// eight tries over some 3.5s), when the failure left
// Redis unchanged or the command is safe to repeat:
//
//   - a connection that could not be made or taken from the pool in time,
//     or a Cluster slot map that could not be loaded to find the key's
//     master (nothing was sent, see nothingSent), and a
//     refusal by which Redis did nothing (READONLY from a master being
//     demoted, LOADING after a restart, MASTERDOWN, TRYAGAIN, CLUSTERDOWN),
//     always;
//   - any other network failure (a timeout, a connection lost with the
//     command sent) only when the Store waits for no replicas: the scripts
//     recognise their own write when repeated and answer as the first time,
//     but WAIT on a new connection would then check nothing (see
//     Config.WaitTimeout);
//   - never another answer from Redis (another error reply, ErrNotOwner),
//     the end of the context, or a closed Store.
//
// Each retry is logged at debug level.

// settle runs script (commit.lua or release.lua, for op) on rk for token,
// writing result, expiring span from now, sending it again under the rules
// above. Its completed_at is settleTime's: a caller's own later try repeats
// the first one's. With fast (a commit), each try takes the fast path
// built from the same arguments while it is usable (see commit.go). It
// returns the script's reply, the replicas' verdict on the last try (see
// pipeliner.runWaited) and the last try's error; an answer (any reply)
// finishes the claim in s.held.
func (s *Store) settle(ctx context.Context, op string, script *redis.Script, rk, token string, span time.Duration, result string, fast bool) (n int64, waitErr, err error) {
	now := s.nowMS()
	spanMS := durationMS(span)
	at := base36(s.held.settleTime(rk, token, now))
	var fc *fastCommit
	if fast {
		fc = s.newFastCommit(rk, token, at, now+spanMS, spanMS, result)
	}
	defer func() {
		if err == nil {
			s.held.finished(rk, token)
		}
	}()
	var args []any  // the script's, built when first needed
	paused := false // for putBackPause, once
	for attempt := 0; ; attempt++ {
		next := fastRefused // without the fast path: the script, now
		if fc.usable(s.nowMS()) {
			n, waitErr, err, next = s.commitFast(ctx, fc)
		}
		if next == fastPutBack {
			fc, paused = nil, true // the script decides this try and every later one
			if !sleep(ctx, putBackPause) {
				return 0, waitErr, fmt.Errorf("put back another claim's record, then: %w", ctx.Err())
			}
		}
		if next != fastAnswered {
			if args == nil {
				args = []any{now, token, at, base36(now + spanMS), spanMS, result}
			}
			var cmd *redis.Cmd
			cmd, waitErr = s.runWaited(ctx, script, rk, args...)
			n, err = cmd.Int64()
		}
		if err == nil && n == 0 && !paused && s.held.live(rk, token, s.nowMS()) {
			// Refused while this Store holds the claim and its lease is
			// live: the key may hold, for one round trip, the record of
			// another gateway's fast commit that replaced this claim's and
			// is putting it back (its own claim lost in a failover, see
			// commit.go). Asked again once that is done, the script gives
			// the answer it gives without the race.
			fc, paused = nil, true
			if sleep(ctx, putBackPause) {
				continue
			}
		}
		if err == nil || !s.again(ctx, op, err, attempt) {
			return n, waitErr, err
		}
	}
}

// againFirst and againMax bound the pause before a retry; againTries
// bounds the tries of a call whose context has no deadline.
const (
	againFirst = 50 * time.Millisecond
	againMax   = time.Second
	againTries = 8
)

// again reports whether the op (commit or release) that failed with err on
// its attempt-th try (0 first) may be sent again under the rules above,
// after pausing for it; false when not, or when ctx ends first.
func (s *Store) again(ctx context.Context, op string, err error, attempt int) bool {
	if !retryable(err, s.pipe.waitReplicas > 0) {
		return false
	}
	pause := min(againFirst<<min(attempt, 10), againMax)
	if d, ok := ctx.Deadline(); ok && time.Until(d) < pause || !ok && attempt+1 >= againTries {
		return false
	}
	s.log.Debug(op+" not done; trying again", zap.Int("attempt", attempt+1), zap.Duration("after", pause), zap.Error(err))
	return sleep(ctx, pause)
}

// sleep pauses for d, or until ctx ends; it reports whether ctx is still
// live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return ctx.Err() == nil
	case <-ctx.Done():
		return false
	}
}

// retryable reports whether a Commit or Release that failed with err may be
// sent again: see "Commit and Release retry".
func retryable(err error, waiting bool) bool {
	switch {
	case redis.IsReadOnlyError(err), redis.IsLoadingError(err), redis.IsMasterDownError(err),
		redis.IsTryAgainError(err), redis.IsClusterDownError(err):
		return true // refused, nothing done
	case notTransport(err):
		return false
	case nothingSent(err), errors.Is(err, redis.ErrPoolTimeout):
		return true // nothing was sent
	}
	return !waiting
}

// notTransport reports whether err is Redis's own answer, the caller's
// context ending, or a closed Store or client: anything but a failure of
// the connection to carry the command.
func notTransport(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) || errors.Is(err, errNotRecord) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, dedup.ErrClosed) || errors.Is(err, redis.ErrClosed)
}

// Release implements dedup.Store. A zero Retain deletes the key.
func (s *Store) Release(ctx context.Context, key dedup.Key, token string, opts dedup.ReleaseOptions) error {
	if s.closed.Load() {
		return dedup.ErrClosed
	}
	rk := s.Key(key)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if opts.Retain < 0 {
		return fmt.Errorf("redisstore: release: retain %s must not be negative", opts.Retain)
	}
	n, _, err := s.settle(ctx, "release", releaseScript, rk, token, opts.Retain,
		encodeResult(opts.Status, opts.Error, opts.MaybeProcessed, nil), false)
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if n != 1 {
		return dedup.ErrNotOwner
	}
	return nil
}

// Get implements dedup.Store with one GET; a record whose time has passed by
// the store's clock is reported as ErrNotFound even while Redis still holds it.
func (s *Store) Get(ctx context.Context, key dedup.Key) (dedup.Record, error) {
	if s.closed.Load() {
		return dedup.Record{}, dedup.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return dedup.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	rk := s.Key(key)
	value, err := s.get(ctx, rk).Result()
	if isNil(err) {
		return dedup.Record{}, dedup.ErrNotFound
	}
	if err != nil {
		return dedup.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	rec, err := decodeRecord(value)
	if err != nil {
		return dedup.Record{}, fmt.Errorf("redisstore: get: %w", err)
	}
	if rec.ExpiresAt.UnixMilli() < s.nowMS() {
		return dedup.Record{}, dedup.ErrNotFound
	}
	rec.Owner = ""
	return rec, nil
}

// Forget implements dedup.Store with one script, forget.lua, that checks
// opts and deletes. A record that had already expired by the store's clock
// is deleted all the same and reported as ErrNotFound.
func (s *Store) Forget(ctx context.Context, key dedup.Key, opts dedup.ForgetOptions) (dedup.Record, error) {
	if s.closed.Load() {
		return dedup.Record{}, dedup.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return dedup.Record{}, fmt.Errorf("redisstore: forget: %w", err)
	}
	reply, err := s.forgetOnce(ctx, s.Key(key), s.nowMS(), opts).Slice()
	if err != nil {
		return dedup.Record{}, fmt.Errorf("redisstore: forget: %w", err)
	}
	code, _ := reply[0].(int64)
	if code == 0 || len(reply) != 2 {
		return dedup.Record{}, dedup.ErrNotFound
	}
	value, _ := reply[1].(string)
	rec, err := decodeRecord(value)
	switch {
	case err != nil && code == 1:
		return dedup.Record{}, nil // an undecodable record, repaired
	case err != nil:
		return dedup.Record{}, fmt.Errorf("redisstore: forget: %w", err)
	}
	rec.Owner = ""
	if code == 2 {
		return rec, dedup.ErrKept
	}
	return rec, nil
}

// stateLetter returns the record format's letter for st, and for a state
// no record has a letter no record holds.
func stateLetter(st dedup.State) string {
	switch st {
	case "":
		return ""
	case dedup.StateProcessing:
		return stateProcessing
	case dedup.StateProcessed:
		return stateProcessed
	case dedup.StateFailed:
		return stateFailed
	}
	return "?"
}

// scriptFlag is b as a script argument: "1" or "0".
func scriptFlag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// onceCmd is a command go-redis must not send again after a network error
// (a lost reply): its NoRetry reports true.
type onceCmd struct{ *redis.Cmd }

// NoRetry implements redis.Cmder.
func (onceCmd) NoRetry() bool { return true }

// forgetOnce runs forget.lua on rk on its own, not in a pipeline, and
// without go-redis's retry after a network error: forget.lua is the one
// script that is not safe to run twice. A resend after a lost reply could
// delete what another replica claimed or committed in between (the replay
// the operator asked for) and let its duplicate through. A lost reply is
// an error instead: the caller may look and forget again. NOSCRIPT falls
// back to EVAL, as Script.Run does.
func (s *Store) forgetOnce(ctx context.Context, rk string, now int64, opts dedup.ForgetOptions) *redis.Cmd {
	state := stateLetter(opts.State)
	keep, keepMaybe := scriptFlag(opts.KeepInFlight), scriptFlag(opts.KeepMaybeProcessed)
	send := func(name, body string) *redis.Cmd {
		cmd := redis.NewCmd(ctx, name, body, 1, rk, now, state, keep, keepMaybe)
		_ = s.client.Process(ctx, onceCmd{cmd}) // the error is cmd's
		return cmd
	}
	cmd := send("evalsha", forgetScript.Hash())
	if isNoScript(cmd.Err()) {
		cmd = send("eval", forgetSrc)
	}
	return cmd
}

// Ping implements dedup.Store: PING on the node, on the Sentinel master, or
// on every Cluster master (a Cluster with one master down cannot serve part of
// the keys, so it is not ready), and on a Cluster also CLUSTER INFO, which
// must report cluster_state:ok (see clusterServes; a user not allowed the
// command skips that check). Then the write probe (see writeProbe): a
// master that answers but refuses writes (OOM, READONLY, MISCONF,
// NOREPLICAS) fails the ping too, as claims of new keys fail on it. It
// does not check replicas (see CheckCommands): they are shared by every
// gateway, so a readiness that failed with them would take every pod out
// of service at once, though duplicates are still answered.
func (s *Store) Ping(ctx context.Context) error {
	if s.closed.Load() {
		return dedup.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	_, cluster := s.client.(*redis.ClusterClient)
	err := s.eachMaster(ctx, func(ctx context.Context, c redis.Cmdable) error {
		if err := c.Ping(ctx).Err(); err != nil || !cluster {
			return err
		}
		return clusterServes(ctx, c)
	})
	if err != nil && s.masterName != "" && errors.Is(err, redis.Nil) {
		// The sentinels answered, but not with a master: they know none by
		// that name (see isNil).
		return fmt.Errorf("redisstore: ping: no sentinel knows a master named %q (check master_name): %w", s.masterName, err)
	}
	if err == nil {
		err = s.writeProbe(ctx)
	}
	if err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}

// CredentialsRefused reports whether err (from any Store method, Ping
// included) is Redis refusing the client's credentials or what they allow:
// NOAUTH (a password is required), WRONGPASS (wrong username or password),
// NOPERM (the ACL user may not run a command the store needs), or an older
// or other server's AUTH error. It is a configuration error, which waiting
// does not mend, unlike an unreachable or loading Redis. A sentinel's
// refusal counts too.
func CredentialsRefused(err error) bool {
	if err == nil {
		return false
	}
	if redis.IsAuthError(err) || redis.IsPermissionError(err) ||
		redis.HasErrorPrefix(err, "AUTH ") || redis.HasErrorPrefix(err, "invalid password") ||
		redis.HasErrorPrefix(err, "NOPERM ") {
		return true
	}
	// go-redis reports a sentinel's refusal, and some connection set-ups,
	// as text that is not a Redis error value.
	msg := err.Error()
	for _, code := range []string{"NOAUTH ", "WRONGPASS ", "NOPERM "} {
		if strings.Contains(msg, code) {
			return true
		}
	}
	return false
}

// clusterServes returns an error unless the Cluster node c reports
// cluster_state:ok. A master answers PING while the Cluster is down (a
// master lost and not yet replaced, or just restarted), when every command
// is refused with CLUSTERDOWN. A user not allowed CLUSTER INFO skips the
// check.
func clusterServes(ctx context.Context, c redis.Cmdable) error {
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		if strings.HasPrefix(err.Error(), "NOPERM") {
			return nil
		}
		return err
	}
	if state, ok := infoField(info, "cluster_state"); ok && state != "ok" {
		return fmt.Errorf("cluster_state is %s: the Cluster refuses commands (CLUSTERDOWN)", state)
	}
	return nil
}

// eachMaster calls fn with the node, the Sentinel master, or each Cluster
// master (concurrently), and returns the first error.
func (s *Store) eachMaster(ctx context.Context, fn func(context.Context, redis.Cmdable) error) error {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return fn(ctx, c) })
	}
	return fn(ctx, s.client)
}

// MasterRun is one run of a Redis master process, as INFO server reports
// it.
type MasterRun struct {
	// RunID is the process's run_id: a restarted Redis has a new one.
	RunID string
	// Uptime is how long the process has run.
	Uptime time.Duration
	// Promoted is set when the master was a replica that a failover
	// promoted (INFO replication: second_repl_offset is not -1): it holds
	// what it replicated, however recently it started. A master that
	// restarted as one has -1, whatever its persistence loaded.
	Promoted bool
}

// MasterRuns reports the run of every master the Store writes to (every
// Cluster master, else the one master), in no order, from INFO server and
// INFO replication. A run_id not seen before, with a short uptime and not
// Promoted, names a restart, after which the master holds only what its
// persistence kept; a Promoted one, or one with a long uptime, names a
// replica promoted by a failover.
func (s *Store) MasterRuns(ctx context.Context) ([]MasterRun, error) {
	if s.closed.Load() {
		return nil, dedup.ErrClosed
	}
	var (
		mu   sync.Mutex // eachMaster calls fn concurrently
		runs []MasterRun
	)
	err := s.eachMaster(ctx, func(ctx context.Context, c redis.Cmdable) error {
		info, err := c.Info(ctx, "server", "replication").Result()
		if err != nil {
			return err
		}
		var run MasterRun
		run.RunID, _ = infoField(info, "run_id")
		if v, ok := infoField(info, "second_repl_offset"); ok {
			run.Promoted = v != "-1"
		}
		if v, ok := infoField(info, "uptime_in_seconds"); ok {
			secs, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return fmt.Errorf("INFO server: uptime_in_seconds: %w", err)
			}
			run.Uptime = time.Duration(secs) * time.Second
		}
		if run.RunID == "" {
			return errors.New("INFO server has no run_id")
		}
		mu.Lock()
		runs = append(runs, run)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisstore: master runs: %w", err)
	}
	return runs, nil
}

// infoField returns the value of the field name in an INFO answer (its
// "name:value" line), and whether the answer has it.
func infoField(info, name string) (string, bool) {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// SingleNodeInCluster reports whether the one node a single-node Store
// talks to is a Redis Cluster node (INFO cluster: cluster_enabled:1): keys
// on other nodes' slots then fail with MOVED, and Config.Cluster was
// likely meant. It reports false for Sentinel and Cluster stores.
func (s *Store) SingleNodeInCluster(ctx context.Context) (bool, error) {
	c, ok := s.client.(*redis.Client)
	if !ok || s.masterName != "" {
		return false, nil
	}
	info, err := c.Info(ctx, "cluster").Result()
	if err != nil {
		return false, err
	}
	return strings.Contains(info, "cluster_enabled:1"), nil
}

// MaxmemoryPolicy returns the maxmemory-policy Redis reports in INFO memory:
// on a Cluster, the worst among the masters' (any policy that evicts keys
// regardless of their TTL, then volatile-ttl, then noeviction). Under
// memory pressure any policy but noeviction deletes keys with a TTL (every
// key the Store writes has one), and the next copy of an evicted processed
// event is forwarded again; noeviction makes writes fail instead, which the
// gateway's on_store_error decides.
func (s *Store) MaxmemoryPolicy(ctx context.Context) (string, error) {
	return s.worstOfMasters(ctx, "maxmemory-policy", func(ctx context.Context, c redis.Cmdable) (string, error) {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return "", err
		}
		if v, ok := infoField(info, "maxmemory_policy"); ok {
			return v, nil
		}
		return "", errors.New("INFO memory has no maxmemory_policy")
	}, evictionRank)
}

// How Redis keeps its keys across its own restart, least durable first
// (see Persistence).
const (
	PersistenceNone = "none" // neither appendonly nor snapshots: a restart loses every key
	PersistenceRDB  = "rdb"  // snapshots only: a restart loses the writes since the last one
	PersistenceAOF  = "aof"  // appendonly
)

// Persistence reports how Redis keeps the Store's keys across a restart of
// Redis itself: PersistenceAOF, PersistenceRDB or PersistenceNone, on a
// Cluster the least durable master's. It reads INFO persistence
// (aof_enabled) and, without appendonly, CONFIG GET save, which an ACL
// user or a managed Redis may refuse: then it returns the error.
func (s *Store) Persistence(ctx context.Context) (string, error) {
	return s.worstOfMasters(ctx, "persistence", func(ctx context.Context, c redis.Cmdable) (string, error) {
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			return "", err
		}
		if v, _ := infoField(info, "aof_enabled"); v == "1" {
			return PersistenceAOF, nil
		}
		save, err := c.ConfigGet(ctx, "save").Result()
		if err != nil {
			return "", err
		}
		if strings.TrimSpace(save["save"]) == "" {
			return PersistenceNone, nil
		}
		return PersistenceRDB, nil
	}, persistenceHarm)
}

// persistenceHarm orders Persistence's answers by the keys a restart of
// Redis may lose: none (appendonly), those since the last snapshot, all.
func persistenceHarm(p string) int {
	switch p {
	case PersistenceAOF:
		return 0
	case PersistenceRDB:
		return 1
	}
	return 2
}

// worstOfMasters reads a setting from every master (every Cluster master
// at once, else the one master) and returns the value harm ranks highest:
// the store is only as safe as its least safe master. op names the
// setting in the error.
func (s *Store) worstOfMasters(ctx context.Context, op string, read func(context.Context, redis.Cmdable) (string, error), harm func(string) int) (string, error) {
	if s.closed.Load() {
		return "", dedup.ErrClosed
	}
	var (
		mu    sync.Mutex // eachMaster calls fn concurrently
		worst string
		found bool
	)
	err := s.eachMaster(ctx, func(ctx context.Context, c redis.Cmdable) error {
		v, err := read(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if !found || harm(v) > harm(worst) {
			worst, found = v, true
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("redisstore: %s: %w", op, err)
	}
	return worst, nil
}

// probeNamespace is the namespace of CheckCommands' probe keys and of
// Ping's write probe: not a route's (route namespaces name no "dedupgw:"
// part), under the Store's key prefix like every key it writes.
const probeNamespace = "dedupgw-start-up-probe"

// CheckCommands runs every operation the Store sends Redis on a probe key
// of its own (random, under the key prefix, gone within seconds): a claim
// (SET NX GET), a release (release.lua), a takeover (claim.lua), a commit
// (SET XX GET, see commit.go), a Get and a Forget (forget.lua), as EVALSHA
// and, the first time, EVAL. It returns the first error, which CredentialsRefused
// recognises when an ACL user may PING but not run what the store needs
// (or not on the prefix's keys). Its writes wait for replicas as a claim's
// do (Config.WaitReplicas), on the connection that wrote them (a WAIT
// after no write would count even a hung replica), so it returns an error
// wrapping dedup.ErrNotReplicated when too few acknowledge. A start-up
// check: it writes.
func (s *Store) CheckCommands(ctx context.Context) error {
	k := dedup.Key{Namespace: probeNamespace, ID: dedup.NewToken()}
	const hold = 10 * time.Second
	step := func(op string, err error) error {
		if err != nil {
			return fmt.Errorf("redisstore: start-up probe: %s: %w", op, err)
		}
		return nil
	}
	res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: hold})
	if err := step("claim", err); err != nil {
		return err
	}
	if err := step("release", s.Release(ctx, k, res.Token, dedup.ReleaseOptions{Retain: hold, Status: 500})); err != nil {
		return err
	}
	if res, err = s.Claim(ctx, k, dedup.ClaimOptions{Lease: hold}); err != nil {
		return step("takeover", err)
	}
	if err := step("commit", s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: hold, Status: 200})); err != nil {
		return err
	}
	if _, err := s.Get(ctx, k); err != nil {
		return step("get", err)
	}
	_, err = s.Forget(ctx, k, dedup.ForgetOptions{})
	return step("forget", err)
}

// evictionRank orders maxmemory policies by the harm they may do to the
// Store's keys: none (noeviction), the keys nearest their end
// (volatile-ttl), any key.
func evictionRank(policy string) int {
	switch policy {
	case "noeviction":
		return 0
	case "volatile-ttl":
		return 1
	}
	return 2
}

// Close implements dedup.Store. Later calls return dedup.ErrClosed. Calls
// already waiting for Redis get their replies first (see pipeliner), then the
// pipeline workers stop. It closes the client when New built it.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if s.nodes != nil {
		s.nodes.close()
	}
	s.pipe.close()
	s.undoMu.Lock()
	s.undoClosed = true
	s.undoMu.Unlock()
	s.undos.Wait() // each is bounded by undoTimeout
	if !s.ownsClient {
		return nil
	}
	if err := s.client.Close(); err != nil {
		return fmt.Errorf("redisstore: close: %w", err)
	}
	return nil
}

// nowMS returns the clock in milliseconds since the epoch, clamped to 0: the
// unit and range of every time the records and scripts hold.
func (s *Store) nowMS() int64 { return max(s.now().UnixMilli(), 0) }

// base36 formats milliseconds the way records store times.
func base36(ms int64) string { return strconv.FormatInt(ms, 36) }

// durationMS rounds d up to whole milliseconds, at least 0.
func durationMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
