package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

// The claim fast path.
//
// claim.lua is the authority on claims, but running Lua costs redis-server
// several µs per call, and most claims need no script: the key is absent (a
// first delivery), or its live record decides the claim without changing it
// (a duplicate, a held lease, a fingerprint conflict). So Claim first sends
// one plain command, allowed since Redis 7.0:
//
//	SET key <the record claim.lua writes for an absent key> NX GET PX <ttl>
//
// A nil reply means the key was absent and is now claimed, exactly as the
// script would have claimed it. A string reply is the record Redis holds,
// unchanged by the SET; claimDecision decides it in Go by the script's rule
// when the script would not change it, and otherwise (a lapsed lease to take
// over, a retained failure, an expired record Redis has not dropped yet,
// anything unusual) Claim runs claim.lua, as before, in a second round trip.
// Both commands are single-key, so they work on a Cluster and behind Sentinel,
// and both are safe to re-send: a SET NX GET repeated after a lost reply finds
// the caller's own token and answers Claimed, like the script.
//
// A server that refuses the combination (Redis < 7.0 answers "ERR syntax
// error") turns the fast path off for the Store's lifetime: that claim and
// every later one run claim.lua alone, and every commit commit.lua.

// heldKeys are the Redis keys this Store claimed and has not yet committed
// or released, with the claim's token. A claim of such a key (a copy of an
// event arriving while this gateway's own delivery of it is in flight) goes
// straight to claim.lua: the key is either busy, which the script answers
// in one round trip like the fast path, or its lease lapsed and is taken
// over, which the fast path answers only in two. Leases lapse when the
// store is slow, so that second round trip would come exactly when it
// costs most (chaos.TestSlowCommitAfterLease). The gateway always ends a
// claim with a Commit or a Release, so the set is bounded by the deliveries
// in flight, and by the settles that failed (see settleTime) until they
// are staleHeld old.
type heldKeys struct {
	mu sync.Mutex
	m  map[string]heldClaim // by Redis key
	// others are the stamps of settles by a token that does not hold its
	// key in m (an older claim's retry, still under way when this Store
	// claimed the key anew): kept apart, so they do not take the key's
	// entry, and its stamp, from the claim that holds it.
	others map[heldID]heldClaim
	// pruned is when settleTime last dropped stale stamps (store clock, ms).
	pruned int64
}

// heldClaim is one held key's claim: its token, when it was claimed, and
// the time of the first Commit or Release of it, once one was sent.
type heldClaim struct {
	token    string
	since    int64 // ms
	settleAt int64 // ms; 0 before the first settle
	// record is the value the claim wrote, exactly, for the commit fast
	// path (see commit.go); "" when not known.
	record string
	// leaseUntil is the claim's lease end (ms); 0 when not known.
	leaseUntil int64
}

// staleHeld is how long a claim not finished stays held: longer than any
// lease the gateway forwards and retries a failed settle in. A claim kept
// longer is dropped; a caller that still settles it then sends a time of
// its own.
const staleHeld = leaseGrace

// heldID names a settle in heldKeys.others: its Redis key and token.
type heldID struct{ key, token string }

// claimed records res's claim of key at now (ms), if res claimed it by
// writing record.
func (h *heldKeys) claimed(key string, res dedup.ClaimResult, now int64, record string) {
	if res.Outcome != dedup.Claimed {
		return
	}
	h.mu.Lock()
	if h.m == nil {
		h.m = make(map[string]heldClaim)
	}
	h.m[key] = heldClaim{token: res.Token, since: now, record: record, leaseUntil: res.Record.LeaseUntil.UnixMilli()}
	h.mu.Unlock()
}

// settleTime returns the completed_at a Commit or Release of key by token
// sends: now for the first, and the first's for one after it. A settle
// whose reply was lost may still have been applied (a timeout while Redis
// stalled, a connection cut after the write), and its caller tries again
// later (the gateway's background retry): the same completed_at lets
// commit.lua and release.lua take that try for a repeat of the applied
// one, where a later one would read as another owner's write, and the
// caller would report a lost lease for an event that is recorded. The
// expiry each try sends counts from its own now, so a window shorter than
// the retries does not write a record already expired. Stamps of settles
// not finished (see finished) are dropped once staleHeld old, checked
// once a minute.
func (h *heldKeys) settleTime(key, token string, now int64) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[string]heldClaim)
	}
	if now-h.pruned > time.Minute.Milliseconds() {
		for k, c := range h.m {
			if now-max(c.since, c.settleAt) > staleHeld.Milliseconds() {
				delete(h.m, k)
			}
		}
		for id, c := range h.others {
			if now-c.settleAt > staleHeld.Milliseconds() {
				delete(h.others, id)
			}
		}
		h.pruned = now
	}
	c, ok := h.m[key]
	switch {
	case ok && c.token != token:
		// Held here by another claim: the stamp is kept apart.
		id := heldID{key, token}
		o, ok := h.others[id]
		if !ok {
			if h.others == nil {
				h.others = make(map[heldID]heldClaim)
			}
			o = heldClaim{token: token, since: now, settleAt: now}
			h.others[id] = o
		}
		return o.settleAt
	case !ok:
		// Not claimed by this Store (another process's, or a Store opened
		// since): stamped all the same, for the caller's retry.
		c = heldClaim{token: token, since: now}
	}
	if c.settleAt == 0 {
		c.settleAt = now
	}
	h.m[key] = c
	return c.settleAt
}

// finished forgets key's claim by token: a Commit or Release of it ended
// with an answer (done, or not the owner), so no retry of it follows.
func (h *heldKeys) finished(key, token string) {
	h.mu.Lock()
	if h.m[key].token == token {
		delete(h.m, key)
	}
	delete(h.others, heldID{key, token})
	h.mu.Unlock()
}

// record returns the record token's claim of key wrote, if this Store
// holds that claim and knows it; else "".
func (h *heldKeys) record(key, token string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c, ok := h.m[key]; ok && c.token == token {
		return c.record
	}
	return ""
}

// dropRecord forgets the record token's claim of key wrote, so that later
// commits of that claim run commit.lua.
func (h *heldKeys) dropRecord(key, token string) {
	h.mu.Lock()
	if c, ok := h.m[key]; ok && c.token == token {
		c.record = ""
		h.m[key] = c
	}
	h.mu.Unlock()
}

// live reports whether this Store holds token's claim of key and its lease
// is live at now (ms).
func (h *heldKeys) live(key, token string, now int64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.m[key]
	return ok && c.token == token && now < c.leaseUntil
}

func (h *heldKeys) has(key string) bool {
	h.mu.Lock()
	_, ok := h.m[key]
	h.mu.Unlock()
	return ok
}

// claimCall is one Claim's arguments, shared by the fast path and the script.
type claimCall struct {
	key     string // the Redis key
	now     int64  // the caller's clock, ms
	leaseMS int64
	token   string // the new owner token
	claim   string // the claim part (body SHA-256, fingerprint)
	bind    string // the fingerprint field to bind the key to, or ""
	opts    dedup.ClaimOptions
	// record is the value the claim wrote, once it claimed the key.
	record string
	// waitErr is the replicas' verdict on the last command sent for the
	// claim (see pipeliner.runWaited): nil when enough acknowledged it.
	waitErr error
}

// ttlMS is the Redis TTL of a new processing record: the lease plus the grace
// during which a lapsed claim's history survives (claim.lua's ARGV[4]).
func (c *claimCall) ttlMS() int64 { return c.leaseMS + leaseGrace.Milliseconds() }

// claimFast runs c as SET NX GET. It reports false, with no error, when the
// claim must run claim.lua instead: the record found is one the script would
// change, or the server refused the command.
func (s *Store) claimFast(ctx context.Context, c *claimCall) (dedup.ClaimResult, bool, error) {
	leaseUntil := c.now + c.leaseMS
	value := newRecord(c.now, leaseUntil, c.token, c.claim)
	cmd, waitErr := s.commandWaited(ctx, c.key, "set", c.key, value, "nx", "get", "px", c.ttlMS())
	c.waitErr = waitErr
	old, err := cmd.Result()
	if isNil(err) {
		c.record = value
		// The key was absent: it now holds value. This is the record
		// decodeRecord(value) returns, built without parsing.
		first, until := time.UnixMilli(c.now).UTC(), time.UnixMilli(leaseUntil).UTC()
		return dedup.ClaimResult{Outcome: dedup.Claimed, Token: c.token, Record: dedup.Record{
			State: dedup.StateProcessing, FirstSeen: first, LeaseUntil: until, ExpiresAt: until,
			Attempts: 1, BodySHA256: c.opts.BodySHA256, Fingerprint: c.opts.Fingerprint, Owner: c.token,
		}}, true, nil
	}
	if err != nil {
		if refusesFastPath(err) {
			s.fastPathOff(err)
			return dedup.ClaimResult{}, false, nil
		}
		return dedup.ClaimResult{}, false, err
	}
	code, ok := claimDecision(old, c.now, c.token, c.bind)
	if !ok {
		return dedup.ClaimResult{}, false, nil
	}
	if code == claimClaimed {
		c.record = old // our own, written by this SET's first sending
	}
	res, err := claimResult(code, old, c.token)
	return res, true, err
}

// newRecord returns the value claim.lua writes for an absent key: a
// processing record, first seen now, attempt 1, no result part.
func newRecord(now, leaseUntil int64, token, claim string) string {
	var b strings.Builder
	b.Grow(2*9 + len(token) + len(claim) + 16)
	b.WriteString("p,")
	b.WriteString(base36(now))
	b.WriteByte(',')
	b.WriteString(base36(leaseUntil))
	b.WriteString(",1,")
	b.WriteString(token)
	b.WriteByte(',')
	b.WriteString(strconv.Itoa(len(claim)))
	b.WriteByte(',')
	b.WriteString(claim)
	return b.String()
}

// claimDecision is claim.lua's rule, in Go, for the claims the script
// answers without writing: given the record value a key holds, the caller's
// clock now (ms), its owner token and the fingerprint field it binds the key
// to (or ""), the script's ARGV[1], ARGV[5] and ARGV[7], it returns the
// script's result code and true when the script would return that code with
// the record unchanged:
//
//   - claimConflict: bind is set, the record is live or a lapsed lease, is
//     not ours, and its fingerprint field is neither missing, empty nor bind;
//   - claimDuplicate: a live processed record;
//   - claimClaimed: a live lease with our own token (a re-sent claim);
//   - claimInFlight: a live lease with another token.
//
// It returns false for every record the script would change (a lapsed lease
// or a live failed record to take over, an expired record to start over) or
// reject, and for values it cannot read exactly as the script reads them:
// the caller then runs claim.lua, which stays the one place that writes a
// claimed record over an existing one. The two must follow the same rule; a
// change to either changes both (claim.lua points here).
func claimDecision(value string, now int64, token, bind string) (int64, bool) {
	h, ok := parseClaimHeader(value)
	if !ok {
		return 0, false
	}
	// A record is expired once now is past its expires_at.
	live := h.expires >= now
	lapsed := h.state == 'p' && !live
	if bind != "" && (live || lapsed) && h.aux != token {
		fp, ok := claimFingerprint(h.claim)
		if !ok {
			return 0, false
		}
		if fp != "" && fp != "\x00" && fp != bind {
			return claimConflict, true
		}
	}
	if live && h.state == 'd' {
		return claimDuplicate, true
	}
	if live && h.state == 'p' {
		if h.aux == token {
			return claimClaimed, true
		}
		return claimInFlight, true
	}
	return 0, false
}

// claimHeader is what claim.lua (and commit.lua) reads of a record.
type claimHeader struct {
	state    byte
	first    string // first_seen, base 36, as written
	expires  int64
	attempts string // as written
	aux      string
	claim    string // the claim part, cut as string.sub cuts it
}

// parseClaimHeader reads value as claim.lua's pattern
// '^(%a),(%w+),(%w+),(%d+),(%w*),(%d+),()' does (ASCII letters and digits:
// Redis runs Lua in the C locale), and cuts the claim part as string.sub
// does: at most claim_len bytes. It reports false where the pattern does not
// match, and where Lua's numbers could differ from Go's: an expires_at or a
// claim_len beyond int64.
func parseClaimHeader(value string) (claimHeader, bool) {
	var h claimHeader
	var f [6]string
	rest := value
	for i := range f {
		j := strings.IndexByte(rest, ',')
		if j < 0 {
			return h, false
		}
		f[i], rest = rest[:j], rest[j+1:]
	}
	if len(f[0]) != 1 || !isAlpha(f[0][0]) ||
		f[1] == "" || !allAlnum(f[1]) || f[2] == "" || !allAlnum(f[2]) ||
		!allDigits(f[3]) || !allAlnum(f[4]) || !allDigits(f[5]) {
		return h, false
	}
	expires, err1 := strconv.ParseInt(f[2], 36, 64)
	claimLen, err2 := strconv.ParseInt(f[5], 10, 64)
	if err1 != nil || err2 != nil {
		return h, false
	}
	h.state, h.first, h.expires, h.attempts, h.aux = f[0][0], f[1], expires, f[3], f[4]
	h.claim = rest[:min(claimLen, int64(len(rest)))]
	return h, true
}

// claimFingerprint returns what claim.lua's fingerprint(claim) returns: the
// bytes after the body field. It reports false where the script's loop would
// fail (a varint running past the end) or its doubles could differ from Go's
// integers (a varint longer than 7 bytes).
func claimFingerprint(claim string) (string, bool) {
	i := 1 // the byte after the tag; also for an empty claim or an unknown tag
	if claim != "" {
		switch claim[0] {
		case fieldHex:
			i = 33
		case fieldRaw:
			var n uint64
			for shift := 0; ; shift += 7 {
				if i >= len(claim) || shift > 42 {
					return "", false
				}
				b := claim[i]
				i++
				n |= uint64(b&0x7f) << shift
				if b < 0x80 {
					break
				}
			}
			if n >= uint64(len(claim)) {
				return "", true
			}
			i += int(n)
		}
	}
	if i >= len(claim) {
		return "", true
	}
	return claim[i:], true
}

func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func allAlnum(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlpha(c) && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isNil reports whether err is redis.Nil itself, a nil reply: GET of an
// absent key, a SET NX GET that set. Not errors.Is: go-redis's Sentinel
// client joins the sentinels' own nil answers to "which master has this
// name?" into its "all sentinels ... are unreachable" error, and a claim
// that took that for a nil reply took the key as claimed although nothing
// was sent (a misspelt master_name turned deduplication off, silently).
func isNil(err error) bool {
	return err == redis.Nil //nolint:errorlint // see above
}

// refusesFastPath reports whether err is a server's answer that it does not
// accept SET … NX GET: a generic "ERR" error reply, as Redis before 7.0 gives
// ("ERR syntax error"). Network errors, redis.Nil and the typed replies
// (WRONGTYPE, OOM, READONLY, LOADING, NOPERM…) are not: a claim with the
// script would meet them as well. Nor is a command never sent, whatever
// error it wraps: a *slotMapError may carry CLUSTER SLOTS's own "ERR".
func refusesFastPath(err error) bool {
	var rerr redis.Error
	if isNil(err) || !errors.As(err, &rerr) || redis.IsMaxClientsError(err) || nothingSent(err) {
		return false
	}
	return strings.HasPrefix(rerr.Error(), "ERR")
}

// fastPathOff makes every later claim run claim.lua alone, and every later
// commit commit.lua (see commit.go), and logs why once.
func (s *Store) fastPathOff(err error) {
	if s.scriptOnly.Swap(true) {
		return
	}
	s.log.Warn("fast path off: the server refused SET … GET (the claim's SET NX GET needs Redis 7.0 or later); every claim and commit now runs its Lua script",
		zap.Error(err))
}

// claimScript runs c with claim.lua.
func (s *Store) claimScript(ctx context.Context, c *claimCall) (dedup.ClaimResult, error) {
	cmd, waitErr := s.runWaited(ctx, claimScript, c.key,
		c.now, base36(c.now), base36(c.now+c.leaseMS),
		c.ttlMS(), c.token, c.claim, c.bind,
	)
	c.waitErr = waitErr
	reply, err := cmd.Slice()
	if err != nil {
		return dedup.ClaimResult{}, err
	}
	code, value, err := claimReply(reply)
	if err != nil {
		return dedup.ClaimResult{}, err
	}
	if code == claimClaimed || code == claimTookOver {
		c.record = value
	}
	return claimResult(code, value, c.token)
}

// claimReply splits the claim script's {code, record} reply.
func claimReply(reply []any) (int64, string, error) {
	if len(reply) != 2 {
		return 0, "", fmt.Errorf("script reply has %d elements, want 2", len(reply))
	}
	code, ok1 := reply[0].(int64)
	value, ok2 := reply[1].(string)
	if !ok1 || !ok2 {
		return 0, "", fmt.Errorf("script reply is (%T, %T), want (int64, string)", reply[0], reply[1])
	}
	return code, value, nil
}

// claimResult turns a result code and the record value that goes with it
// into a ClaimResult; token is the claim's owner token.
func claimResult(code int64, value, token string) (dedup.ClaimResult, error) {
	rec, err := decodeRecord(value)
	if err != nil {
		return dedup.ClaimResult{}, err
	}
	res := dedup.ClaimResult{Record: rec}
	switch code {
	case claimClaimed:
		res.Outcome, res.Token = dedup.Claimed, token
	case claimTookOver:
		res.Outcome, res.Token, res.TookOver = dedup.Claimed, token, true
	case claimDuplicate:
		res.Outcome = dedup.Duplicate
	case claimInFlight:
		res.Outcome = dedup.InFlight
	case claimConflict:
		res.Outcome = dedup.Conflict
	default:
		return dedup.ClaimResult{}, fmt.Errorf("unknown result code %d", code)
	}
	return res, nil
}
