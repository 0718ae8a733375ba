package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cfg := redisstore.Config{Addrs: cl.Addrs(), KeyPrefix: uniquePrefix()}
	// Two stores on one prefix: two gateway replicas sharing the cluster.
	a := newStore(t, cfg, nil)
	b := newStore(t, cfg, nil)
	ctx := context.Background()
	if err := a.Ping(ctx); err != nil {
		t.Fatalf("Ping: got %v, want nil", err)
	}

	const n = 500
	keys := make([]dedup.Key, n)
	for i := range keys {
		keys[i] = dedup.Key{Namespace: "stripe", ID: "evt_" + strconv.Itoa(i)}
		claimCommit(t, a, keys[i])
	}
	// The keys spread over every master.
	for _, node := range cl.Nodes {
		size, err := node.Client().DBSize(ctx).Result()
		if err != nil {
			t.Fatalf("DBSIZE on %s: got %v, want nil", node.Addr(), err)
		}
		if size < n/10 {
			t.Errorf("DBSIZE on %s: got %d keys, want at least %d of %d", node.Addr(), size, n/10, n)
		}
	}
	// Every key is a duplicate for the other replica.
	for _, k := range keys {
		wantDuplicate(t, b, k)
	}

	// Concurrent first deliveries split over the two replicas: one claim per key.
	for i := range 20 {
		k := dedup.Key{Namespace: "race", ID: "evt_" + strconv.Itoa(i)}
		counts := raceClaims(t, []dedup.Store{a, b}, k, 30)
		if counts[dedup.Claimed] != 1 || counts[dedup.InFlight] != 29 {
			t.Errorf("30 concurrent claims of %s on two replicas: got %v, want 1 claimed, 29 in-flight", k, counts)
		}
	}

	// A cluster missing a master cannot serve all keys: not ready.
	cl.Nodes[2].Stop()
	if err := a.Ping(ctx); err == nil {
		t.Errorf("Ping with a master down: got nil, want an error")
	}
}

// A Cluster reached through one address (a managed service's configuration
// endpoint) needs Cluster: true. Without it the store runs in single-node
// mode, where keys on the other masters' slots fail with MOVED, and
// SingleNodeInCluster says so (the gateway warns at start-up); with it every
// key works, and the keys spread over every master.
func TestClusterBehindOneAddress(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	seed := []string{cl.Addrs()[0]}
	ctx := context.Background()
	claimOpts := dedup.ClaimOptions{Lease: time.Minute}

	single := newStore(t, redisstore.Config{Addrs: seed, KeyPrefix: uniquePrefix()}, nil)
	if in, err := single.SingleNodeInCluster(ctx); !in || err != nil {
		t.Errorf("SingleNodeInCluster of a single-node store on a Cluster node: got (%v, %v), want (true, nil)", in, err)
	}
	moved := 0
	for i := range 30 {
		_, err := single.Claim(ctx, dedup.Key{Namespace: "n", ID: "evt_" + strconv.Itoa(i)}, claimOpts)
		if err != nil && strings.Contains(err.Error(), "MOVED") {
			moved++
		}
	}
	if moved == 0 {
		t.Error("claims of 30 keys through one Cluster node in single-node mode: got no MOVED, want some (the test shows nothing)")
	}

	s := newStore(t, redisstore.Config{Addrs: seed, Cluster: true, KeyPrefix: uniquePrefix()}, nil)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: got %v, want nil", err)
	}
	if in, err := s.SingleNodeInCluster(ctx); in || err != nil {
		t.Errorf("SingleNodeInCluster of a Cluster store: got (%v, %v), want (false, nil)", in, err)
	}
	const n = 150
	for i := range n {
		k := dedup.Key{Namespace: "n", ID: "evt_" + strconv.Itoa(i)}
		claimCommit(t, s, k)
		wantDuplicate(t, s, k)
	}
	for _, node := range cl.Nodes {
		size, err := node.Client().DBSize(ctx).Result()
		if err != nil || size < n/10 {
			t.Errorf("DBSIZE on %s: got (%d, %v), want at least %d keys", node.Addr(), size, err, n/10)
		}
	}
}

// A Cluster that refuses commands (cluster_state:fail, here a slot left
// without a master) is not ready, although every master answers PING, and
// it is ready again once it serves. (Found by an operator trial: /readyz was
// 200 for 2.4 s after a master restarted, while claims failed with
// CLUSTERDOWN.)
func TestClusterDownIsNotReady(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s := newStore(t, redisstore.Config{Addrs: cl.Addrs(), KeyPrefix: uniquePrefix()}, nil)
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: got %v, want nil", err)
	}
	var owner *redis.Client // the master serving slot 0: the others answer MOVED
	for _, node := range cl.Nodes {
		if err := node.Client().Get(ctx, "{06S}").Err(); err == redis.Nil { // "06S" hashes to slot 0
			owner = node.Client()
		}
	}
	if owner == nil {
		t.Fatal("no node serves slot 0")
	}
	if err := owner.Do(ctx, "cluster", "delslots", 0).Err(); err != nil {
		t.Fatalf("CLUSTER DELSLOTS 0: %v", err)
	}
	eventually(t, "Ping fails on cluster_state", func() bool {
		err := s.Ping(ctx)
		return err != nil && strings.Contains(err.Error(), "cluster_state is fail")
	})
	if err := owner.Do(ctx, "cluster", "addslots", 0).Err(); err != nil {
		t.Fatalf("CLUSTER ADDSLOTS 0: %v", err)
	}
	eventually(t, "Ping succeeds again", func() bool { return s.Ping(ctx) == nil })
	for i := range 20 { // ready means serving: every slot's keys
		claimCommit(t, s, dedup.Key{Namespace: "n", ID: "evt_" + strconv.Itoa(i)})
	}
}

// eventually polls cond every 10ms until it holds, failing t after 20s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still not true after 20s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// raceClaims runs n concurrent claims of k spread round-robin over stores.
func raceClaims(t *testing.T, stores []dedup.Store, k dedup.Key, n int) map[dedup.Outcome]int {
	t.Helper()
	var (
		mu     sync.Mutex
		wg     sync.WaitGroup
		counts = map[dedup.Outcome]int{}
		start  = make(chan struct{})
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := stores[i%len(stores)].Claim(context.Background(), k, dedup.ClaimOptions{Lease: time.Minute})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("Claim(%s): got %v, want nil", k, err)
				return
			}
			counts[res.Outcome]++
		}()
	}
	close(start)
	wg.Wait()
	return counts
}

func TestSentinel(t *testing.T) {
	st := redistest.StartSentinel(t)
	s := newStore(t, redisstore.Config{Addrs: []string{st.Sentinel.Addr()}, MasterName: st.MasterName}, nil)
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping via sentinel: got %v, want nil", err)
	}
	k := dedup.Key{Namespace: "stripe", ID: "evt_sentinel"}
	claimCommit(t, s, k)
	wantDuplicate(t, s, k)
	// The record lives on the master the sentinel named.
	n, err := st.Master.Client().Exists(ctx, s.Key(k)).Result()
	if err != nil || n != 1 {
		t.Fatalf("EXISTS %s on the master: got (%d, %v), want (1, nil)", s.Key(k), n, err)
	}
}

// A master name no sentinel knows makes every operation a store error, and
// Ping says which name: go-redis wraps the sentinels' nil answers, which
// Claim took for SET NX GET's nil reply and so for a claim granted, with
// nothing sent (a misspelt master_name turned deduplication off, silently;
// found by an operator trial).
func TestSentinelWithAnUnknownMasterName(t *testing.T) {
	st := redistest.StartSentinel(t)
	s := newStore(t, redisstore.Config{Addrs: []string{st.Sentinel.Addr()}, MasterName: st.MasterName + "x"}, nil)
	ctx := context.Background()
	want := fmt.Sprintf("no sentinel knows a master named %q (check master_name)", st.MasterName+"x")
	if err := s.Ping(ctx); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Ping: got %v, want %q", err, want)
	}
	k := dedup.Key{Namespace: "stripe", ID: "evt_unknown_master"}
	for i := range 2 {
		if res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err == nil {
			t.Errorf("Claim %d: got (%v, nil), want a store error", i, res.Outcome)
		}
	}
	if rec, err := s.Get(ctx, k); err == nil || errors.Is(err, dedup.ErrNotFound) {
		t.Errorf("Get: got (%+v, %v), want a store error, not ErrNotFound", rec, err)
	}
}

// A sentinel that requires a password is reached with SentinelPassword;
// without it the store cannot find the master.
func TestSentinelWithPassword(t *testing.T) {
	const password = "s3ntinel-pw"
	st := redistest.StartSentinelWithPassword(t, password)
	ctx := context.Background()
	cfg := redisstore.Config{Addrs: []string{st.Sentinel.Addr()}, MasterName: st.MasterName, SentinelPassword: password}
	s := newStore(t, cfg, nil)
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping via a sentinel with its password: got %v, want nil", err)
	}
	k := dedup.Key{Namespace: "stripe", ID: "evt_sentinel_auth"}
	claimCommit(t, s, k)
	wantDuplicate(t, s, k)

	cfg.SentinelPassword = ""
	without := newStore(t, cfg, nil)
	if err := without.Ping(ctx); err == nil {
		t.Error("Ping via a sentinel without its password: got nil, want an error")
	}
}

// A sentinel whose only user is an ACL user is reached with
// SentinelUsername and SentinelPassword.
func TestSentinelWithACLUser(t *testing.T) {
	st := redistest.StartSentinelWithUser(t, "gw", "s3ntinel-pw")
	ctx := context.Background()
	cfg := redisstore.Config{Addrs: []string{st.Sentinel.Addr()}, MasterName: st.MasterName, SentinelUsername: "gw", SentinelPassword: "s3ntinel-pw"}
	if err := newStore(t, cfg, nil).Ping(ctx); err != nil {
		t.Fatalf("Ping via a sentinel as its ACL user: got %v, want nil", err)
	}
	cfg.SentinelUsername = ""
	if err := newStore(t, cfg, nil).Ping(ctx); err == nil {
		t.Error("Ping via that sentinel as the default user: got nil, want an error")
	}
}

// countingHook records the round trips a client makes: one entry per command
// sent on its own, one per pipeline naming the commands in it
// ("pipeline[evalsha]").
type countingHook struct {
	mu   sync.Mutex
	cmds []string
}

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.cmds = append(h.cmds, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, cmd := range cmds {
			names[i] = cmd.Name()
		}
		h.mu.Lock()
		h.cmds = append(h.cmds, "pipeline["+strings.Join(names, " ")+"]")
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *countingHook) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	cmds := h.cmds
	h.cmds = nil
	return cmds
}

func TestRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	hook := &countingHook{}
	client.AddHook(hook)
	s := redisstore.NewFromClient(client, uniquePrefix(), redisstore.Options{})
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()

	// Warm up: the first run of each script on a fresh server costs a
	// NOSCRIPT answer and an EVAL (claim.lua runs only for a takeover, here
	// of warm/2 after its release; commit.lua only for a commit near the
	// end of its lease, here warm/3's). Then a delivery by one caller at a
	// time costs one pipeline of one command per round trip: what
	// concurrent callers share is the pipeline, never a command. A claim is
	// one SET (the fast path), plus the claim script when it takes a key
	// over; a commit is one SET (its fast path, see commit.go).
	warm := dedup.Key{Namespace: "warm", ID: "1"}
	claimCommit(t, s, warm)
	wantDuplicate(t, s, warm)
	commitLate(t, s, dedup.Key{Namespace: "warm", ID: "3"})
	warm2 := dedup.Key{Namespace: "warm", ID: "2"}
	res, _ := s.Claim(ctx, warm2, dedup.ClaimOptions{Lease: time.Minute})
	_ = s.Release(ctx, warm2, res.Token, dedup.ReleaseOptions{Retain: time.Minute})
	if res, err := s.Claim(ctx, warm2, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim of a released key: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
	_, _ = s.Forget(ctx, warm, dedup.ForgetOptions{})
	hook.take()

	lease := dedup.ClaimOptions{Lease: time.Minute}
	const (
		set     = "pipeline[set]"
		evalsha = "pipeline[evalsha]"
	)
	tests := []struct {
		name string
		run  func(k dedup.Key)
		want []string
	}{
		{"first delivery (claim, commit)", func(k dedup.Key) { claimCommit(t, s, k) }, []string{set, set}},
		{"duplicate (claim)", func(k dedup.Key) { wantDuplicate(t, s, k) }, []string{set}},
		{"failed delivery (claim, release)", func(k dedup.Key) {
			res, _ := s.Claim(ctx, k, lease)
			_ = s.Release(ctx, k, res.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 500})
		}, []string{set, evalsha}},
		// The SET finds the failed record: claim.lua takes it over.
		{"retry of failed (claim, commit)", func(k dedup.Key) { claimCommit(t, s, k) }, []string{set, evalsha, set}},
		// Less than the margin left of the lease: commit.lua decides.
		{"commit near the lease's end (claim, commit)", func(k dedup.Key) { commitLate(t, s, k) }, []string{set, evalsha}},
		{"in flight (claim)", func(k dedup.Key) {
			if _, err := s.Claim(ctx, dedup.Key{Namespace: k.Namespace, ID: "held"}, lease); err != nil {
				t.Fatalf("Claim: got %v, want nil", err)
			}
			hook.take()
			if res, err := s.Claim(ctx, dedup.Key{Namespace: k.Namespace, ID: "held"}, lease); err != nil || res.Outcome != dedup.InFlight {
				t.Fatalf("Claim of a held key: got (%v, %v), want (in-flight, nil)", res.Outcome, err)
			}
		}, []string{evalsha}}, // a key this store holds goes to claim.lua at once
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := dedup.Key{Namespace: "rt", ID: "evt_" + strconv.Itoa(i)}
			if i == 1 || i == 3 {
				k.ID = "evt_" + strconv.Itoa(i-1) // the key the step before left
			}
			tt.run(k)
			if got := hook.take(); !slices.Equal(got, tt.want) {
				t.Errorf("round trips: got %d %v, want %d %v", len(got), got, len(tt.want), tt.want)
			}
		})
	}
}

// replayHook sends every script call and SET twice, as a client does when it
// retries a call (or a pipeline, whole) whose reply was lost after Redis ran
// it.
type replayHook struct {
	countingHook
	replayed atomic.Int64 // script calls or pipelines sent twice
}

func (h *replayHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if replayed(cmd) {
			h.replayed.Add(1)
			_ = next(ctx, cmd)
		}
		return next(ctx, cmd)
	}
}

func (h *replayHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if replayed(cmd) {
				h.replayed.Add(1)
				_ = next(ctx, cmds)
				break
			}
		}
		return next(ctx, cmds)
	}
}

// replayed reports whether replayHook sends cmd twice.
func replayed(cmd redis.Cmder) bool {
	name := cmd.Name()
	return name == "evalsha" || name == "eval" || name == "set"
}

func TestRetriedCallsAreIdempotent(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	replay := &replayHook{}
	client.AddHook(replay)
	s := redisstore.NewFromClient(client, uniquePrefix(), redisstore.Options{})
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()

	tests := []struct {
		name   string
		finish func(k dedup.Key, token string) error
		want   dedup.State
	}{
		{"commit", func(k dedup.Key, token string) error {
			return s.Commit(ctx, k, token, dedup.CommitOptions{Window: time.Hour, Status: 200})
		}, dedup.StateProcessed},
		{"release", func(k dedup.Key, token string) error {
			return s.Release(ctx, k, token, dedup.ReleaseOptions{Retain: time.Hour, Status: 500})
		}, dedup.StateFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := dedup.Key{Namespace: "retry", ID: tt.name}
			res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
			if err != nil || res.Outcome != dedup.Claimed {
				t.Fatalf("retried Claim: got (%v, %v), want (claimed, nil)", res.Outcome, err)
			}
			if err := tt.finish(k, res.Token); err != nil {
				t.Fatalf("retried %s: got %v, want nil", tt.name, err)
			}
			rec, err := s.Get(ctx, k)
			if err != nil || rec.State != tt.want || rec.Attempts != 1 {
				t.Fatalf("Get: got (%q, attempts %d, %v), want (%q, 1, nil)", rec.State, rec.Attempts, err, tt.want)
			}
		})
	}
	// A takeover of the failed key: the SET finds the failed record (twice),
	// then the claim script runs twice and finds its own token the second
	// time.
	k := dedup.Key{Namespace: "retry", ID: "release"}
	res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Claimed || res.Record.Attempts != 2 {
		t.Fatalf("retried Claim of a failed key: got (%v, attempts %d, %v), want (claimed, 2, nil)", res.Outcome, res.Record.Attempts, err)
	}
	if rec, err := s.Get(ctx, k); err != nil || rec.State != dedup.StateProcessing || rec.Attempts != 2 {
		t.Fatalf("Get after the takeover: got (%s, attempts %d, %v), want (processing, 2, nil)", rec.State, rec.Attempts, err)
	}
	// The takeover's token owns the key: its commit lands.
	if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
		t.Fatalf("commit by the takeover's token: got %v, want nil", err)
	}
	if n := replay.replayed.Load(); n < 6 {
		t.Errorf("replayed calls: got %d, want at least 6 (three claims' SETs, a claim script, a commit, a release)", n)
	}
}

func TestSentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	s := newStore(t, redisstore.Config{Addrs: []string{st.Sentinel.Addr()}, MasterName: st.MasterName}, nil)
	ctx := context.Background()
	before := dedup.Key{Namespace: "stripe", ID: "evt_before_failover"}
	claimCommit(t, s, before)
	// Replication is asynchronous: make sure the replica has the commit.
	if n, err := st.Master.Client().Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: got (%d, %v), want (1, nil)", n, err)
	}

	st.Failover()

	// The same store follows the sentinel to the new master. Calls in the
	// switch may fail (READONLY, closed connections) or, worse, still land on
	// the old master before the sentinel demotes it, and be lost when it
	// resyncs from the new one (the README's failover caveat). So poll until
	// a first delivery lands on the new master.
	newMaster := st.Replica.Client()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var after dedup.Key
	for i := 0; ; i++ {
		after = dedup.Key{Namespace: "stripe", ID: "evt_after_failover_" + strconv.Itoa(i)}
		res, err := s.Claim(ctx, after, dedup.ClaimOptions{Lease: time.Minute})
		if err == nil && res.Outcome == dedup.Claimed {
			err = s.Commit(ctx, after, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
		}
		if err == nil {
			if n, _ := newMaster.Exists(ctx, s.Key(after)).Result(); n == 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("first delivery after failover: not on the new master after 10s (last error %v)", err)
		}
		<-tick.C
	}
	wantDuplicate(t, s, before)
	wantDuplicate(t, s, after)
}

// A store follows a failover that the sentinel it listens to never
// announces: that sentinel is down (a rolling restart, a lost node) while
// another one promotes the replica. go-redis learns of a new master only from
// its sentinel's +switch-master or when it dials, so the store kept writing
// to the old master, which still takes writes until the sentinels demote it
// (some 10s later; here never, as after a partition), and every claim and
// commit of that time was lost with it: an operator trial lost 1,705 of 3,000
// events' records in 17s. Its connections now live about a second, and each
// new one asks a sentinel that answers where the master is.
func TestSentinelFailoverWithoutItsSentinel(t *testing.T) {
	ctx := context.Background()
	st := redistest.StartSentinel(t)
	other := st.AddSentinel()
	s := newStore(t, redisstore.Config{Addrs: []string{st.Sentinel.Addr(), other.Addr()}, MasterName: st.MasterName}, nil)
	before := dedup.Key{Namespace: "stripe", ID: "evt_before_failover"}
	claimCommit(t, s, before)
	if n, err := st.Master.Client().Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: got (%d, %v), want (1, nil)", n, err)
	}
	// The old master refuses to be demoted, so it goes on taking writes.
	if err := st.Master.Client().Do(ctx, "acl", "setuser", "default", "-replicaof", "-slaveof").Err(); err != nil {
		t.Fatal(err)
	}

	listening, quiet := st.Sentinel, other
	eventually(t, "the store to listen to a sentinel", func() bool {
		if subscribers(t, other) > 0 {
			listening, quiet = other, st.Sentinel
			return true
		}
		return subscribers(t, st.Sentinel) > 0
	})
	listening.Stop()
	st.FailoverBy(quiet)

	newMaster := st.Replica.Client()
	const follow = 5 * time.Second
	deadline := time.Now().Add(follow)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		after := dedup.Key{Namespace: "stripe", ID: "evt_after_failover_" + strconv.Itoa(i)}
		res, err := s.Claim(ctx, after, dedup.ClaimOptions{Lease: time.Minute})
		if err == nil && res.Outcome == dedup.Claimed {
			err = s.Commit(ctx, after, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
		}
		if n, _ := newMaster.Exists(ctx, s.Key(after)).Result(); err == nil && n == 1 {
			wantDuplicate(t, s, after)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("first delivery after a failover its sentinel missed: got none on the new master after %v (%d tried, last error %v), want one", follow, i+1, err)
		}
		<-tick.C
	}
	wantDuplicate(t, s, before)
}

// subscribers returns how many clients of the sentinel sent listen to a
// channel (go-redis's failover client listens for +switch-master).
func subscribers(t *testing.T, sent *redistest.Server) int {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: sent.Addr(), MaxRetries: -1})
	defer c.Close()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST on the sentinel: %v", err)
	}
	n := 0
	for line := range strings.Lines(list) {
		if !strings.Contains(line, " sub=0 ") {
			n++
		}
	}
	return n
}

// TestConcurrentScriptFlush: 32 callers deliver events through one store (a
// first delivery, then its duplicate) while every master's script cache is
// flushed twice mid-run. Their pipelines mix many callers' scripts; every
// call must still succeed through the NOSCRIPT fallback.
func TestConcurrentScriptFlush(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t)
		s := newStore(t, redisstore.Config{Addrs: []string{srv.Addr()}}, nil)
		concurrentFlush(t, s, []*redis.Client{srv.Client()})
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		s := newStore(t, redisstore.Config{Addrs: cl.Addrs()}, nil)
		var admins []*redis.Client
		for _, node := range cl.Nodes {
			admins = append(admins, node.Client())
		}
		concurrentFlush(t, s, admins)
	})
}

func concurrentFlush(t *testing.T, s *redisstore.Store, admins []*redis.Client) {
	const senders, each = 32, 30
	hook := &countingHook{}
	s.Client().AddHook(hook)
	ctx := context.Background()
	done := make(chan struct{}, senders*each)
	var wg sync.WaitGroup
	for w := range senders {
		wg.Go(func() {
			for i := range each {
				k := dedup.Key{Namespace: "flush", ID: "evt_" + strconv.Itoa(w) + "_" + strconv.Itoa(i)}
				// A lease shorter than the commit fast path's margin: the
				// commit runs commit.lua, which the flushes must unload.
				res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: redisstore.CommitMargin / 2})
				if err == nil && res.Outcome != dedup.Claimed {
					t.Errorf("Claim(%s): got %v, want claimed", k, res.Outcome)
				}
				if err == nil {
					err = s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200})
				}
				if err == nil {
					res, err = s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
					if err == nil && res.Outcome != dedup.Duplicate {
						t.Errorf("Claim(%s) again: got %v, want duplicate", k, res.Outcome)
					}
				}
				if err != nil {
					t.Errorf("delivery of %s: got %v, want nil", k, err)
				}
				done <- struct{}{}
			}
		})
	}
	flush := func() {
		for _, a := range admins {
			if err := a.ScriptFlush(ctx).Err(); err != nil {
				t.Errorf("SCRIPT FLUSH on %s: %v", a.Options().Addr, err)
			}
		}
	}
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	const total = senders * each
	for n := 1; n <= total; n++ {
		select {
		case <-done:
		case <-timeout.C:
			t.Fatalf("%d of %d deliveries after 30s", n-1, total)
		}
		if n == total/3 || n == 2*total/3 {
			flush()
		}
	}
	wg.Wait()
	var evals int
	for _, rt := range hook.take() {
		evals += strings.Count(rt, "eval ") + strings.Count(rt, "eval]")
	}
	if evals == 0 {
		t.Errorf("no EVAL sent: the flushes did not exercise the NOSCRIPT fallback")
	}
}

// A Cluster master killed and replaced by its replica: the store follows
// the promotion after the first command that fails against the dead master.
// go-redis reloads its slot map on MOVED and ASK, and otherwise only every
// 60s or when asked (ForEachMaster, which Ping and the gateway's 30s
// restart watch use), and a dead master answers no MOVED: in an operator
// trial, claims of the dead master's keys kept failing with "connect:
// connection refused" for 24s after the promotion, until the watch
// reloaded the map (on_store_error: reject answered 503, forward forwarded
// them undeduplicated), and only a replica whose /readyz was polled
// followed at once. Nothing here pings: the store's own failures must do.
// Once the promoted replica's keys are served, the dead master's
// pipeliner is closed.
func TestClusterFailoverFollowedWithoutPing(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3)
	// A hash tag in the prefix puts every key in one slot, on one master.
	s := newStore(t, redisstore.Config{Addrs: cl.Addrs(), KeyPrefix: "{" + uniquePrefix() + "}"}, nil)
	ctx := context.Background()
	claimCommit(t, s, dedup.Key{Namespace: "n", ID: "before"}) // loads the slot map

	probe := cl.Client()
	slot, err := probe.ClusterKeySlot(ctx, s.Key(dedup.Key{Namespace: "n", ID: "before"})).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	addr, err := redistest.MasterOf(ctx, cl.Nodes[0].Addr(), int(slot))
	if err != nil || addr == "" {
		t.Fatalf("master of slot %d: got (%q, %v)", slot, addr, err)
	}
	var victim *redistest.Server
	for _, n := range append(slices.Clone(cl.Nodes), cl.Replicas...) {
		if n.Addr() == addr {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("master of slot %d is %s, which the test did not start", slot, addr)
	}
	victim.Stop() // kill -9
	cl.AwaitFailover(victim, int(slot))
	promoted := time.Now()

	// The replica is the master now. Claims may fail until the store has
	// learnt so from a failure, not for much longer.
	const bound = 5 * time.Second
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	failed := 0
	for i := 0; ; i++ {
		k := dedup.Key{Namespace: "n", ID: "after_" + strconv.Itoa(i)}
		res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
		if err == nil {
			if res.Outcome != dedup.Claimed {
				t.Fatalf("Claim(%s) after the failover: got %v, want claimed", k, res.Outcome)
			}
			if err := s.Commit(ctx, k, res.Token, dedup.CommitOptions{Window: time.Hour, Status: 200}); err != nil {
				t.Fatalf("Commit(%s) after the failover: got %v, want nil", k, err)
			}
			wantDuplicate(t, s, k)
			break
		}
		failed++
		if time.Since(promoted) > bound {
			t.Fatalf("claims of the dead master's slot still fail %s after its replica was promoted (%d failed): %v; want the store to follow the new master",
				bound, failed, err)
		}
		<-tick.C
	}
	t.Logf("%d claims failed after the promotion, the first one to succeed %s after it", failed, time.Since(promoted).Round(time.Millisecond))

	// The dead master's pipeliner is closed: kept, those of departed
	// addresses piled up with every restart of a Redis pod.
	if got := s.OpenPipelines(); len(got) != 1 || got[0] == victim.Addr() {
		t.Errorf("open pipelines after the failover: got %v, want the promoted replica's alone, not the dead %s's", got, victim.Addr())
	}
}

// TestClusterHungMasterHoldsOnlyItsKeys: a master that stops answering (a
// stopped host, a partition) holds the claims of its own keys until the
// read timeout, and no others: each master's commands travel in pipelines
// of their own. With one set of pipelines for the whole Cluster, the hung
// master's claims took every pipeline slot and the other masters' claims
// queued behind them.
func TestClusterHungMasterHoldsOnlyItsKeys(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	prefix := uniquePrefix()
	s := newStore(t, redisstore.Config{Addrs: cl.Addrs(), KeyPrefix: prefix, ReadTimeout: time.Minute}, nil)
	ctx := context.Background()
	probe := cl.Client()

	// Keys by master.
	byMaster := map[string][]dedup.Key{}
	for i := 0; len(byMaster) < 3 || minLen(byMaster) < 4; i++ {
		k := dedup.Key{Namespace: "n", ID: "evt_" + strconv.Itoa(i)}
		slot, err := probe.ClusterKeySlot(ctx, s.Key(k)).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		addr, err := redistest.MasterOf(ctx, cl.Nodes[0].Addr(), int(slot))
		if err != nil {
			t.Fatalf("master of slot %d: %v", slot, err)
		}
		byMaster[addr] = append(byMaster[addr], k)
	}
	hung := cl.Nodes[0]
	for _, k := range byMaster[hung.Addr()] { // the slot map loaded, connections made
		claimCommit(t, s, dedup.Key{Namespace: k.Namespace, ID: k.ID + "_warm"})
	}
	hung.Pause()
	t.Cleanup(hung.Resume)

	held := make(chan error, len(byMaster[hung.Addr()]))
	for _, k := range byMaster[hung.Addr()] {
		go func() {
			_, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
			held <- err
		}()
	}
	for addr, keys := range byMaster {
		if addr == hung.Addr() {
			continue
		}
		for _, k := range keys {
			done := make(chan error, 1)
			go func() {
				_, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute})
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Claim(%s) on %s while %s hangs: got %v, want nil", k.ID, addr, hung.Addr(), err)
				}
			case err := <-held:
				t.Fatalf("a claim on the hung master returned (%v) before the claim of %s on %s: want the other masters answered first", err, k.ID, addr)
			case <-time.After(20 * time.Second): // far below the minute's read timeout
				t.Fatalf("Claim(%s) on %s still waiting 20s after %s hung: want it answered by its own master", k.ID, addr, hung.Addr())
			}
		}
	}
	hung.Resume()
	for range byMaster[hung.Addr()] {
		if err := <-held; err != nil {
			t.Errorf("a claim on the hung master, once it resumed: got %v, want nil", err)
		}
	}
}

// minLen returns the length of m's shortest list.
func minLen(m map[string][]dedup.Key) int {
	n := -1
	for _, ks := range m {
		if n < 0 || len(ks) < n {
			n = len(ks)
		}
	}
	return n
}
