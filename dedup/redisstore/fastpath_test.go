package redisstore_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

// Round trips as countingHook names them: the claim fast path's SET NX GET,
// and a script.
const (
	tripSet     = "pipeline[set]"
	tripEvalSHA = "pipeline[evalsha]"
)

// replaySetHook, while on, sends every pipeline that carries a SET twice, as
// go-redis does when it retries a pipeline whose reply was lost after Redis
// ran it.
type replaySetHook struct{ on atomic.Bool }

func (h *replaySetHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *replaySetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *replaySetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.on.Load() && slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return c.Name() == "set" }) {
			_ = next(ctx, cmds)
		}
		return next(ctx, cmds)
	}
}

// TestClaimFastPath: each decision the SET NX GET fast path makes, and the
// takeovers it leaves to claim.lua, on a real server with the store's clock
// injected. The round trips show which way a claim went: one SET alone is
// the fast path; a SET then an EVALSHA is a fallback to the script.
func TestClaimFastPath(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	hook := &countingHook{}
	client.AddHook(hook)
	replay := &replaySetHook{}
	client.AddHook(replay)
	clk := storetest.NewFakeClock(storetest.Epoch)
	prefix := uniquePrefix()
	s := redisstore.NewFromClient(client, prefix, redisstore.Options{Now: clk.Now})
	t.Cleanup(func() { _ = s.Close() })
	// other is another replica: the set-ups claim through it, so that s
	// holds no claim of the key under test (a key s holds goes straight to
	// claim.lua: see the "held" cases).
	other := redisstore.NewFromClient(client, prefix, redisstore.Options{Now: clk.Now})
	t.Cleanup(func() { _ = other.Close() })
	ctx := context.Background()

	const lease = 10 * time.Second
	claimOn := func(t *testing.T, st *redisstore.Store, k dedup.Key, opts dedup.ClaimOptions) dedup.ClaimResult {
		t.Helper()
		if opts.Lease == 0 {
			opts.Lease = lease
		}
		res, err := st.Claim(ctx, k, opts)
		if err != nil {
			t.Fatalf("Claim(%s): got error %v, want nil", k, err)
		}
		return res
	}
	claim := func(t *testing.T, k dedup.Key, opts dedup.ClaimOptions) dedup.ClaimResult {
		t.Helper()
		return claimOn(t, other, k, opts)
	}
	// Warm up: load claim.lua (a takeover), release.lua and commit.lua, so
	// that every script below costs one EVALSHA.
	warm := dedup.Key{Namespace: "warm", ID: "1"}
	res := claimOn(t, s, warm, dedup.ClaimOptions{})
	if err := s.Release(ctx, warm, res.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 500}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	res = claimOn(t, s, warm, dedup.ClaimOptions{})
	if err := s.Commit(ctx, warm, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
		t.Fatalf("Commit: %v", err)
	}

	body := strings.Repeat("ef", 32)
	fpA, fpB := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	resp := &dedup.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)}
	tests := []struct {
		name   string
		setup  func(t *testing.T, k dedup.Key) // leaves k in the state under test
		opts   dedup.ClaimOptions
		replay bool // send the claim's SET twice
		want   dedup.Outcome
		trips  []string
		// check looks at the result; first is when setup first claimed k.
		check func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time)
	}{
		{
			name: "absent: claimed", opts: dedup.ClaimOptions{BodySHA256: body},
			want: dedup.Claimed, trips: []string{tripSet},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, _ time.Time) {
				now := clk.Now()
				want := dedup.Record{State: dedup.StateProcessing, FirstSeen: now, LeaseUntil: now.Add(lease), ExpiresAt: now.Add(lease),
					Attempts: 1, BodySHA256: body, Owner: res.Token}
				wantRecord(t, res.Record, want)
			},
		},
		{
			name: "processed: duplicate with the record",
			setup: func(t *testing.T, k dedup.Key) {
				res := claim(t, k, dedup.ClaimOptions{BodySHA256: body})
				clk.Advance(time.Second)
				if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 201, Response: resp}); err != nil {
					t.Fatalf("Commit: %v", err)
				}
				clk.Advance(time.Second)
			},
			want: dedup.Duplicate, trips: []string{tripSet},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				done := first.Add(time.Second)
				wantRecord(t, res.Record, dedup.Record{State: dedup.StateProcessed, FirstSeen: first, CompletedAt: done,
					ExpiresAt: done.Add(time.Hour), Attempts: 1, LastStatus: 201, BodySHA256: body, Response: resp})
			},
		},
		{
			name: "another token's live lease: in flight",
			setup: func(t *testing.T, k dedup.Key) {
				claim(t, k, dedup.ClaimOptions{})
				clk.Advance(lease - time.Second)
			},
			want: dedup.InFlight, trips: []string{tripSet},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				if res.Record.Owner == "" || res.Record.Owner == res.Token {
					t.Errorf("in-flight record: got owner %q (token %q), want the first claim's", res.Record.Owner, res.Token)
				}
				wantRecord(t, res.Record, dedup.Record{State: dedup.StateProcessing, FirstSeen: first, LeaseUntil: first.Add(lease),
					ExpiresAt: first.Add(lease), Attempts: 1, Owner: res.Record.Owner})
			},
		},
		{
			name: "own token (the SET re-sent after a lost reply): claimed", replay: true,
			want: dedup.Claimed, trips: []string{tripSet},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, _ time.Time) {
				now := clk.Now()
				wantRecord(t, res.Record, dedup.Record{State: dedup.StateProcessing, FirstSeen: now, LeaseUntil: now.Add(lease),
					ExpiresAt: now.Add(lease), Attempts: 1, Owner: res.Token})
			},
		},
		{
			name: "live lease bound to another fingerprint: conflict",
			setup: func(t *testing.T, k dedup.Key) {
				claim(t, k, dedup.ClaimOptions{Fingerprint: fpA, BindFingerprint: true})
				clk.Advance(time.Second)
			},
			opts: dedup.ClaimOptions{Fingerprint: fpB, BindFingerprint: true},
			want: dedup.Conflict, trips: []string{tripSet},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				wantRecord(t, res.Record, dedup.Record{State: dedup.StateProcessing, FirstSeen: first, LeaseUntil: first.Add(lease),
					ExpiresAt: first.Add(lease), Attempts: 1, Fingerprint: fpA, Owner: res.Record.Owner})
			},
		},
		{
			name: "lapsed lease bound to another fingerprint: conflict",
			setup: func(t *testing.T, k dedup.Key) {
				claim(t, k, dedup.ClaimOptions{Fingerprint: fpA, BindFingerprint: true})
				clk.Advance(lease + time.Second)
			},
			opts: dedup.ClaimOptions{Fingerprint: fpB, BindFingerprint: true},
			want: dedup.Conflict, trips: []string{tripSet},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				if res.Record.Fingerprint != fpA || res.Record.Attempts != 1 {
					t.Errorf("conflict record: got fingerprint %.8q, attempts %d; want %.8q, 1", res.Record.Fingerprint, res.Record.Attempts, fpA)
				}
			},
		},
		{
			name: "lapsed lease: claim.lua takes over, keeping first_seen and counting attempts",
			setup: func(t *testing.T, k dedup.Key) {
				claim(t, k, dedup.ClaimOptions{})
				clk.Advance(lease + time.Second)
			},
			want: dedup.Claimed, trips: []string{tripSet, tripEvalSHA},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				now := clk.Now()
				wantRecord(t, res.Record, dedup.Record{State: dedup.StateProcessing, FirstSeen: first, LeaseUntil: now.Add(lease),
					ExpiresAt: now.Add(lease), Attempts: 2, MaybeProcessed: true, Owner: res.Token})
			},
		},
		{
			name: "live failed record: claim.lua takes over, keeping first_seen, attempts and the last status",
			setup: func(t *testing.T, k dedup.Key) {
				res := claim(t, k, dedup.ClaimOptions{})
				clk.Advance(time.Second)
				if err := s.Release(ctx, k, res.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 503}); err != nil {
					t.Fatalf("Release: %v", err)
				}
				clk.Advance(time.Second)
			},
			want: dedup.Claimed, trips: []string{tripSet, tripEvalSHA},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				now := clk.Now()
				wantRecord(t, res.Record, dedup.Record{State: dedup.StateProcessing, FirstSeen: first, LeaseUntil: now.Add(lease),
					ExpiresAt: now.Add(lease), Attempts: 2, LastStatus: 503, Owner: res.Token})
			},
		},
		{
			name: "processed record past its window, still in Redis: claim.lua starts over",
			setup: func(t *testing.T, k dedup.Key) {
				res := claim(t, k, dedup.ClaimOptions{})
				if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Minute, Status: 200}); err != nil {
					t.Fatalf("Commit: %v", err)
				}
				clk.Advance(time.Minute + time.Second) // Redis's own TTL runs on the real clock
			},
			want: dedup.Claimed, trips: []string{tripSet, tripEvalSHA},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, _ time.Time) {
				now := clk.Now()
				wantRecord(t, res.Record, dedup.Record{State: dedup.StateProcessing, FirstSeen: now, LeaseUntil: now.Add(lease),
					ExpiresAt: now.Add(lease), Attempts: 1, Owner: res.Token})
			},
		},
		{
			name: "held by this store, live lease: claim.lua answers in flight in one round trip",
			setup: func(t *testing.T, k dedup.Key) {
				claimOn(t, s, k, dedup.ClaimOptions{})
				clk.Advance(time.Second)
			},
			want: dedup.InFlight, trips: []string{tripEvalSHA},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				wantRecord(t, res.Record, dedup.Record{State: dedup.StateProcessing, FirstSeen: first, LeaseUntil: first.Add(lease),
					ExpiresAt: first.Add(lease), Attempts: 1, Owner: res.Record.Owner})
			},
		},
		{
			name: "held by this store, lapsed lease: claim.lua takes over in one round trip",
			setup: func(t *testing.T, k dedup.Key) {
				claimOn(t, s, k, dedup.ClaimOptions{})
				clk.Advance(lease + time.Second)
			},
			want: dedup.Claimed, trips: []string{tripEvalSHA},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				now := clk.Now()
				wantRecord(t, res.Record, dedup.Record{State: dedup.StateProcessing, FirstSeen: first, LeaseUntil: now.Add(lease),
					ExpiresAt: now.Add(lease), Attempts: 2, MaybeProcessed: true, Owner: res.Token})
			},
		},
		{
			name: "a Commit whose context had ended leaves the claim held (the caller tries again): the script",
			setup: func(t *testing.T, k dedup.Key) {
				res := claimOn(t, s, k, dedup.ClaimOptions{})
				done, cancel := context.WithCancel(ctx)
				cancel()
				if err := s.Commit(done, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err == nil {
					t.Fatal("Commit with an ended context: got nil, want its error")
				}
			},
			want: dedup.InFlight, trips: []string{tripEvalSHA},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				if res.Record.State != dedup.StateProcessing {
					t.Errorf("record: got state %v, want processing (the commit never ran)", res.Record.State)
				}
			},
		},
		{
			name: "released by this store: the fast path again",
			setup: func(t *testing.T, k dedup.Key) {
				res := claimOn(t, s, k, dedup.ClaimOptions{})
				if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
					t.Fatalf("Commit: %v", err)
				}
			},
			want: dedup.Duplicate, trips: []string{tripSet},
			check: func(t *testing.T, k dedup.Key, res dedup.ClaimResult, first time.Time) {
				if res.Record.State != dedup.StateProcessed {
					t.Errorf("record: got state %v, want processed", res.Record.State)
				}
			},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := dedup.Key{Namespace: "fast", ID: "evt_" + strconv.Itoa(i)}
			first := clk.Now()
			if tt.setup != nil {
				tt.setup(t, k)
			}
			before, _ := admin.Get(ctx, s.Key(k)).Result()
			hook.take()
			replay.on.Store(tt.replay)
			res := claimOn(t, s, k, tt.opts)
			replay.on.Store(false)
			trips := hook.take()
			if res.Outcome != tt.want {
				t.Fatalf("Claim: got %v, want %v", res.Outcome, tt.want)
			}
			if !slices.Equal(trips, tt.trips) {
				t.Errorf("round trips: got %v, want %v", trips, tt.trips)
			}
			if (res.Token != "") != (tt.want == dedup.Claimed) {
				t.Errorf("token: got %q for %v", res.Token, res.Outcome)
			}
			tt.check(t, k, res, first)
			after, err := admin.Get(ctx, s.Key(k)).Result()
			if err != nil {
				t.Fatalf("GET %s: %v", s.Key(k), err)
			}
			if tt.want != dedup.Claimed && after != before {
				t.Errorf("record after a %v claim: got %q, want it unchanged, %q", res.Outcome, after, before)
			}
			if tt.want == dedup.Claimed {
				// The stored record is the one the claim returned (Get
				// leaves out the owner token).
				want := res.Record
				want.Owner = ""
				if got, err := s.Get(ctx, k); err != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("Get after the claim:\ngot  %+v (%v)\nwant %+v", got, err, want)
				}
			}
		})
	}
}

// wantRecord fails t unless got equals want, times compared as instants.
func wantRecord(t *testing.T, got, want dedup.Record) {
	t.Helper()
	for _, tm := range []*time.Time{&got.FirstSeen, &got.CompletedAt, &got.LeaseUntil, &got.ExpiresAt,
		&want.FirstSeen, &want.CompletedAt, &want.LeaseUntil, &want.ExpiresAt} {
		if !tm.IsZero() {
			*tm = tm.UTC()
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("record:\ngot  %+v\nwant %+v", got, want)
	}
}

// refuseSetGetHook makes a Redis 7 server look like an older one to the
// store: it answers each SET … GET of a pipeline itself, without sending it,
// with refusal, and sends the rest of the pipeline on. refusal is the error
// the real server replied to a SET it could not parse ("ERR syntax error"),
// which is what Redis 6.2 replies to SET … NX GET and Redis 6.0 to any
// SET … GET.
type refuseSetGetHook struct {
	refusal error
	refused atomic.Int64
	xxOnly  bool // refuse only SET … XX GET (the commit's), as no Redis does
}

func (h *refuseSetGetHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *refuseSetGetHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *refuseSetGetHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		rest := cmds[:0:0]
		for _, c := range cmds {
			has := func(word string) bool {
				return slices.ContainsFunc(c.Args()[3:], func(a any) bool { s, _ := a.(string); return strings.EqualFold(s, word) })
			}
			if c.Name() == "set" && has("get") && (!h.xxOnly || has("xx")) {
				c.SetErr(h.refusal)
				h.refused.Add(1)
				continue
			}
			rest = append(rest, c)
		}
		if len(rest) == 0 {
			return nil
		}
		return next(ctx, rest)
	}
}

// newRefuseSetGetHook returns a refuseSetGetHook with the refusal srv gives.
func newRefuseSetGetHook(t testing.TB, srv *redistest.Server) *refuseSetGetHook {
	t.Helper()
	err := srv.Client().Do(context.Background(), "set", "probe", "v", "nx", "xx").Err()
	if err == nil || !strings.Contains(err.Error(), "syntax error") {
		t.Fatalf("SET probe v NX XX: got %v, want a syntax error", err)
	}
	return &refuseSetGetHook{refusal: err}
}

// TestClaimFastPathOff: a server that refuses SET NX GET (simulated with
// refuseSetGetHook, which answers it with the real server's "ERR syntax
// error") turns the fast path off for good after the first refusal: the
// refused claims run claim.lua and succeed, the store logs one warning
// however many claims were refused at once, and no later claim sends a SET.
func TestClaimFastPathOff(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	hook := &countingHook{}
	client.AddHook(hook)
	refuse := newRefuseSetGetHook(t, srv)
	client.AddHook(refuse)
	core, logs := observer.New(zapcore.InfoLevel)
	s := redisstore.NewFromClient(client, uniquePrefix(), redisstore.Options{Logger: zap.New(core)})
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	if got := hook.take(); len(got) != 0 {
		t.Fatalf("round trips of NewFromClient: got %v, want none", got)
	}

	// Concurrent first claims: several may be refused in one pipeline.
	const n = 16
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			k := dedup.Key{Namespace: "old", ID: "evt_" + strconv.Itoa(i)}
			res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
			if err != nil || res.Outcome != dedup.Claimed || res.Record.Attempts != 1 {
				t.Errorf("Claim(%s): got (%v, attempts %d, %v), want (claimed, 1, nil)", k, res.Outcome, res.Record.Attempts, err)
			}
		})
	}
	wg.Wait()
	if got := refuse.refused.Load(); got < 1 || got > n {
		t.Errorf("refused SETs: got %d, want 1 to %d", got, n)
	}
	entries := logs.FilterMessageSnippet("fast path off").All()
	if len(entries) != 1 {
		t.Fatalf("fast-path-off log lines: got %d, want 1 (all: %v)", len(entries), logs.All())
	}
	if e := entries[0]; e.Level != zapcore.WarnLevel || !strings.Contains(e.ContextMap()["error"].(string), "syntax error") {
		t.Errorf("fast-path-off log line: got %v %q %v, want a warning carrying the syntax error", e.Level, e.Message, e.ContextMap())
	}

	// From now on every claim is claim.lua alone, whatever it decides.
	refused := refuse.refused.Load()
	k := dedup.Key{Namespace: "old", ID: "after"}
	claimCommit(t, s, k) // loads commit.lua
	hook.take()
	res, err := s.Claim(ctx, dedup.Key{Namespace: "old", ID: "held"}, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
	if res, err := s.Claim(ctx, dedup.Key{Namespace: "old", ID: "held"}, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.InFlight {
		t.Fatalf("Claim of a held key: got (%v, %v), want (in-flight, nil)", res.Outcome, err)
	}
	wantDuplicate(t, s, k)
	if got, want := hook.take(), []string{tripEvalSHA, tripEvalSHA, tripEvalSHA}; !slices.Equal(got, want) {
		t.Errorf("round trips after the switch: got %v, want %v", got, want)
	}
	if got := refuse.refused.Load(); got != refused {
		t.Errorf("SETs refused after the switch: got %d more, want none", got-refused)
	}
	if got := logs.FilterMessageSnippet("fast path off").Len(); got != 1 {
		t.Errorf("fast-path-off log lines: got %d, want still 1", got)
	}
}

// TestClaimFastPathRedisDown: New does not contact Redis, and a claim that
// fails because Redis is down does not turn the fast path off: once Redis
// is back, claims take it again.
func TestClaimFastPathRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	srv.Stop()
	core, logs := observer.New(zapcore.InfoLevel)
	s, err := redisstore.New(redisstore.Config{Addrs: []string{srv.Addr()}, KeyPrefix: uniquePrefix(), DialTimeout: 200 * time.Millisecond},
		redisstore.Options{Logger: zap.New(core)})
	if err != nil {
		t.Fatalf("New while Redis is down: got %v, want nil", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	hook := &countingHook{}
	s.Client().AddHook(hook)
	ctx := context.Background()
	k := dedup.Key{Namespace: "down", ID: "evt_1"}
	if _, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err == nil || errors.Is(err, dedup.ErrClosed) {
		t.Fatalf("Claim while Redis is down: got %v, want a connection error", err)
	}
	srv.Start()
	waitReady(t, s)
	hook.take()
	res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim after Redis came back: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
	// A new connection's handshake may show up as well.
	got := slices.DeleteFunc(hook.take(), func(rt string) bool { return rt == "hello" || strings.HasPrefix(rt, "pipeline[client") })
	if !slices.Equal(got, []string{tripSet}) {
		t.Errorf("round trips of the claim: got %v, want [%s] (the fast path)", got, tripSet)
	}
	if got := logs.FilterMessageSnippet("fast path off").Len(); got != 0 {
		t.Errorf("fast-path-off log lines: got %d, want 0", got)
	}
}

// TestConformanceScriptOnly runs the conformance suite with the fast path
// refused from the first claim (refuseSetGetHook), as on Redis < 7.0, so
// claim.lua alone is checked for every case as well.
func TestConformanceScriptOnly(t *testing.T) {
	srv := redistest.Start(t)
	refuse := newRefuseSetGetHook(t, srv)
	storetest.Run(t, storetest.Harness{
		ListUnordered: true, // SCAN
		New: func(t testing.TB, now dedup.Clock) dedup.Store {
			client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
			t.Cleanup(func() { _ = client.Close() })
			client.AddHook(refuse)
			s := redisstore.NewFromClient(client, uniquePrefix(), redisstore.Options{Now: now})
			t.Cleanup(func() { _ = s.Close() })
			return s
		},
	})
	if refuse.refused.Load() == 0 {
		t.Errorf("refused SETs: got none, want the suite's first claims refused")
	}
}

// TestCommitFastPathPutsBack: a commit whose SET XX GET (see commit.go)
// finds a value other than its claim's own record puts that value back,
// byte for byte and with a TTL, and answers as commit.lua would: not the
// owner, or an error for a value that is not a record. Another claim's
// record gets there while the commit's lease still has the margin left
// only when a replica's clock runs ahead (it took the lease over by its
// clock) or an operator forgot the key in flight; both are made here. The
// fast path must have been taken: the commit's first round trip is a SET.
func TestCommitFastPathPutsBack(t *testing.T) {
	srv := redistest.Start(t)
	direct := srv.Client()
	ctx := context.Background()
	const lease = time.Minute
	leaseGrace := dedup.LeaseGrace
	clk := storetest.NewFakeClock(storetest.Epoch)
	// ahead is a replica whose clock runs a lease and a second ahead.
	ahead := func() time.Time { return clk.Now().Add(lease + time.Second) }
	prefix := uniquePrefix()
	hook := &countingHook{}
	s := openReplica(t, srv, prefix, clk.Now, hook)
	skewed := openReplica(t, srv, prefix, ahead, nil)
	other := openReplica(t, srv, prefix, clk.Now, nil) // another replica, its clock right
	claimOn := func(t *testing.T, st *redisstore.Store, k dedup.Key) dedup.ClaimResult {
		t.Helper()
		res, err := st.Claim(ctx, k, dedup.ClaimOptions{Lease: lease})
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("Claim(%s): got (%v, %v), want (claimed, nil)", k, res.Outcome, err)
		}
		return res
	}
	commitOn := func(st *redisstore.Store, k dedup.Key, token string) error {
		return st.Commit(ctx, k, token, dedup.CommitOptions{Window: time.Hour, Status: 200})
	}
	tests := []struct {
		name string
		// setup puts another claim's record (or another value) in k, which
		// s claimed; it returns what finishes that claim, if anything.
		setup func(t *testing.T, k dedup.Key) (finish func() error)
		// wantTTL bounds the put-back value's TTL; zero: only that it has one.
		wantTTL time.Duration
		// notRecord: the commit fails with an error, not ErrNotOwner.
		notRecord bool
	}{
		{
			name: "a replica whose clock runs ahead took the lease over",
			setup: func(t *testing.T, k dedup.Key) func() error {
				b := claimOn(t, skewed, k)
				if !b.TookOver {
					t.Fatalf("Claim by the replica ahead: got TookOver false, want true")
				}
				return func() error { return commitOn(skewed, k, b.Token) }
			},
		},
		{
			name: "that replica committed",
			setup: func(t *testing.T, k dedup.Key) func() error {
				b := claimOn(t, skewed, k)
				if err := commitOn(skewed, k, b.Token); err != nil {
					t.Fatalf("Commit by the replica ahead: %v", err)
				}
				return nil
			},
		},
		{
			name: "that replica released",
			setup: func(t *testing.T, k dedup.Key) func() error {
				b := claimOn(t, skewed, k)
				if err := skewed.Release(ctx, k, b.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 502}); err != nil {
					t.Fatalf("Release by the replica ahead: %v", err)
				}
				return nil
			},
		},
		{
			name: "forgotten in flight and claimed again",
			setup: func(t *testing.T, k dedup.Key) func() error {
				if _, err := other.Forget(ctx, k, dedup.ForgetOptions{}); err != nil {
					t.Fatalf("Forget: %v", err)
				}
				c := claimOn(t, other, k)
				return func() error { return commitOn(other, k, c.Token) }
			},
			wantTTL: lease + leaseGrace,
		},
		{
			name: "not a record",
			setup: func(t *testing.T, k dedup.Key) func() error {
				if err := direct.Set(ctx, s.Key(k), "not a record", 0).Err(); err != nil {
					t.Fatal(err)
				}
				return nil
			},
			notRecord: true,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := dedup.Key{Namespace: "back", ID: "evt_" + strconv.Itoa(i)}
			a := claimOn(t, s, k)
			finish := tt.setup(t, k)
			before, err := direct.Get(ctx, s.Key(k)).Result()
			if err != nil {
				t.Fatal(err)
			}
			hook.take()
			err = commitOn(s, k, a.Token)
			if notOwner := errors.Is(err, dedup.ErrNotOwner); err == nil || notOwner == tt.notRecord {
				t.Errorf("Commit by the claim's owner: got %v, want ErrNotOwner (or, for a value that is no record, another error)", err)
			}
			if trips := hook.take(); len(trips) < 2 || trips[0] != tripSet {
				t.Errorf("round trips of the commit: got %v, want a SET (the fast path), then the put-back", trips)
			}
			if got, err := direct.Get(ctx, s.Key(k)).Result(); err != nil || got != before {
				t.Errorf("value after the commit: got %q (%v), want %q put back", got, err, before)
			}
			// The gateway tries a failed commit again later: that try, and
			// every later one, is commit.lua's alone.
			err = commitOn(s, k, a.Token)
			if notOwner := errors.Is(err, dedup.ErrNotOwner); err == nil || notOwner == tt.notRecord {
				t.Errorf("the commit tried again: got %v, want the same answer", err)
			}
			if trips := hook.take(); len(trips) == 0 || slices.Contains(trips, tripSet) || !slices.Contains(trips, tripEvalSHA) {
				t.Errorf("round trips of the commit tried again: got %v, want commit.lua's alone", trips)
			}
			if got, err := direct.Get(ctx, s.Key(k)).Result(); err != nil || got != before {
				t.Errorf("value after the commit tried again: got %q (%v), want %q", got, err, before)
			}
			ttl, err := direct.PTTL(ctx, s.Key(k)).Result()
			if err != nil || ttl <= 0 || tt.wantTTL > 0 && (ttl > tt.wantTTL || ttl < tt.wantTTL-5*time.Second) {
				t.Errorf("TTL after the put-back: got %s (%v), want one (just under %s when not zero)", ttl, err, tt.wantTTL)
			}
			if finish != nil {
				if err := finish(); err != nil {
					t.Errorf("Commit by the claim that holds the key: got %v, want nil", err)
				}
				if got, err := direct.Get(ctx, s.Key(k)).Result(); err != nil || !strings.HasPrefix(got, "d,") {
					t.Errorf("value after that commit: got %q (%v), want a processed record", got, err)
				}
			}
		})
	}

	// Forgotten and not claimed again: XX writes nothing, and commit.lua,
	// asked again after the pause (the claim is held, its lease live),
	// refuses the commit too.
	k := dedup.Key{Namespace: "back", ID: "evt_forgotten"}
	a := claimOn(t, s, k)
	if _, err := other.Forget(ctx, k, dedup.ForgetOptions{}); err != nil {
		t.Fatalf("Forget: %v", err)
	}
	hook.take()
	if err := commitOn(s, k, a.Token); !errors.Is(err, dedup.ErrNotOwner) {
		t.Errorf("Commit of a forgotten key: got %v, want ErrNotOwner", err)
	}
	if got, want := hook.take(), []string{tripSet, tripEvalSHA}; !slices.Equal(got, want) {
		t.Errorf("round trips of that commit: got %v, want %v", got, want)
	}
	if n, err := direct.Exists(ctx, s.Key(k)).Result(); err != nil || n != 0 {
		t.Errorf("EXISTS after that commit: got (%d, %v), want (0, nil)", n, err)
	}
}

// TestCommitFastPathRefused: a server that takes the claim's SET NX GET but
// refuses the commit's SET XX GET (no Redis does; a Redis-compatible
// server might) gets the commit from commit.lua, and the fast paths are
// turned off, as for a claim's refusal.
func TestCommitFastPathRefused(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	refuse := newRefuseSetGetHook(t, srv)
	refuse.xxOnly = true
	client.AddHook(refuse)
	hook := &countingHook{}
	client.AddHook(hook)
	core, logs := observer.New(zapcore.InfoLevel)
	s := redisstore.NewFromClient(client, uniquePrefix(), redisstore.Options{Logger: zap.New(core)})
	t.Cleanup(func() { _ = s.Close() })
	k := dedup.Key{Namespace: "compat", ID: "evt_1"}
	claimCommit(t, s, k)
	wantDuplicate(t, s, k)
	if got := refuse.refused.Load(); got != 1 {
		t.Errorf("refused SET XX GETs: got %d, want 1", got)
	}
	if got := logs.FilterMessageSnippet("fast path off").Len(); got != 1 {
		t.Errorf("fast-path-off log lines: got %d, want 1", got)
	}
	// The hook answers the refused SET itself, unseen by hook; a fresh
	// server answers each script's first EVALSHA with NOSCRIPT.
	trips := slices.DeleteFunc(hook.take(), func(rt string) bool {
		return !strings.HasPrefix(rt, "pipeline[") || strings.HasPrefix(rt, "pipeline[client")
	})
	if want := []string{tripSet, tripEvalSHA, "pipeline[eval]", tripEvalSHA, "pipeline[eval]"}; !slices.Equal(trips, want) {
		t.Errorf("round trips: got %v, want %v: the claim's SET, commit.lua, and claim.lua for the duplicate", trips, want)
	}
}

// openReplica opens a Store on srv under prefix with clock now, as one
// gateway replica, its client carrying hook (if not nil).
func openReplica(t *testing.T, srv *redistest.Server, prefix string, now dedup.Clock, hook redis.Hook) *redisstore.Store {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	if hook != nil {
		client.AddHook(hook)
	}
	s := redisstore.NewFromClient(client, prefix, redisstore.Options{Now: now})
	t.Cleanup(func() { _ = s.Close(); _ = client.Close() })
	return s
}

// lostClaim is the set-up of the races of the commit fast path: replicas
// A and B (each with an afterHook, one fake clock); A claimed the key for
// a minute and its claim was lost (a DEL, as a failover to a replica its
// write had not reached loses it); a second later B claimed it afresh.
type lostClaim struct {
	a, b         *redisstore.Store
	aHook, bHook *afterHook
	clk          *storetest.FakeClock
	ra, rb       dedup.ClaimResult
}

func newLostClaim(t *testing.T, srv *redistest.Server, k dedup.Key, bLease time.Duration) *lostClaim {
	t.Helper()
	ctx := context.Background()
	lc := &lostClaim{aHook: &afterHook{}, bHook: &afterHook{}, clk: storetest.NewFakeClock(storetest.Epoch)}
	prefix := uniquePrefix()
	lc.a = openReplica(t, srv, prefix, lc.clk.Now, lc.aHook)
	lc.b = openReplica(t, srv, prefix, lc.clk.Now, lc.bHook)
	var err error
	if lc.ra, err = lc.a.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err != nil || lc.ra.Outcome != dedup.Claimed {
		t.Fatalf("A's Claim: got (%v, %v), want claimed", lc.ra.Outcome, err)
	}
	if err := srv.Client().Del(ctx, lc.a.Key(k)).Err(); err != nil {
		t.Fatal(err)
	}
	lc.clk.Advance(time.Second)
	if lc.rb, err = lc.b.Claim(ctx, k, dedup.ClaimOptions{Lease: bLease}); err != nil || lc.rb.Outcome != dedup.Claimed {
		t.Fatalf("B's Claim: got (%v, %v), want claimed", lc.rb.Outcome, err)
	}
	return lc
}

// afterHook calls after, when set, once each pipeline (or command sent
// alone) it sees has run in Redis and before its caller reads the replies.
type afterHook struct {
	after atomic.Pointer[func(cmds []redis.Cmder)]
}

func (h *afterHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *afterHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if fn := h.after.Load(); fn != nil {
			(*fn)([]redis.Cmder{cmd})
		}
		return err
	}
}
func (h *afterHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if fn := h.after.Load(); fn != nil {
			(*fn)(cmds)
		}
		return err
	}
}

// isFastCommit reports whether cmds carry a commit's SET … XX GET; isEval
// whether they carry a script call (the put-back).
func isFastCommit(cmds []redis.Cmder) bool {
	return slices.ContainsFunc(cmds, func(c redis.Cmder) bool {
		return c.Name() == "set" && slices.ContainsFunc(c.Args()[3:], func(a any) bool { s, _ := a.(string); return strings.EqualFold(s, "xx") })
	})
}

func isEval(cmds []redis.Cmder) bool {
	return slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return strings.HasPrefix(c.Name(), "eval") })
}

// TestFastCommitsRace: A's claim is lost (a failover to a replica it had
// not reached, an eviction: here a DEL), a copy is claimed afresh by B,
// and both commit by the fast path at once: B's SET lands between A's SET
// and A's put-back, and each replaces the other's record. commit.lua,
// run after each put-back, must leave the key processed, one commit
// answered done and the other refused, whichever put-back lands first: not
// B's lease put back with both refused, which would keep the key in
// flight until that lease lapses and forward its next copy again. (Found
// by a review.)
func TestFastCommitsRace(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	for _, aFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "B's put-back first", true: "A's put-back first"}[aFirst], func(t *testing.T) {
			k := dedup.Key{Namespace: "race", ID: "evt_1"}
			lc := newLostClaim(t, srv, k, time.Minute)
			a, b, aHook, bHook, clk, ra, rb := lc.a, lc.b, lc.aHook, lc.bHook, lc.clk, lc.ra, lc.rb

			bSet, bPutBack, aPutBack := make(chan struct{}), make(chan struct{}), make(chan struct{})
			var once sync.Once
			bAfter := func(cmds []redis.Cmder) {
				switch {
				case isFastCommit(cmds):
					close(bSet)
					if aFirst {
						<-aPutBack
					}
				case isEval(cmds):
					once.Do(func() { close(bPutBack) })
				}
			}
			bHook.after.Store(&bAfter)
			errB := make(chan error, 1)
			var aOnce sync.Once
			aAfter := func(cmds []redis.Cmder) {
				switch {
				case isFastCommit(cmds):
					go func() { errB <- b.Commit(ctx, k, rb.Token, dedup.CommitOptions{Window: time.Hour, Status: 201}) }()
					<-bSet // B's SET ran after A's, before A's put-back
					if !aFirst {
						<-bPutBack
					}
				case isEval(cmds):
					aOnce.Do(func() { close(aPutBack) })
				}
			}
			aHook.after.Store(&aAfter)
			errA := a.Commit(ctx, k, ra.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
			eb := <-errB

			if (errA == nil) == (eb == nil) || errA != nil && !errors.Is(errA, dedup.ErrNotOwner) || eb != nil && !errors.Is(eb, dedup.ErrNotOwner) {
				t.Errorf("commits: got A %v, B %v; want one done and the other ErrNotOwner", errA, eb)
			}
			rec, err := b.Get(ctx, k)
			if err != nil || rec.State != dedup.StateProcessed {
				t.Fatalf("record after both commits: got %q (%v), want processed", rec.State, err)
			}
			if want := map[bool]int{true: 200, false: 201}[errA == nil]; rec.LastStatus != want {
				t.Errorf("record's status: got %d, want %d, the one of the commit answered done", rec.LastStatus, want)
			}
			clk.Advance(2 * time.Minute) // past both leases
			if res, err := b.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Duplicate {
				t.Errorf("a copy after both leases: got (%v, %v), want duplicate", res.Outcome, err)
			}
		})
	}
}

// TestScriptSettleInsideFastCommitWindow: as in TestFastCommitsRace, A's
// claim is lost and B claimed the copy afresh, and A's fast commit
// replaces B's lease; inside that round trip, B settles by script: a
// release, or a commit by commit.lua (B's lease is under the margin).
// The script finds A's record and refuses B; B, holding a live claim, asks
// again after the pause, when A's put-back has landed, and settles. Or an
// operator forgets the key, keeping keys in flight: the forget reads A's
// record as processed and deletes it; A's put-back puts B's lease back,
// as the forget would have kept it, and B commits. (Found by a review:
// B's settle was refused, A's put-back then left B's lease in the key
// until it lapsed; the forget left the key absent, and B's commit was
// refused.)
func TestScriptSettleInsideFastCommitWindow(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	tests := []struct {
		name   string
		bLease time.Duration
		settle func(b *redisstore.Store, k dedup.Key, token string) error
		then   func(b *redisstore.Store, k dedup.Key, token string) error
		want   dedup.State
	}{
		{"release", time.Minute, func(b *redisstore.Store, k dedup.Key, token string) error {
			return b.Release(ctx, k, token, dedup.ReleaseOptions{Retain: time.Hour, Status: 502})
		}, nil, dedup.StateFailed},
		{"commit by commit.lua", redisstore.CommitMargin / 2, func(b *redisstore.Store, k dedup.Key, token string) error {
			return b.Commit(ctx, k, token, dedup.CommitOptions{Window: time.Hour, Status: 201})
		}, nil, dedup.StateProcessed},
		{"forget keeping keys in flight", time.Minute, func(b *redisstore.Store, k dedup.Key, token string) error {
			if _, err := b.Forget(ctx, k, dedup.ForgetOptions{KeepInFlight: true}); err != nil && !errors.Is(err, dedup.ErrKept) {
				return err
			}
			return nil
		}, func(b *redisstore.Store, k dedup.Key, token string) error {
			return b.Commit(ctx, k, token, dedup.CommitOptions{Window: time.Hour, Status: 201})
		}, dedup.StateProcessed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := dedup.Key{Namespace: "window", ID: "evt_1"}
			lc := newLostClaim(t, srv, k, tt.bLease)
			a, b, aHook, bHook, ra, rb := lc.a, lc.b, lc.aHook, lc.bHook, lc.ra, lc.rb
			bScript := make(chan struct{})
			var bOnce sync.Once
			bAfter := func(cmds []redis.Cmder) {
				if isEval(cmds) {
					bOnce.Do(func() { close(bScript) })
				}
			}
			bHook.after.Store(&bAfter)
			errB := make(chan error, 1)
			var aOnce sync.Once
			aAfter := func(cmds []redis.Cmder) {
				if isFastCommit(cmds) {
					aOnce.Do(func() {
						go func() { errB <- tt.settle(b, k, rb.Token) }()
						<-bScript // B's script ran after A's SET, before A's put-back
					})
				}
			}
			aHook.after.Store(&aAfter)
			if err := a.Commit(ctx, k, ra.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); !errors.Is(err, dedup.ErrNotOwner) {
				t.Errorf("A's commit: got %v, want ErrNotOwner", err)
			}
			if err := <-errB; err != nil {
				t.Errorf("B's %s inside A's round trip: got %v, want nil", tt.name, err)
			}
			if tt.then != nil {
				if err := tt.then(b, k, rb.Token); err != nil {
					t.Errorf("B's commit after that: got %v, want nil", err)
				}
			}
			if rec, err := b.Get(ctx, k); err != nil || rec.State != tt.want {
				t.Errorf("record at the end: got %q (%v), want %q", rec.State, err, tt.want)
			}
		})
	}
}
