package redisstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

// decisionRecord is a record value for claimDecision; odd marks one that
// claimDecision need not decide even where the script changes nothing.
type decisionRecord struct {
	value string
	odd   bool
}

// decisionRecords returns record values covering what claimDecision reads,
// around the instant now: every state letter the scripts know and one they
// do not, expiry before, at and after now, our token and others in aux,
// fingerprint fields absent, empty, hex, raw and missing, and values
// claim.lua cannot parse.
func decisionRecords(now int64, token string) []decisionRecord {
	fpA, fpB := strings.Repeat("a1", 32), "fp raw B"
	claims := []string{
		encodeClaim("", ""),
		encodeClaim(strings.Repeat("cd", 32), fpA),
		encodeClaim("body not hex", fpB),
		encodeClaim("", fpA),
		"\x00",             // the fingerprint field missing: fingerprint() is ""
		"",                 // no claim part at all
		"\x02\x85",         // a raw body whose length runs past the end
		"\x02\xff\xff\xff", // the same, longer
		"\x09tagged",       // an unknown tag: fingerprint() skips one byte
	}
	result := encodeResult(500, "", false, nil)
	var values []decisionRecord
	for _, st := range []string{"p", "d", "f", "x"} {
		for _, exp := range []int64{now - 1000, now - 1, now, now + 1, now + 60_000} {
			for _, aux := range []string{token, "othertoken0", "", base36(now - 5000)} {
				for _, claim := range claims {
					values = append(values, decisionRecord{value: st + "," + base36(now-9000) + "," + base36(exp) + ",3," + aux + "," +
						strconv.Itoa(len(claim)) + "," + claim + result})
				}
			}
		}
	}
	return append(values,
		decisionRecord{value: ""},
		decisionRecord{value: "garbage"},
		decisionRecord{value: "p,1,2,3,tok,2"},                             // no comma after claim_len
		decisionRecord{value: "p,," + base36(now+1) + ",1,tok,2,\x00\x00"}, // empty first_seen
		decisionRecord{value: "pp,1," + base36(now+1) + ",1,tok,2,\x00\x00"},
		decisionRecord{value: "d,1," + base36(now+1) + ",-1,1,2,\x00\x00"},
		decisionRecord{value: "d,1," + base36(now+1) + ",1,a-b,2,\x00\x00"},
		decisionRecord{value: "d,1," + base36(now+1) + ",1,1,99,\x00\x00"},                 // claim_len beyond the value
		decisionRecord{value: "d,1," + strings.ToUpper(base36(now+1)) + ",1,1,2,\x00\x00"}, // upper-case base 36
		decisionRecord{value: "d,1," + base36(now+1) + ",1,1,2,\x00\x00\xff"},              // a result part decodeRecord refuses
		// expires_at beyond int64: Lua reads it as a huge number (live),
		// claimDecision leaves it to the script.
		decisionRecord{value: "d,1,zzzzzzzzzzzzzzzzzz,1,1,2,\x00\x00", odd: true},
	)
}

// TestClaimDecisionMatchesScript runs claim.lua on a real server against
// every record of decisionRecords, with and without a fingerprint to bind,
// and checks claimDecision against it: where claimDecision decides, the
// script returns the same code and the record, unchanged; where it does not,
// the script writes the key or fails.
func TestClaimDecisionMatchesScript(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	const key = "decision"
	now := storetestEpochMS
	token := "0123456789abcdef0123456789abcdef"
	binds := []string{"", string(appendField(nil, strings.Repeat("a1", 32))), string(appendField(nil, "fp raw B")),
		string(appendField(nil, "fp other"))}
	decided := map[int64]int{}
	var fellBack int
	for _, r := range decisionRecords(now, token) {
		value := r.value
		for _, bind := range binds {
			if err := client.Set(ctx, key, value, time.Hour).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
			reply, scriptErr := claimScript.Run(ctx, client, []string{key},
				now, base36(now), base36(now+10_000), 3_600_000, token, encodeClaim("", "fp mine"), bind).Slice()
			after, err := client.Get(ctx, key).Result()
			if err != nil {
				t.Fatalf("GET after the script: %v", err)
			}
			code, ok := claimDecision(value, now, token, bind)
			if !ok {
				fellBack++
				if scriptErr == nil && after == value && !r.odd {
					t.Errorf("claimDecision(%q, bind %q): got no decision, but the script answered %v and left the record unchanged", value, bind, reply)
				}
				continue
			}
			decided[code]++
			if scriptErr != nil {
				t.Errorf("claimDecision(%q, bind %q): got code %d, but the script failed: %v", value, bind, code, scriptErr)
				continue
			}
			gotCode, gotValue, err := claimReply(reply)
			if err != nil || gotCode != code || gotValue != value || after != value {
				t.Errorf("claimDecision(%q, bind %q): got code %d; script: code %d, record %q (%v), stored %q; want the same code and the record unchanged",
					value, bind, code, gotCode, gotValue, err, after)
			}
		}
	}
	// Every decision occurred, and so did fallbacks.
	for _, code := range []int64{claimClaimed, claimDuplicate, claimInFlight, claimConflict} {
		if decided[code] == 0 {
			t.Errorf("decisions with code %d: got none, want some", code)
		}
	}
	if fellBack == 0 {
		t.Errorf("fallbacks to the script: got none, want some")
	}
}

// storetestEpochMS is an instant in 2026, as the conformance suite uses.
var storetestEpochMS = time.Date(2026, time.January, 2, 3, 4, 5, 0, time.UTC).UnixMilli()

// TestNewRecordMatchesScript: the fast path writes, for an absent key, the
// value claim.lua writes, and the Record it returns without parsing is the
// one decodeRecord reads from that value.
func TestNewRecordMatchesScript(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	tests := []struct {
		name     string
		lease    time.Duration
		body, fp string
	}{
		{"no digests", time.Minute, "", ""},
		{"hex digests", 90 * time.Second, strings.Repeat("ab", 32), strings.Repeat("cd", 32)},
		{"raw digests", 1500 * time.Millisecond, "Not,Hex", "fp with spaces"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "new" + strconv.Itoa(i)
			c := &claimCall{key: key, now: storetestEpochMS, leaseMS: durationMS(tt.lease), token: dedup.NewToken(),
				claim: encodeClaim(tt.body, tt.fp), opts: dedup.ClaimOptions{Lease: tt.lease, BodySHA256: tt.body, Fingerprint: tt.fp}}
			reply, err := claimScript.Run(ctx, client, []string{key},
				c.now, base36(c.now), base36(c.now+c.leaseMS), c.ttlMS(), c.token, c.claim, "").Slice()
			if err != nil {
				t.Fatalf("claim script: %v", err)
			}
			code, scriptValue, err := claimReply(reply)
			if err != nil || code != claimClaimed {
				t.Fatalf("claim script: got (%d, %v), want (%d, nil)", code, err, claimClaimed)
			}
			if got := newRecord(c.now, c.now+c.leaseMS, c.token, c.claim); got != scriptValue {
				t.Errorf("newRecord: got %q, want the script's %q", got, scriptValue)
			}
			// The fast path on the absent key: the same value, TTL and Record.
			s := NewFromClient(client, "fast:", Options{})
			t.Cleanup(func() { _ = s.Close() })
			c.key = "fast:" + key
			res, ok, err := s.claimFast(ctx, c)
			if err != nil || !ok || res.Outcome != dedup.Claimed || res.Token != c.token {
				t.Fatalf("claimFast: got (%v, %q, %v, %v), want (claimed, %q, true, nil)", res.Outcome, res.Token, ok, err, c.token)
			}
			if got, _ := client.Get(ctx, c.key).Result(); got != scriptValue {
				t.Errorf("value written by the fast path: got %q, want the script's %q", got, scriptValue)
			}
			ttl, _ := client.PTTL(ctx, c.key).Result()
			if want := time.Duration(c.ttlMS()) * time.Millisecond; ttl <= 0 || ttl > want || ttl < want-time.Minute {
				t.Errorf("TTL set by the fast path: got %s, want just under %s", ttl, want)
			}
			want, err := decodeRecord(scriptValue)
			if err != nil {
				t.Fatalf("decodeRecord: %v", err)
			}
			if !reflect.DeepEqual(res.Record, want) {
				t.Errorf("fast path Record:\ngot  %+v\nwant %+v", res.Record, want)
			}
		})
	}
}

func TestRefusesFastPath(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	if err := client.LPush(ctx, "list", "x").Err(); err != nil {
		t.Fatalf("LPUSH: %v", err)
	}
	// Real replies of this server: an ERR it gives for a SET it cannot
	// parse, as Redis < 7.0 does for NX with GET, and a WRONGTYPE.
	syntaxErr := client.Do(ctx, "set", "k", "v", "nx", "xx").Err()
	wrongType := client.Do(ctx, "set", "list", "v", "nx", "get", "px", 1000).Err()
	noCluster := client.ClusterSlots(ctx).Err() // "ERR This instance has cluster support disabled"
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"syntax error", syntaxErr, true},
		{"wrong type", wrongType, false},
		{"nil reply", redis.Nil, false},
		{"network", errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), false},
		{"context", context.DeadlineExceeded, false},
		{"CLUSTER SLOTS's ERR, finding a key's master", &slotMapError{err: noCluster}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.err == nil {
				t.Fatalf("test bug: no error")
			}
			if got := refusesFastPath(tt.err); got != tt.want {
				t.Errorf("refusesFastPath(%v): got %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func FuzzClaimDecision(f *testing.F) {
	now := storetestEpochMS
	token := "0123456789abcdef0123456789abcdef"
	for _, r := range decisionRecords(now, token)[:40] {
		f.Add(r.value, string(appendField(nil, "fp other")))
	}
	f.Add("d,1,"+base36(now+1)+",1,1,2,\x00\x00", "")
	f.Fuzz(func(t *testing.T, value, bind string) {
		code, ok := claimDecision(value, now, token, bind)
		if !ok {
			return
		}
		// Where decodeRecord also reads the value, both parsers agree on
		// what the decision rests on.
		rec, err := decodeRecord(value)
		if err != nil {
			return
		}
		if rec.ExpiresAt.UnixMilli() < now && code != claimConflict {
			t.Errorf("claimDecision(%q): got code %d for a record that expired at %v", value, code, rec.ExpiresAt)
		}
		switch code {
		case claimDuplicate:
			if rec.State != dedup.StateProcessed {
				t.Errorf("claimDecision(%q): got duplicate for state %q", value, rec.State)
			}
		case claimClaimed, claimInFlight:
			if rec.State != dedup.StateProcessing || (rec.Owner == token) != (code == claimClaimed) {
				t.Errorf("claimDecision(%q): got code %d for state %q owner %q", value, code, rec.State, rec.Owner)
			}
		case claimConflict:
			if bind == "" || rec.Owner == token {
				t.Errorf("claimDecision(%q, bind %q): got conflict", value, bind)
			}
		}
	})
}

// TestRetryable: which failed commits and releases are sent again (see
// "Commit and Release retry" in store.go).
func TestRetryable(t *testing.T) {
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	read := &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}
	tests := []struct {
		name             string
		err              error
		alone, onReplica bool // without and with wait_replicas
	}{
		{"connection refused", fmt.Errorf("redisstore: %w", dial), true, true},
		{"read timeout: maybe applied", read, true, false},
		{"no connection free in the pool", fmt.Errorf("redisstore: %w", redis.ErrPoolTimeout), true, true},
		{"connection lost", io.EOF, true, false},
		{"an error reply", errorReply("ERR dedupgw: undecodable record"), false, false},
		{"a master being demoted", errorReply("READONLY You can't write against a read only replica."), true, true},
		{"a restart loading its data", errorReply("LOADING Redis is loading the dataset in memory"), true, true},
		{"a cluster down", errorReply("CLUSTERDOWN The cluster is down"), true, true},
		{"a cluster resharding", errorReply("TRYAGAIN Multiple keys request during rehashing of slot"), true, true},
		{"a replica without its master", errorReply("MASTERDOWN Link with MASTER is down"), true, true},
		{"the caller's deadline", context.DeadlineExceeded, false, false},
		{"the caller gave up", context.Canceled, false, false},
		{"a closed store", dedup.ErrClosed, false, false},
		{"a closed client", redis.ErrClosed, false, false},
		{"no slot map: could not connect", &slotMapError{err: dial}, true, true},
		{"no slot map: a read timeout", &slotMapError{err: read}, true, true},
		{"no slot map: an error reply", &slotMapError{err: errorReply("NOPERM User has no permissions to run the 'cluster|slots' command")}, false, false},
		{"no slot map: the caller's deadline", &slotMapError{err: context.DeadlineExceeded}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryable(tt.err, false); got != tt.alone {
				t.Errorf("retryable(%v) waiting for no replica: got %v, want %v", tt.err, got, tt.alone)
			}
			if got := retryable(tt.err, true); got != tt.onReplica {
				t.Errorf("retryable(%v) waiting for replicas: got %v, want %v", tt.err, got, tt.onReplica)
			}
		})
	}
}

// errorReply is an error reply from Redis, as go-redis returns one.
type errorReply string

func (e errorReply) Error() string { return string(e) }
func (errorReply) RedisError()     {}

// TestHeldKeysSettleTime: a settle tried again sends its first try's time
// until it is finished; another token's settle has its own; a claim never
// finished is dropped once staleHeld old.
func TestHeldKeysSettleTime(t *testing.T) {
	var h heldKeys
	const t0 = int64(1_700_000_000_000)
	h.claimed("k", dedup.ClaimResult{Outcome: dedup.Claimed, Token: "a"}, t0, "")
	h.claimed("dup", dedup.ClaimResult{Outcome: dedup.Duplicate}, t0, "")
	steps := []struct {
		name       string
		key, token string
		now, want  int64
	}{
		{"the first settle", "k", "a", t0 + 10, t0 + 10},
		{"the same settle tried again", "k", "a", t0 + 5000, t0 + 10},
		{"another token's settle of the key", "k", "b", t0 + 6000, t0 + 6000},
		{"that one tried again", "k", "b", t0 + 7000, t0 + 6000},
		{"a key this store did not claim", "other", "c", t0 + 8000, t0 + 8000},
	}
	for _, st := range steps {
		if got := h.settleTime(st.key, st.token, st.now); got != st.want {
			t.Errorf("%s: got %d, want %d", st.name, got-t0, st.want-t0)
		}
	}
	if h.has("dup") {
		t.Errorf("a duplicate: got held, want not (only claims are held)")
	}
	h.finished("k", "b") // b's settle answered: a still holds k
	if !h.has("k") {
		t.Errorf("finished by a token that does not hold the key: got k dropped, want kept")
	}
	h.finished("k", "a")
	if h.has("k") {
		t.Errorf("finished: got k held, want dropped")
	}
	if got := h.settleTime("k", "b", t0+9000); got != t0+9000 {
		t.Errorf("a settle after finished: got %d, want a time of its own %d", got-t0, 9000)
	}
	h.claimed("fresh", dedup.ClaimResult{Outcome: dedup.Claimed, Token: "d"}, t0+staleHeld.Milliseconds(), "")
	h.settleTime("fresh", "d", t0+staleHeld.Milliseconds()+9001)
	for _, k := range []string{"k", "other"} {
		if h.has(k) {
			t.Errorf("%s, settled %v ago and never finished: got held, want dropped", k, staleHeld)
		}
	}
	if !h.has("fresh") {
		t.Errorf("a claim settled just now: got dropped, want held")
	}
}

// TestHeldKeysSettleTimeOfAnotherToken: a settle by a token that no longer
// holds the key here (an older claim's retry, still under way when this
// Store claimed the key anew) does not take the key's entry from the claim
// that holds it: that claim's retry still sends its first try's time.
func TestHeldKeysSettleTimeOfAnotherToken(t *testing.T) {
	var h heldKeys
	const t0 = int64(1_700_000_000_000)
	h.claimed("k", dedup.ClaimResult{Outcome: dedup.Claimed, Token: "new"}, t0, "")
	if got := h.settleTime("k", "new", t0+10); got != t0+10 {
		t.Fatalf("the new claim's first settle: got %d, want 10", got-t0)
	}
	h.settleTime("k", "old", t0+20) // the older claim's retry
	h.finished("k", "old")          // answered: not the owner
	if got := h.settleTime("k", "new", t0+30); got != t0+10 {
		t.Errorf("the new claim's settle tried again: got %d, want its first try's 10", got-t0)
	}
	if !h.has("k") {
		t.Errorf("after the older claim's settle: got k not held, want held by the new claim")
	}
	h.settleTime("k", "older", t0+40) // never finished
	h.settleTime("x", "y", t0+40+staleHeld.Milliseconds()+1)
	if len(h.others) != 0 {
		t.Errorf("a settle of another token, never finished, %v later: got %d kept, want dropped", staleHeld, len(h.others))
	}
}

// TestHeldKeysPrunesByLastUse: a claim is dropped once staleHeld passed
// since its first settle, not since the claim (a long lease's settle and
// its retries keep their stamp).
func TestHeldKeysPrunesByLastUse(t *testing.T) {
	var h heldKeys
	const t0 = int64(1_700_000_000_000)
	stale := staleHeld.Milliseconds()
	h.claimed("k", dedup.ClaimResult{Outcome: dedup.Claimed, Token: "a"}, t0, "")
	h.settleTime("k", "a", t0+stale-1)
	h.settleTime("x", "y", t0+stale+2*time.Minute.Milliseconds()) // prunes
	if got := h.settleTime("k", "a", t0+stale+3*time.Minute.Milliseconds()); got != t0+stale-1 {
		t.Errorf("a retry %v after the claim, minutes after its first settle: got %d, want the first settle's time", staleHeld, got-t0)
	}
}

// TestDialFailed: only a failure to connect means a claim was never sent;
// a connection cut or timed out after the write may have carried it, and
// must be undone.
func TestDialFailed(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"dial refused", refused, true},
		{"dial refused, wrapped", fmt.Errorf("redisstore: claim: %w", refused), true},
		{"read reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, false},
		{"write broken", &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE}, false},
		{"read timeout", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, false},
		{"EOF", io.EOF, false},
		{"context deadline", context.DeadlineExceeded, false},
	}
	for _, tt := range tests {
		if got := dialFailed(tt.err); got != tt.want {
			t.Errorf("%s: dialFailed(%v): got %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}
