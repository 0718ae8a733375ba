package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

// A store waiting for a replica passes the whole contract while the replica
// acknowledges.
func TestConformanceWaitingForAReplica(t *testing.T) {
	master, _ := redistest.StartReplicated(t)
	storetest.Run(t, storetest.Harness{
		ListUnordered: true, // SCAN
		New: func(t testing.TB, now dedup.Clock) dedup.Store {
			return newStore(t, redisstore.Config{Addrs: []string{master.Addr()}, WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond}, now)
		},
	})
}

// BenchmarkStoreWaitingForAReplica is BenchmarkStore against a master with
// one replica, waiting for it: the price of WaitReplicas.
func BenchmarkStoreWaitingForAReplica(b *testing.B) {
	master, _ := redistest.StartReplicated(b)
	storetest.Bench(b, storetest.Harness{
		New: func(t testing.TB, now dedup.Clock) dedup.Store {
			return newStore(t, redisstore.Config{Addrs: []string{master.Addr()}, WaitReplicas: 1}, now)
		},
	})
}

// BenchmarkClaimWhileTheReplicaHangs claims new keys from 32 goroutines
// while the only replica is frozen (SIGSTOP): every claim fails after
// waiting, and the benchmark reports how many the store still turns around.
func BenchmarkClaimWhileTheReplicaHangs(b *testing.B) {
	ctx := context.Background()
	master, replica := redistest.StartReplicated(b)
	s := newStore(b, redisstore.Config{Addrs: []string{master.Addr()}, WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond}, nil)
	replica.Pause()
	defer replica.Resume()
	var next atomic.Int64
	b.SetParallelism(16) // 16×GOMAXPROCS: 32 on 2 cores
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := dedup.Key{Namespace: "n", ID: strconv.FormatInt(next.Add(1), 10)}
			if _, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); !errors.Is(err, dedup.ErrNotReplicated) {
				b.Errorf("Claim with the replica hung: got %v, want ErrNotReplicated", err)
				return
			}
		}
	})
}

// With WaitReplicas, a claim or commit the replica did not acknowledge fails
// with ErrNotReplicated (the claim undone, so the key is not held), while
// answers that wrote nothing stand.
func TestWaitReplicas(t *testing.T) {
	ctx := context.Background()
	master, replica := redistest.StartReplicated(t)
	s := newStore(t, redisstore.Config{Addrs: []string{master.Addr()}, WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond}, nil)
	key := func(id string) dedup.Key { return dedup.Key{Namespace: "n", ID: id} }
	claim := func(id string) (dedup.ClaimResult, error) {
		return s.Claim(ctx, key(id), dedup.ClaimOptions{Lease: time.Minute})
	}
	commit := func(id, token string) error {
		return s.Commit(ctx, key(id), token, dedup.CommitOptions{Window: time.Hour, Status: 200})
	}

	// Acknowledged: the replica holds each write as soon as it returns.
	res, err := claim("done")
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("Claim with the replica up: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
	if v, err := replica.Client().Get(ctx, s.Key(key("done"))).Result(); err != nil || !strings.HasPrefix(v, "p,") {
		t.Errorf("replica after Claim returned: got (%q, %v), want the processing record", v, err)
	}
	if err := commit("done", res.Token); err != nil {
		t.Fatalf("Commit with the replica up: got %v, want nil", err)
	}
	if v, err := replica.Client().Get(ctx, s.Key(key("done"))).Result(); err != nil || !strings.HasPrefix(v, "d,") {
		t.Errorf("replica after Commit returned: got (%q, %v), want the processed record", v, err)
	}
	held, err := claim("held")
	if err != nil {
		t.Fatal(err)
	}
	// A failed record, which a claim takes over with claim.lua.
	failed, err := claim("failed")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, key("failed"), failed.Token, dedup.ReleaseOptions{Retain: time.Hour, Status: 500}); err != nil {
		t.Fatal(err)
	}

	replica.Stop()

	res, err = claim("new")
	if !errors.Is(err, dedup.ErrNotReplicated) {
		t.Errorf("Claim without the replica: got (%v, %v), want ErrNotReplicated", res.Outcome, err)
	}
	if err := master.Client().Get(ctx, s.Key(key("new"))).Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("master after the unacknowledged claim: got %v, want the key undone (redis.Nil)", err)
	}
	if res, err := claim("done"); err != nil || res.Outcome != dedup.Duplicate {
		t.Errorf("Claim of a processed key without the replica: got (%v, %v), want (duplicate, nil)", res.Outcome, err)
	}
	res, err = claim("failed")
	if !errors.Is(err, dedup.ErrNotReplicated) {
		t.Errorf("Claim taking over a failed record without the replica: got (%v, %v), want ErrNotReplicated", res.Outcome, err)
	}
	if err := master.Client().Get(ctx, s.Key(key("failed"))).Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("master after the unacknowledged takeover: got %v, want the key undone (redis.Nil)", err)
	}
	// After a restart or a failover the scripts are gone: the commit is
	// sent again as EVAL, and waits as well.
	if err := master.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := commit("held", held.Token); !errors.Is(err, dedup.ErrNotReplicated) {
		t.Errorf("Commit (EVAL after SCRIPT FLUSH) without the replica: got %v, want ErrNotReplicated", err)
	}
	if v, err := master.Client().Get(ctx, s.Key(key("held"))).Result(); err != nil || !strings.HasPrefix(v, "d,") {
		t.Errorf("master after the unacknowledged commit: got (%q, %v), want the processed record", v, err)
	}

	replica.Start()
	redistest.AwaitReplicas(t, master, 1)
	if res, err := claim("new"); err != nil || res.Outcome != dedup.Claimed {
		t.Errorf("Claim once the replica is back: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
}

// A claim fails when fewer replicas than WaitReplicas are attached, or when
// WAIT is refused (an ACL user without +wait), and leaves no key behind.
func TestWaitReplicasUnmet(t *testing.T) {
	ctx := context.Background()
	master, _ := redistest.StartReplicated(t)
	if err := master.Client().Do(ctx, "acl", "setuser", "nowait", "on", ">pw", "~*", "+@all", "-wait").Err(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  redisstore.Config
	}{
		{"two replicas wanted, one attached", redisstore.Config{Addrs: []string{master.Addr()}, WaitReplicas: 2}},
		{"WAIT refused", redisstore.Config{Addrs: []string{master.Addr()}, WaitReplicas: 1, Username: "nowait", Password: "pw"}},
	}
	for i, tt := range tests {
		s := newStore(t, tt.cfg, nil)
		k := dedup.Key{Namespace: "n", ID: strconv.Itoa(i)}
		if res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); !errors.Is(err, dedup.ErrNotReplicated) {
			t.Errorf("%s: Claim: got (%v, %v), want ErrNotReplicated", tt.name, res.Outcome, err)
		}
		if err := master.Client().Get(ctx, s.Key(k)).Err(); !errors.Is(err, redis.Nil) {
			t.Errorf("%s: master after the claim: got %v, want the key undone (redis.Nil)", tt.name, err)
		}
		// The start-up check says so; readiness (Ping) does not, since
		// the replicas are shared by every gateway.
		if err := s.CheckCommands(ctx); !errors.Is(err, dedup.ErrNotReplicated) {
			t.Errorf("%s: CheckCommands: got %v, want ErrNotReplicated", tt.name, err)
		}
		if err := s.Ping(ctx); err != nil {
			t.Errorf("%s: Ping: got %v, want nil", tt.name, err)
		}
	}
	ok := newStore(t, redisstore.Config{Addrs: []string{master.Addr()}, WaitReplicas: 1}, nil)
	if err := ok.CheckCommands(ctx); err != nil {
		t.Errorf("CheckCommands with the replica acknowledging: got %v, want nil", err)
	}
}

// CheckCommands writes before it waits: a WAIT after no write counts a
// hung replica, which is still attached, as acknowledging.
func TestCheckCommandsSeesAHungReplica(t *testing.T) {
	ctx := context.Background()
	master, replica := redistest.StartReplicated(t)
	s := newStore(t, redisstore.Config{Addrs: []string{master.Addr()}, WaitReplicas: 1}, nil)
	replica.Pause()
	defer replica.Resume()
	if err := s.CheckCommands(ctx); !errors.Is(err, dedup.ErrNotReplicated) {
		t.Errorf("CheckCommands with the replica hung: got %v, want ErrNotReplicated", err)
	}
}

// WaitReplicas works through Sentinel, whose client follows the master.
func TestWaitReplicasBehindSentinel(t *testing.T) {
	ctx := context.Background()
	st := redistest.StartSentinel(t)
	s := newStore(t, redisstore.Config{Addrs: []string{st.Sentinel.Addr()}, MasterName: st.MasterName, WaitReplicas: 1}, nil)
	k := dedup.Key{Namespace: "n", ID: "evt_1"}
	claimCommit(t, s, k)
	if v, err := st.Replica.Client().Get(ctx, s.Key(k)).Result(); err != nil || !strings.HasPrefix(v, "d,") {
		t.Errorf("replica after Commit returned: got (%q, %v), want the processed record", v, err)
	}
}

func TestWaitReplicasConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  redisstore.Config
		want string
	}{
		{"negative", redisstore.Config{Addrs: []string{"a:1"}, WaitReplicas: -1}, "wait_replicas: must not be negative"},
		{"sentinel username without a password", redisstore.Config{Addrs: []string{"a:1"}, MasterName: "m", SentinelUsername: "u"}, "sentinel_username: needs sentinel_password"},
		{"sentinel password without Sentinel", redisstore.Config{Addrs: []string{"a:1"}, SentinelPassword: "pw"}, "sentinel_username, sentinel_password: set only with master_name"},
		{"cluster", redisstore.Config{Addrs: []string{"a:1", "b:1"}, WaitReplicas: 1}, "wait_replicas: a Cluster"},
		{"negative timeout", redisstore.Config{Addrs: []string{"a:1"}, WaitReplicas: 1, WaitTimeout: -time.Second}, "wait_timeout: must not be negative"},
		{"under a millisecond", redisstore.Config{Addrs: []string{"a:1"}, WaitReplicas: 1, WaitTimeout: time.Microsecond}, "wait_timeout: must be at least 1ms"},
		{"not below the read timeout", redisstore.Config{Addrs: []string{"a:1"}, WaitReplicas: 1, WaitTimeout: time.Second}, "wait_timeout: 1s must be below the read timeout (1s)"},
	}
	for _, tt := range tests {
		_, err := redisstore.New(tt.cfg, redisstore.Options{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	s, err := redisstore.New(redisstore.Config{Addrs: []string{"a:1"}, WaitReplicas: 1, WaitTimeout: time.Second, ReadTimeout: 2 * time.Second}, redisstore.Options{})
	if err != nil {
		t.Errorf("a wait below the read timeout: got %v, want nil", err)
	} else {
		_ = s.Close()
	}
}

// cutProxy forwards TCP connections to a Redis server. The first connection
// that sends a SET is cut as soon as the server starts to answer: the
// command is applied, and its reply lost. Later connections pass.
type cutProxy struct {
	l      net.Listener
	target string
	cut    atomic.Bool
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, target: target}
	p.wg.Go(p.serve)
	t.Cleanup(func() { _ = l.Close(); p.wg.Wait() })
	return p
}

func (p *cutProxy) addr() string { return p.l.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.relay(c) })
	}
}

func (p *cutProxy) relay(c net.Conn) {
	defer c.Close()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer s.Close()
	var armed atomic.Bool // this connection sent a SET, and none was cut yet
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 32<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if !p.cut.Load() && bytes.Contains(bytes.ToLower(buf[:n]), []byte("\r\nset\r\n")) {
					armed.Store(true)
				}
				if _, werr := s.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				_ = s.Close()
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 && armed.Load() && p.cut.CompareAndSwap(false, true) {
			_ = c.Close() // the reply is lost
			_ = s.Close()
			break
		}
		if n > 0 {
			if _, werr := c.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = c.Close()
	<-done
}

// A claim whose reply is lost (no retries while waiting for replicas) is
// undone in the background, so the key is not held in flight for a lease.
func TestLostClaimReplyIsUndone(t *testing.T) {
	ctx := context.Background()
	master, _ := redistest.StartReplicated(t)
	proxy := newCutProxy(t, master.Addr())
	// A generous wait: the replica must acknowledge the second claim on a
	// loaded CI machine too (the default 100ms once was not enough there).
	s := newStore(t, redisstore.Config{Addrs: []string{proxy.addr()}, WaitReplicas: 1, WaitTimeout: 500 * time.Millisecond}, nil)
	k := dedup.Key{Namespace: "n", ID: "evt_lost"}
	if res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err == nil {
		t.Fatalf("Claim whose reply was cut: got (%v, nil), want an error", res.Outcome)
	}
	if !proxy.cut.Load() {
		t.Fatal("the proxy cut nothing")
	}
	deadline := time.Now().Add(5 * time.Second)
	for master.Client().Exists(ctx, s.Key(k)).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the claim whose reply was lost still holds the key after 5s, want it undone")
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
	if res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Claimed {
		t.Errorf("Claim again: got (%v, %v), want (claimed, nil)", res.Outcome, err)
	}
}

// A claim that could not connect was never sent: nothing is undone. An undo
// started for it would only add a script run behind the next claims, or
// (with Redis back by then) a round trip on the restarted server.
func TestClaimThatCouldNotConnectIsNotUndone(t *testing.T) {
	srv := redistest.Start(t)
	srv.Stop()
	s, err := redisstore.New(redisstore.Config{Addrs: []string{srv.Addr()}, KeyPrefix: uniquePrefix(), DialTimeout: 200 * time.Millisecond}, redisstore.Options{})
	if err != nil {
		t.Fatalf("New while Redis is down: got %v, want nil", err)
	}
	hook := &countingHook{}
	s.Client().AddHook(hook)
	k := dedup.Key{Namespace: "down", ID: "evt_undo"}
	if _, err := s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: time.Minute}); err == nil {
		t.Fatal("Claim while Redis is down: got nil, want a connection error")
	}
	if err := s.Close(); err != nil { // waits for the undos started
		t.Fatalf("Close: %v", err)
	}
	for _, trip := range hook.take() {
		if strings.Contains(trip, "eval") {
			t.Errorf("round trips after a claim that could not connect: got %q, want no undo (release.lua)", trip)
		}
	}
}

// A claim applied whose reply was lost, and whose re-send by go-redis
// (MaxRetries) could not connect, is undone, not left holding the key for a
// lease. undoIfUnclear takes a dial error for a claim never sent; that
// holds because go-redis stamps a pipelined command with the first error of
// its attempts (the lost reply's), not with the retry's dial error. Were
// that to change, this test fails.
func TestClaimSentThenRetryCouldNotConnectIsUndone(t *testing.T) {
	srv := redistest.Start(t)
	proxy := newCutProxy(t, srv.Addr())
	var refused, settled atomic.Bool
	client := redis.NewClient(&redis.Options{
		Addr: proxy.addr(),
		// As New configures a client: one retry, one dial per attempt.
		MaxRetries:    1,
		DialerRetries: 1,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if proxy.cut.Load() && !settled.Load() {
				// Redis is unreachable from the cut until the claim failed.
				refused.Store(true)
				return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	})
	t.Cleanup(func() { _ = client.Close() })
	client.AddHook(afterPipelineHook(func() { settled.Store(proxy.cut.Load()) }))
	s := redisstore.NewFromClient(client, uniquePrefix(), redisstore.Options{})
	k := dedup.Key{Namespace: "n", ID: "evt_sent"}
	if _, err := s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: time.Minute}); err == nil {
		t.Fatal("Claim whose reply was cut and whose retry could not connect: got nil, want an error")
	}
	if !proxy.cut.Load() || !refused.Load() {
		t.Fatalf("got cut %v, retry refused %v, want both", proxy.cut.Load(), refused.Load())
	}
	if err := s.Close(); err != nil { // waits for the undos started
		t.Fatalf("Close: %v", err)
	}
	if got := srv.Client().Exists(context.Background(), s.Key(k)).Val(); got != 0 {
		t.Errorf("key of a claim applied, its reply lost and its retry unable to connect: got it held (%d), want it undone", got)
	}
}

// afterPipelineHook calls done after each pipeline (its retries included)
// returned, before its caller sees the answer.
type afterPipelineHook func()

func (h afterPipelineHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h afterPipelineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h afterPipelineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h()
		return err
	}
}
