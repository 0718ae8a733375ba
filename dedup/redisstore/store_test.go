package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
	"github.com/dedupgw/dedupgw/dedup/storetest"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// prefixes makes every store of a test binary use its own key prefix, so
// stores sharing one server start empty.
var prefixes atomic.Int64

func uniquePrefix() string {
	return "test" + strconv.FormatInt(prefixes.Add(1), 10) + ":"
}

// newStore opens a store on cfg with a fresh key prefix, closed when t ends.
func newStore(t testing.TB, cfg redisstore.Config, now dedup.Clock) *redisstore.Store {
	t.Helper()
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = uniquePrefix()
	}
	s, err := redisstore.New(cfg, redisstore.Options{Now: now, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatalf("New: got error %v, want nil", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	storetest.Run(t, storetest.Harness{
		ListUnordered: true, // SCAN
		New: func(t testing.TB, now dedup.Clock) dedup.Store {
			return newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}}, now)
		},
	})
}

func TestConformanceCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	storetest.Run(t, storetest.Harness{
		ListUnordered: true, // SCAN
		New: func(t testing.TB, now dedup.Clock) dedup.Store {
			return newStore(t, redisstore.Config{Addrs: cl.Addrs()}, now)
		},
	})
}

// claimCommit runs the first-delivery path on k and fails t on any surprise.
func claimCommit(t testing.TB, s dedup.Store, k dedup.Key) {
	t.Helper()
	ctx := context.Background()
	res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim(%s): got (%v, %v), want (claimed, nil)", k, res.Outcome, err)
	}
	if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
		t.Fatalf("Commit(%s): got %v, want nil", k, err)
	}
}

// commitLate claims k with a lease shorter than the commit fast path's
// margin, so that its commit runs commit.lua, and commits it.
func commitLate(t testing.TB, s dedup.Store, k dedup.Key) {
	t.Helper()
	ctx := context.Background()
	res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: redisstore.CommitMargin / 2})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim(%s): got (%v, %v), want (claimed, nil)", k, res.Outcome, err)
	}
	if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
		t.Fatalf("Commit(%s): got %v, want nil", k, err)
	}
}

// wantDuplicate claims k and fails t unless it is a duplicate.
func wantDuplicate(t testing.TB, s dedup.Store, k dedup.Key) {
	t.Helper()
	res, err := s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Duplicate {
		t.Fatalf("Claim(%s) again: got (%v, %v), want (duplicate, nil)", k, res.Outcome, err)
	}
}

func TestScriptFlush(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	s := newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}}, nil)
	ctx := context.Background()

	for i := range 20 {
		k := dedup.Key{Namespace: "flush", ID: "evt_" + strconv.Itoa(i)}
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("Claim(%s): got (%v, %v), want (claimed, nil)", k, res.Outcome, err)
		}
		// Flush between every pair of operations: each script must come back
		// through the NOSCRIPT fallback.
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: got %v, want nil", err)
		}
		if i%2 == 0 {
			err = s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
		} else {
			err = s.Release(ctx, k, res.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 500})
		}
		if err != nil {
			t.Fatalf("finish %s after SCRIPT FLUSH: got %v, want nil", k, err)
		}
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: got %v, want nil", err)
		}
		want := dedup.Duplicate
		if i%2 == 1 {
			want = dedup.Claimed
		}
		res, err = s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err != nil || res.Outcome != want {
			t.Fatalf("Claim(%s) after SCRIPT FLUSH: got (%v, %v), want (%v, nil)", k, res.Outcome, err, want)
		}
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatalf("SCRIPT FLUSH: got %v, want nil", err)
		}
		if _, err := s.Forget(ctx, k, dedup.ForgetOptions{}); err != nil {
			t.Fatalf("Forget(%s) after SCRIPT FLUSH: got %v, want nil", k, err)
		}
	}
}

func TestRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}, DialTimeout: 200 * time.Millisecond}, nil)
	ctx := context.Background()
	before := dedup.Key{Namespace: "restart", ID: "before"}
	claimCommit(t, s, before)

	srv.Stop()
	k := dedup.Key{Namespace: "restart", ID: "during"}
	if err := s.Ping(ctx); err == nil {
		t.Fatalf("Ping while Redis is down: got nil, want an error")
	}
	if _, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err == nil ||
		errors.Is(err, dedup.ErrNotOwner) || errors.Is(err, dedup.ErrClosed) {
		t.Fatalf("Claim while Redis is down: got %v, want a connection error", err)
	}
	if _, err := s.Get(ctx, before); err == nil || errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Get while Redis is down: got %v, want a connection error (not ErrNotFound)", err)
	}

	srv.Start()
	// The same Store value recovers by itself; the first calls may still meet
	// connections that died with the old server.
	waitReady(t, s)
	claimCommit(t, s, k)
	wantDuplicate(t, s, k)
	// Redis persisted nothing (--save ""), so the key from before is gone: the
	// README's advice to persist matters.
	if _, err := s.Get(ctx, before); !errors.Is(err, dedup.ErrNotFound) {
		t.Fatalf("Get of a key written before a restart without persistence: got %v, want ErrNotFound", err)
	}
}

// waitReady polls Ping until it succeeds, failing t after 5s.
func waitReady(t testing.TB, s dedup.Store) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := s.Ping(ctx)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ping: still failing after 5s: %v", err)
		}
		<-tick.C
	}
}

func TestACLUser(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	// The least the store needs: the README lists these commands.
	err := srv.Client().Do(ctx, "ACL", "SETUSER", "dedupgw", "on", ">s3cret", "~dedupgw:*", "resetchannels",
		"-@all", "+evalsha", "+eval", "+get", "+set", "+del", "+ping").Err()
	if err != nil {
		t.Fatalf("ACL SETUSER: got %v, want nil", err)
	}
	tests := []struct {
		name    string
		cfg     redisstore.Config
		wantErr bool
	}{
		{"right password", redisstore.Config{Username: "dedupgw", Password: "s3cret"}, false},
		{"wrong password", redisstore.Config{Username: "dedupgw", Password: "wrong"}, true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.Addrs = []string{srv.Addr()}
			tt.cfg.KeyPrefix = redisstore.DefaultKeyPrefix
			s := newStore(t, tt.cfg, nil)
			if err := s.Ping(ctx); (err != nil) != tt.wantErr {
				t.Fatalf("Ping: got %v, want error %v", err, tt.wantErr)
			}
			k := dedup.Key{Namespace: "acl", ID: "evt_" + strconv.Itoa(i)}
			if tt.wantErr {
				// Every operation names the cause, not a decoding error of a
				// reply that never came (go-redis leaves a pipeline's
				// commands without an error when the connection's AUTH fails).
				_, claimErr := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
				_, getErr := s.Get(ctx, k)
				commitErr := s.Commit(ctx, k, "token", dedup.CommitOptions{Window: time.Minute, Status: 200})
				for op, err := range map[string]error{"Claim": claimErr, "Get": getErr, "Commit": commitErr} {
					if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
						t.Errorf("%s: got %v, want the WRONGPASS error", op, err)
					}
				}
				return
			}
			claimCommit(t, s, k)
			wantDuplicate(t, s, k)
			if _, err := s.Get(ctx, k); err != nil {
				t.Fatalf("Get: got %v, want nil", err)
			}
			if _, err := s.Forget(ctx, k, dedup.ForgetOptions{}); err != nil {
				t.Fatalf("Forget: got error %v, want nil", err)
			}
		})
	}
}

// MaxmemoryPolicy reports a policy that can evict dedup keys, on a Cluster
// when any master has one.
func TestMaxmemoryPolicy(t *testing.T) {
	ctx := context.Background()
	lru := redistest.StartWith(t, "--maxmemory-policy", "allkeys-lru")
	cl := redistest.StartCluster(t, 3)
	third := redis.NewClient(&redis.Options{Addr: cl.Addrs()[2]})
	defer third.Close()
	if err := third.ConfigSet(ctx, "maxmemory-policy", "volatile-ttl").Err(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		addrs []string
		want  string
	}{
		{"default", []string{redistest.Start(t).Addr()}, "noeviction"},
		{"allkeys-lru", []string{lru.Addr()}, "allkeys-lru"},
		{"a cluster with one volatile-ttl master", cl.Addrs(), "volatile-ttl"},
	}
	for _, tt := range tests {
		s := newStore(t, redisstore.Config{Addrs: tt.addrs}, nil)
		if got, err := s.MaxmemoryPolicy(ctx); err != nil || got != tt.want {
			t.Errorf("%s: got (%q, %v), want (%q, nil)", tt.name, got, err, tt.want)
		}
	}

	// With mixed policies the worst is reported, whichever master answers
	// first (they are read concurrently: ask a few times).
	first := redis.NewClient(&redis.Options{Addr: cl.Addrs()[0]})
	defer first.Close()
	if err := first.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	s := newStore(t, redisstore.Config{Addrs: cl.Addrs()}, nil)
	for range 20 {
		if got, err := s.MaxmemoryPolicy(ctx); err != nil || got != "allkeys-lru" {
			t.Fatalf("a cluster with a volatile-ttl and an allkeys-lru master: got (%q, %v), want (%q, nil)", got, err, "allkeys-lru")
		}
	}
}

// MasterRuns names each master's run: a restart gives a new run_id and
// a short uptime, not promoted; a replica promoted by a failover is
// Promoted however recently it started; a Cluster reports each of its
// masters.
func TestMasterRuns(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	s := newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}}, nil)
	before, err := s.MasterRuns(ctx)
	if err != nil || len(before) != 1 || len(before[0].RunID) != 40 {
		t.Fatalf("a single node: got (%+v, %v), want one run with a 40-character run_id", before, err)
	}
	srv.Restart()
	var after []redisstore.MasterRun
	eventually(t, "the restarted Redis to answer", func() bool {
		after, err = s.MasterRuns(ctx)
		return err == nil
	})
	if len(after) != 1 || after[0].RunID == before[0].RunID || after[0].Uptime > 5*time.Second || after[0].Promoted || before[0].Promoted {
		t.Errorf("after a restart: got (%+v, %v), want one run with a new run_id (not %s) and a short uptime", after, err, before[0].RunID)
	}

	// A replica promoted: it holds what it replicated.
	master, replica := redistest.StartReplicated(t)
	if err := replica.Client().Do(ctx, "replicaof", "no", "one").Err(); err != nil {
		t.Fatal(err)
	}
	promoted, err := newStore(t, redisstore.Config{Addrs: []string{replica.Addr()}}, nil).MasterRuns(ctx)
	if err != nil || len(promoted) != 1 || !promoted[0].Promoted {
		t.Errorf("a promoted replica: got (%+v, %v), want one Promoted run", promoted, err)
	}
	if runs, err := newStore(t, redisstore.Config{Addrs: []string{master.Addr()}}, nil).MasterRuns(ctx); err != nil || len(runs) != 1 || runs[0].Promoted {
		t.Errorf("the master it left: got (%+v, %v), want one run, not Promoted", runs, err)
	}

	cl := redistest.StartCluster(t, 3)
	runs, err := newStore(t, redisstore.Config{Addrs: cl.Addrs()}, nil).MasterRuns(ctx)
	ids := map[string]bool{}
	for _, r := range runs {
		ids[r.RunID] = true
	}
	if err != nil || len(ids) != 3 {
		t.Errorf("a 3-master Cluster: got (%+v, %v), want 3 distinct runs", runs, err)
	}
}

// Persistence reports how Redis keeps the keys across its own restart, on a
// Cluster the least durable master's: a Redis started with neither
// appendonly nor snapshots forgets every key when it restarts.
func TestPersistence(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, 3)
	for _, addr := range cl.Addrs()[:2] {
		c := redis.NewClient(&redis.Options{Addr: addr})
		if err := c.ConfigSet(ctx, "appendonly", "yes").Err(); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	tests := []struct {
		name  string
		addrs []string
		want  string
	}{
		{"neither", []string{redistest.Start(t).Addr()}, redisstore.PersistenceNone},
		{"snapshots", []string{redistest.StartWith(t, "--save", "3600 1").Addr()}, redisstore.PersistenceRDB},
		{"appendonly", []string{redistest.StartWith(t, "--appendonly", "yes").Addr()}, redisstore.PersistenceAOF},
		{"a cluster with one master keeping nothing", cl.Addrs(), redisstore.PersistenceNone},
	}
	for _, tt := range tests {
		s := newStore(t, redisstore.Config{Addrs: tt.addrs}, nil)
		if got, err := s.Persistence(ctx); err != nil || got != tt.want {
			t.Errorf("%s: got (%q, %v), want (%q, nil)", tt.name, got, err, tt.want)
		}
	}
}

// A commit or release that meets a Redis refusing connections (a master
// being replaced) is sent again until Redis is back, within its context,
// instead of failing at once and leaving the key processing for a lease,
// whose retries would get 409 and then be forwarded again. (Found by an
// operator trial: four events processed during a failover stayed
// processing for the whole lease.)
func TestSettleRetriesWhileRedisIsDown(t *testing.T) {
	for _, op := range []string{"commit", "release"} {
		t.Run(op, func(t *testing.T) {
			srv := redistest.StartWith(t, "--appendonly", "yes") // keeps the claim across the restart
			k := dedup.Key{Namespace: "n", ID: "evt_" + op}
			s, logs, res := observedClaim(t, redisstore.Config{Addrs: []string{srv.Addr()}}, k)
			ctx := context.Background()
			srv.Shutdown()

			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				if op == "commit" {
					done <- s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
				} else {
					done <- s.Release(ctx, k, res.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 503})
				}
			}()
			settledAfterRetry(t, logs, op, done, srv.Start)
			rec, err := s.Get(ctx, k)
			want := map[string]dedup.State{"commit": dedup.StateProcessed, "release": dedup.StateFailed}[op]
			if err != nil || rec.State != want {
				t.Errorf("record after the %s: got (%v, %v), want state %v", op, rec.State, err, want)
			}
		})
	}
}

// A commit refused with READONLY (a master demoted to a replica in a
// failover, before the client follows the new one) did nothing, so it is
// sent again, also while waiting for no replica, until it is accepted.
func TestCommitRetriesWhileReadOnly(t *testing.T) {
	srv := redistest.Start(t)
	k := dedup.Key{Namespace: "n", ID: "evt_readonly"}
	s, logs, res := observedClaim(t, redisstore.Config{Addrs: []string{srv.Addr()}}, k)
	ctx := context.Background()
	admin := srv.Client()
	// A replica of a master that is not there keeps its data and refuses writes.
	if err := admin.Do(ctx, "replicaof", "127.0.0.1", "1").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Do(context.Background(), "replicaof", "no", "one").Err() })
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		done <- s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
	}()
	settledAfterRetry(t, logs, "commit", done, func() {
		if err := admin.Do(ctx, "replicaof", "no", "one").Err(); err != nil {
			t.Fatal(err)
		}
	})
	if rec, err := s.Get(ctx, k); err != nil || rec.State != dedup.StateProcessed {
		t.Errorf("record: got (%v, %v), want processed", rec.State, err)
	}
}

// While waiting for replicas, a commit that timed out is not sent again: it
// may have been applied, and WAIT on a new connection would then check
// nothing (see Config.WaitTimeout). It fails, once.
func TestCommitTimeoutIsNotRetriedWhileWaiting(t *testing.T) {
	master, _ := redistest.StartReplicated(t)
	k := dedup.Key{Namespace: "n", ID: "evt_wait_timeout"}
	s, logs, res := observedClaim(t, redisstore.Config{Addrs: []string{master.Addr()},
		WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond, ReadTimeout: 300 * time.Millisecond}, k)
	ctx := context.Background()
	master.Pause()
	t.Cleanup(master.Resume)
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := s.Commit(cctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err == nil {
		t.Fatal("Commit to a hung master: got nil, want a timeout")
	}
	if n := logs.FilterMessage("commit not done; trying again").Len(); n != 0 {
		t.Errorf("retries of a timed-out commit while waiting for replicas: got %d, want none", n)
	}
}

// A commit or release whose reply was lost although Redis applied it (here
// Redis stalls until the call times out, then runs it) is tried again by
// its caller later (the gateway's background retry): the retry is the same
// settle, answered done, not "not the owner", which the gateway would
// report as a lost lease of an event that is recorded. (Found by an
// on-call trial pausing redis-server mid-commit.)
func TestSettleRetriedAfterALostReplyIsNoLostLease(t *testing.T) {
	for _, op := range []string{"commit", "release"} {
		t.Run(op, func(t *testing.T) {
			srv := redistest.Start(t)
			k := dedup.Key{Namespace: "n", ID: "evt_" + op}
			s, _, res := observedClaim(t, redisstore.Config{Addrs: []string{srv.Addr()}}, k)
			settle := func(ctx context.Context, k dedup.Key, token string) error {
				if op == "commit" {
					return s.Commit(ctx, k, token, dedup.CommitOptions{Window: time.Hour, Status: 200})
				}
				return s.Release(ctx, k, token, dedup.ReleaseOptions{Retain: time.Hour, Status: 503})
			}
			want := map[string]dedup.State{"commit": dedup.StateProcessed, "release": dedup.StateFailed}[op]
			// Redis knows the script already (else the stalled EVALSHA
			// would only be answered NOSCRIPT, and nothing applied).
			warm := dedup.Key{Namespace: "n", ID: "warm_" + op}
			w, err := s.Claim(context.Background(), warm, dedup.ClaimOptions{Lease: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if err := settle(context.Background(), warm, w.Token); err != nil {
				t.Fatal(err)
			}

			srv.Pause()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			err = settle(ctx, k, res.Token)
			cancel()
			srv.Resume()
			if err == nil {
				t.Fatalf("%s while Redis stalls: got nil, want a timeout", op)
			}
			var first dedup.Record
			eventually(t, "the stalled "+op+" applied once Redis runs again", func() bool {
				first, err = s.Get(context.Background(), k)
				return err == nil && first.State == want
			})

			if err := settle(context.Background(), k, res.Token); err != nil {
				t.Fatalf("the %s tried again: got %v, want nil (it is the one Redis applied)", op, err)
			}
			if got, err := s.Get(context.Background(), k); err != nil || !got.CompletedAt.Equal(first.CompletedAt) || !got.ExpiresAt.Equal(first.ExpiresAt) {
				t.Errorf("record after the retry: got completed_at %v, expires_at %v (%v), want the first try's %v, %v",
					got.CompletedAt, got.ExpiresAt, err, first.CompletedAt, first.ExpiresAt)
			}
		})
	}
}

// A commit tried again after its first try failed unsent (Redis down)
// counts its window from the try that lands, as a commit sent late would:
// a window shorter than the retries does not write a record already
// expired, whose key a copy would then claim again. (Found by a review:
// the retry's repeat of the first try's time once covered the expiry too.)
func TestCommitTriedAgainLaterKeepsItsWindow(t *testing.T) {
	srv := redistest.StartWith(t, "--appendonly", "yes") // keeps the claim across the restart
	var (
		mu  sync.Mutex
		now = time.Now()
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	s, err := redisstore.New(redisstore.Config{Addrs: []string{srv.Addr()}, KeyPrefix: uniquePrefix()}, redisstore.Options{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	k := dedup.Key{Namespace: "n", ID: "evt_short_window"}
	res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim: got (%v, %v), want claimed", res.Outcome, err)
	}
	const window = 10 * time.Second
	commit := func(ctx context.Context) error {
		return s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: window, Status: 200})
	}

	srv.Shutdown()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = commit(short)
	cancel()
	if err == nil {
		t.Fatal("Commit while Redis is down: got nil, want an error")
	}
	mu.Lock()
	now = now.Add(2 * window) // the caller tries again later than a window
	retried := now
	mu.Unlock()
	srv.Start()
	if err := commit(ctx); err != nil {
		t.Fatalf("the commit tried again: got %v, want nil", err)
	}
	rec, err := s.Get(ctx, k)
	if err != nil || rec.State != dedup.StateProcessed || !rec.ExpiresAt.Equal(retried.Add(window).Truncate(time.Millisecond)) {
		t.Fatalf("record: got %v expiring %v (%v), want processed until %v", rec.State, rec.ExpiresAt, err, retried.Add(window))
	}
	if got, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err != nil || got.Outcome != dedup.Duplicate {
		t.Errorf("a copy after the retry: got (%v, %v), want duplicate", got.Outcome, err)
	}
}

// observedClaim opens a store on cfg (with a fresh key prefix) whose log,
// debug lines included, is the returned logs, and claims k on it for a
// minute.
func observedClaim(t *testing.T, cfg redisstore.Config, k dedup.Key) (*redisstore.Store, *observer.ObservedLogs, dedup.ClaimResult) {
	t.Helper()
	core, logs := observer.New(zapcore.DebugLevel)
	cfg.KeyPrefix = uniquePrefix()
	s, err := redisstore.New(cfg, redisstore.Options{Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	res, err := s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim: got (%v, %v), want claimed", res.Outcome, err)
	}
	return s, logs, res
}

// settledAfterRetry waits until the store logs that op is sent again,
// failing t if op's call (its result on done) returned first; then calls
// heal, and wants the call to succeed.
func settledAfterRetry(t *testing.T, logs *observer.ObservedLogs, op string, done <-chan error, heal func()) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for logs.FilterMessage(op+" not done; trying again").Len() == 0 {
		select {
		case err := <-done:
			t.Fatalf("%s while Redis cannot take it: got %v before any retry, want it to wait", op, err)
		case <-deadline:
			t.Fatalf("%s: no retry logged after 20s", op)
		case <-time.After(5 * time.Millisecond):
		}
	}
	heal()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s once Redis takes it again: got %v, want nil", op, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: still running 20s after Redis could take it again", op)
	}
}

// A record neither forget.lua nor decodeRecord can read makes every claim
// of its key fail (claim.lua answers "undecodable record"), so Forget is
// the way to repair the key. A Forget with a State cannot check it and
// fails with the decoding error, keeping it; one that only keeps keys in
// flight (the admin DELETE without ?force) deletes it, since no delivery
// can hold a key whose record cannot be read; so does an unconditional one.
func TestForgetRepairsAnUndecodableRecord(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	s := newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}}, nil)
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer direct.Close()
	for i, tt := range storetest.UndecodableForgets {
		k := dedup.Key{Namespace: "n", ID: "evt_corrupt_" + strconv.Itoa(i)}
		if err := direct.Set(ctx, s.Key(k), "not a record", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err == nil {
			t.Fatalf("Claim of an undecodable record: got nil, want an error")
		}
		rec, err := s.Forget(ctx, k, tt.Opts)
		if tt.Repairs {
			if err != nil || rec != (dedup.Record{}) {
				t.Errorf("%s: Forget: got (%+v, %v), want a zero Record and nil", tt.Name, rec, err)
			}
			if res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Claimed {
				t.Errorf("%s: Claim after Forget: got (%v, %v), want claimed", tt.Name, res.Outcome, err)
			}
			continue
		}
		if err == nil || errors.Is(err, dedup.ErrKept) || errors.Is(err, dedup.ErrNotFound) {
			t.Errorf("%s: Forget: got %v, want the decoding error", tt.Name, err)
		}
		if got, err := direct.Get(ctx, s.Key(k)).Result(); err != nil || got != "not a record" {
			t.Errorf("%s: the record after the refused Forget: got (%q, %v), want it kept", tt.Name, got, err)
		}
	}
}
