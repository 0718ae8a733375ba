package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// The commit fast path.
//
// commit.lua decides a commit inside one script, and Lua is most of what a
// first delivery costs redis-server: the script, with the GET and SET it
// calls, took 12 µs under the load test where a plain SET takes 2–3. But the
// Store knows the record its own claim wrote (heldKeys keeps it), and from
// it the processed record commit.lua would write. So a commit first sends
// one plain command, allowed since Redis 6.2:
//
//	SET key <the processed record> XX GET PX <window>
//
// The reply is the value the SET replaced. When that is the claim's own
// record, byte for byte, the commit is exactly commit.lua's: only the owner's
// claim writes that value, and nothing changes a processing record but a
// settle or a takeover, which replaces it. A nil reply means the key was
// absent (forgotten, or expired): XX wrote nothing, and the caller is not
// the owner, as with the script. The caller's own processed record means
// the same commit, sent again after a lost reply.
//
// Anything else is a record the commit must not change: another claim's
// lease or record, or a value that is not a record. The SET wrote over it
// all the same, so the Store puts it back at once (restore.lua, only while
// the key still holds what the SET wrote, and with the life that record had
// left by this Store's clock). A value that is not a record gets commit.lua's
// error. For a record, commit.lua then decides, after putBackPause: usually
// it finds the other claim's record and refuses the commit, changing
// nothing, as it would have. Until the put-back, for one round trip, the key
// reads as processed, which it is: this commit's upstream answered 2xx.
//
// When the other claim's owner commits inside that round trip, its own fast
// commit finds this one's record, puts it back and waits as well. Once both
// put-backs landed, whichever landed first, the key holds one of the two
// commits' records or the other claim's lease, and commit.lua commits
// exactly one of them (TestFastCommitsRace): the key ends processed. When
// it settles by script instead (a release, or a commit near its lease's
// end), the script finds this commit's record and refuses it; a Store that
// holds a live claim and is refused asks once more after the same pause
// (see settle), by when the put-back landed
// (TestScriptSettleInsideFastCommitWindow). Only a put-back held up for
// longer than the pause (a process frozen between its SET and its
// put-back) can still leave both refused, with the other claim's lease in
// the key until it lapses, when the event's next copy is forwarded again.
// The same follows when the other claim's own SET NX GET, re-sent after a
// lost reply, lands inside the round trip: it reads this commit's record
// and answers duplicate. And a SET that replaced another claim's record and lost
// its reply is sent again (by go-redis, or the retry below), finds its own
// record and answers committed: the other record stays replaced, by a
// processed one, which is true, and that claim's owner is refused its commit
// or release.
//
// All of that needs another claim in the key while this one's lease is
// live, which needs this claim lost (a failover to a replica its write had
// not reached, an eviction), the key forgotten while in flight (forget with
// in_flight), or a replica taking the lease over as lapsed. Against that
// last one, the fast path runs only while the lease has at least
// commitMargin left by the Store's clock when the SET is queued. A replica
// takes the lease over only once it lapsed by its own clock, so it must run
// ahead by more than the margin less the time the SET then takes to reach
// Redis: it is sent before its caller's deadline (the gateway gives a store
// operation 5 s) or dropped (see pipeliner.send), and the pipeline it
// shares runs under the latest deadline in it (5 s more at most), so with
// a 15 s margin a replica must run more than 5 s ahead, which NTP keeps far
// off. A commit later than that, or one retried that long, runs commit.lua,
// which is atomic however late it lands. So does every later commit of a
// claim whose fast commit met another value, and every commit of a Store
// that turned the claim fast path off (the server refused SET … GET, see
// fastPathOff). While a SET's replacement stands (one round trip), a
// reader sees this commit's processed record: a claim that binds a
// fingerprint may be told of a conflict where it would be in flight, and a
// forget may delete it (even one that keeps keys in flight): the put-back
// then puts a lease back all the same, which is what a forget that keeps
// keys in flight (the admin API's default) does with it; after a forced one
// the lease's delivery goes on as if that forget had come before its claim.
// A processed or failed record it leaves deleted, as the forget would have
// deleted it. A put-back
// that fails (Redis gone, a closed Store) leaves this commit's record in
// place for good, processed by this commit; it is logged.
const commitMargin = 15 * time.Second

// fastCommit is one Commit's fast path: the SET it sends, and what the
// reply is compared with.
type fastCommit struct {
	key, token string
	claimed    string // the record the claim wrote
	record     string // the processed record the SET writes
	leaseUntil int64  // the claim's lease end, ms
	windowMS   int64
}

// newFastCommit returns the fast path of a Commit of key by token writing
// result, completed at at (base 36) and expiring at expiresAt (ms) after
// windowMS, the arguments the Commit gives commit.lua; nil when this Store
// does not know the record the claim wrote, or cannot take the fast path.
func (s *Store) newFastCommit(key, token, at string, expiresAt, windowMS int64, result string) *fastCommit {
	if s.scriptOnly.Load() {
		return nil
	}
	claimed := s.held.record(key, token)
	if claimed == "" {
		return nil
	}
	record, leaseUntil, ok := processedRecord(claimed, at, expiresAt, result)
	if !ok {
		return nil
	}
	return &fastCommit{key: key, token: token, claimed: claimed, record: record, leaseUntil: leaseUntil, windowMS: windowMS}
}

// processedRecord returns the record commit.lua writes over the processing
// record claimed (the claim's first_seen, attempts and claim part; completed
// at at, expiring at expiresAt, with result), and the claim's lease end. It
// reports false for a value that is not a processing record.
func processedRecord(claimed, at string, expiresAt int64, result string) (record string, leaseUntil int64, ok bool) {
	h, ok := parseClaimHeader(claimed)
	if !ok || h.state != 'p' {
		return "", 0, false
	}
	var b strings.Builder
	b.Grow(len(h.first) + len(h.attempts) + len(at) + len(h.claim) + len(result) + 32)
	b.WriteString("d,")
	b.WriteString(h.first)
	b.WriteByte(',')
	b.WriteString(base36(expiresAt))
	b.WriteByte(',')
	b.WriteString(h.attempts)
	b.WriteByte(',')
	b.WriteString(at)
	b.WriteByte(',')
	b.WriteString(strconv.Itoa(len(h.claim)))
	b.WriteByte(',')
	b.WriteString(h.claim)
	b.WriteString(result)
	return b.String(), h.expires, true
}

// usable reports whether the fast path may be taken at now (ms): while the
// claim's lease has commitMargin left (see above).
func (fc *fastCommit) usable(now int64) bool {
	return fc != nil && now+commitMargin.Milliseconds() <= fc.leaseUntil
}

// fastOutcome is what became of a commit's fast path.
type fastOutcome int

const (
	// fastAnswered: the reply (or error) is the commit's answer.
	fastAnswered fastOutcome = iota
	// fastRefused: the server refused the command, and wrote nothing:
	// commit.lua decides, now.
	fastRefused
	// fastPutBack: the SET replaced another claim's record, now put back:
	// commit.lua decides, after putBackPause.
	fastPutBack
)

// putBackPause is how long a commit whose SET replaced another claim's
// record waits, once it put that back, before commit.lua decides it. The
// other record may be there only for a moment: another fast commit of the
// same key that replaced this claim's own record an instant before, which
// is putting it back too. Deciding from what the SET found would then
// refuse both commits, or leave the other claim's lease where this one's
// processed record belongs; commit.lua, once both put-backs landed, reads
// the key as it stands and decides atomically.
const putBackPause = 100 * time.Millisecond

// commitFast sends fc's SET. For fastAnswered it returns what commit.lua
// would: 1 when committed (also when repeated), 0 when the caller is not
// the owner, or an error, with the replicas' verdict (see
// pipeliner.runWaited).
func (s *Store) commitFast(ctx context.Context, fc *fastCommit) (n int64, waitErr, err error, next fastOutcome) {
	cmd, waitErr := s.commandWaited(ctx, fc.key, "set", fc.key, fc.record, "xx", "get", "px", fc.windowMS)
	old, err := cmd.Result()
	switch {
	case isNil(err):
		return 0, waitErr, nil, fastAnswered // absent: XX wrote nothing
	case err != nil:
		if refusesFastPath(err) {
			s.fastPathOff(err)
			return 0, nil, nil, fastRefused
		}
		return 0, waitErr, err, fastAnswered
	case old == fc.claimed || old == fc.record:
		return 1, waitErr, nil, fastAnswered
	}
	// The SET replaced a value the commit must not change. This claim's
	// later commits (the gateway's retries in the background) run
	// commit.lua: the key is not as the claim left it.
	s.held.dropRecord(fc.key, fc.token)
	h, isRecord := parseClaimHeader(old)
	s.restore(ctx, fc, old, h, isRecord)
	switch {
	case !isRecord:
		return 0, waitErr, errNotRecord, fastAnswered
	case sameCommit(old, fc.record):
		// This commit, applied by an earlier try whose reply was lost
		// (put back above with its own expiry, as commit.lua keeps it).
		return 1, waitErr, nil, fastAnswered
	}
	return 0, waitErr, nil, fastPutBack
}

// errNotRecord is the fast path's answer where commit.lua answers "ERR
// dedupgw: undecodable record": the key holds a value that is not a record.
var errNotRecord = errors.New("dedupgw: undecodable record")

// restore puts old back in fc's key, which fc's SET replaced, if the key
// still holds what the SET wrote (or, for a lease, nothing: see
// restore.lua); h is old's header, when isRecord. It gives old the life it
// had left: a processing record keeps its
// lease plus leaseGrace, others live to their expires_at (see claim.lua,
// commit.lua and release.lua). It runs under its own
// timeout, as the caller's context may be spent. A failure is logged: the
// key then keeps this commit's processed record.
func (s *Store) restore(ctx context.Context, fc *fastCommit, old string, h claimHeader, isRecord bool) {
	var ttl int64 // unknown: keep the SET's
	lease := "0"
	if isRecord {
		end := h.expires
		if h.state == 'p' {
			end += leaseGrace.Milliseconds()
			lease = "1"
		}
		ttl = max(end-s.nowMS(), 1)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	cmd, _ := s.runWaited(ctx, restoreScript, fc.key, fc.record, old, ttl, lease)
	if err := cmd.Err(); err != nil {
		s.log.Warn("commit wrote over another claim's record and could not put it back: the key stays processed by this commit",
			zap.Error(err))
	}
}

// sameCommit reports whether old is rec but for its expires_at: the same
// processed record, written by an earlier try of the same commit.
func sameCommit(old, rec string) bool {
	oi, ok1 := fieldStart(old, 2)
	ri, ok2 := fieldStart(rec, 2)
	oj, ok3 := fieldStart(old, 3)
	rj, ok4 := fieldStart(rec, 3)
	return ok1 && ok2 && ok3 && ok4 && old[:oi] == rec[:ri] && old[oj-1:] == rec[rj-1:]
}

// fieldStart returns where the n-th comma-separated field of s starts
// (0 first).
func fieldStart(s string, n int) (int, bool) {
	i := 0
	for range n {
		j := strings.IndexByte(s[i:], ',')
		if j < 0 {
			return 0, false
		}
		i += j + 1
	}
	return i, true
}
