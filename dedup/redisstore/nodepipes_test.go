package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

// silentListener accepts connections on loopback and never answers: a
// Redis that hangs, or a host that swallows packets after the handshake.
type silentListener struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

// newSilentListener starts one, closed (with every connection it took)
// when t ends.
func newSilentListener(t *testing.T) *silentListener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	s := &silentListener{l: l, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-s.done
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.conns {
			_ = c.Close()
		}
	})
	return s
}

func (s *silentListener) addr() string { return s.l.Addr().String() }

// sentHook counts what a client sends: commands on their own and
// pipelines.
type sentHook struct{ cmds, pipelines atomic.Int64 }

func (h *sentHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *sentHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		return next(ctx, cmd)
	}
}

func (h *sentHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.pipelines.Add(1)
		return next(ctx, cmds)
	}
}

// TestClusterWithoutSlotMapSendsNothing: while a Cluster client has never
// loaded its slot map (the Cluster hangs since start, or the address is no
// Cluster node), an operation fails with the failure to load it, and sends
// nothing. Handing the command to a pipeliner all the same loaded the map a
// second time, for the pipeline (a failing claim took twice the read
// timeout); a claim's failure, taken for a lost reply, started an undo (a
// third load); and CLUSTER SLOTS's "ERR", taken for SET NX GET's, turned
// the claim fast path off.
func TestClusterWithoutSlotMapSendsNothing(t *testing.T) {
	hung := newSilentListener(t).addr()
	single := redistest.Start(t).Addr()
	claim := func(ctx context.Context, s *Store) error {
		_, err := s.Claim(ctx, dedup.Key{Namespace: "n", ID: "evt"}, dedup.ClaimOptions{Lease: time.Minute})
		return err
	}
	timeout := func(err error) bool {
		var ne net.Error
		return errors.As(err, &ne) && ne.Timeout()
	}
	noCluster := func(err error) bool {
		var rerr redis.Error
		return errors.As(err, &rerr) && strings.Contains(rerr.Error(), "cluster support disabled")
	}
	tests := []struct {
		name  string
		addr  string
		op    func(context.Context, *Store) error
		cause func(error) bool // the load's failure
	}{
		{"claim, the Cluster hung", hung, claim, timeout},
		{"claim, the Cluster hung, bound by the caller's deadline", hung, func(ctx context.Context, s *Store) error {
			ctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond) // below the read timeout
			defer cancel()
			return claim(ctx, s)
		}, timeout},
		{"get, the Cluster hung", hung, func(ctx context.Context, s *Store) error {
			_, err := s.Get(ctx, dedup.Key{Namespace: "n", ID: "evt"})
			return err
		}, timeout},
		{"claim, no Cluster node", single, claim, noCluster},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(Config{Addrs: []string{tt.addr}, Cluster: true, ReadTimeout: 100 * time.Millisecond}, Options{})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			hook := &sentHook{}
			s.Client().AddHook(hook)
			err = tt.op(context.Background(), s)
			if err := s.Close(); err != nil { // waits for the undos started
				t.Fatalf("Close: %v", err)
			}

			if err == nil {
				t.Fatal("error: got nil, want the slot map's load's")
			}
			if sm := (*slotMapError)(nil); !errors.As(err, &sm) {
				t.Errorf("error: got %v, want a *slotMapError", err)
			}
			if !tt.cause(err) {
				t.Errorf("error: got %v, want it to wrap the load's failure", err)
			}
			if !strings.Contains(err.Error(), "slot map could not be loaded") {
				t.Errorf("error: got %q, want it to say the slot map could not be loaded", err)
			}
			if got := hook.pipelines.Load(); got != 0 {
				t.Errorf("pipelines sent: got %d, want 0", got)
			}
			if got := hook.cmds.Load(); got != 0 {
				t.Errorf("commands sent on their own (an undo): got %d, want 0", got)
			}
			if s.scriptOnly.Load() {
				t.Error("claim fast path: got off, want on (the server never answered SET NX GET)")
			}
		})
	}
}

// slotMapCluster is a Store on a Cluster client whose slot map
// (ClusterSlots) gives every slot to one of two plain servers, a or b:
// moveTo makes another the master, once the client has loaded the map
// naming it.
type slotMapCluster struct {
	t      *testing.T
	s      *Store
	cc     *redis.ClusterClient
	a, b   string
	master atomic.Value // string
}

func newSlotMapCluster(t *testing.T) *slotMapCluster {
	t.Helper()
	// By name: go-redis replaces a loopback IP in a slot map it did not
	// load from a node.
	addr := func(s *redistest.Server) string { return net.JoinHostPort("localhost", strconv.Itoa(s.Port())) }
	c := &slotMapCluster{t: t, a: addr(redistest.Start(t)), b: addr(redistest.Start(t))}
	c.master.Store(c.a)
	c.cc = redis.NewClusterClient(&redis.ClusterOptions{
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: c.master.Load().(string)}}}}, nil
		},
	})
	t.Cleanup(func() { _ = c.cc.Close() })
	c.s = NewFromClient(c.cc, "", Options{})
	t.Cleanup(func() { _ = c.s.Close() })
	return c
}

func (c *slotMapCluster) moveTo(addr string) {
	c.t.Helper()
	c.master.Store(addr)
	waitFor(c.t, "the client to load the slot map naming "+addr, func() bool {
		node, err := c.cc.MasterForKey(context.Background(), "k")
		if err == nil && node.Options().Addr == addr {
			return true
		}
		// Again: go-redis drops a reload asked for while one runs.
		c.cc.ReloadState(context.Background())
		return false
	})
}

// claim claims a new key, failing t unless it is claimed.
func (c *slotMapCluster) claim(id string) {
	c.t.Helper()
	res, err := c.s.Claim(context.Background(), dedup.Key{Namespace: "n", ID: id}, dedup.ClaimOptions{Lease: time.Minute})
	if err != nil || res.Outcome != dedup.Claimed {
		c.t.Fatalf("Claim(%s) on %s: got (%v, %v), want claimed", id, c.master.Load(), res.Outcome, err)
	}
}

// TestClusterDepartedMasterPipelinerClosed: the pipeliner of a master
// address that left the slot map is closed, and its workers exit, once a
// new master's arrival shows the map changed; but never under a caller it
// was handed to: that caller's command still goes through, and its
// release closes it. Kept until Close, pipeliners piled up with every
// Redis pod restart (a new address each) over a gateway's life.
func TestClusterDepartedMasterPipelinerClosed(t *testing.T) {
	c := newSlotMapCluster(t)
	ctx := context.Background()

	c.claim("on_a")
	pa := c.s.nodes.pipeliner(c.a)
	awaitWorkers(t, pa, defaultInFlight)
	// A caller handed a's pipeliner, about to send on it.
	held, err := c.s.nodes.forKey(ctx, c.s.Key(dedup.Key{Namespace: "n", ID: "held"}))
	if err != nil || held.p != pa {
		t.Fatalf("forKey: got (%+v, %v), want a's pipeliner", held, err)
	}

	c.moveTo(c.b)
	c.claim("on_b") // b arrives: a is retired, but still in use
	c.s.nodes.awaitCloses()
	if got := c.s.nodes.addrs(); !slices.Equal(got, []string{c.b}) {
		t.Errorf("pipelined masters after a left: got %v, want [%s]", got, c.b)
	}
	if pa.isClosed() || pipelineWorkers(pa) != defaultInFlight {
		t.Errorf("a's pipeliner, handed out and not released: got closed %v with %d workers, want open with %d",
			pa.isClosed(), pipelineWorkers(pa), defaultInFlight)
	}
	if err := pa.get(ctx, "absent").Err(); !isNil(err) {
		t.Errorf("GET on a's pipeliner, handed out before a left: got %v, want redis.Nil", err)
	}
	c.s.nodes.release(held) // the last user: closes it
	c.s.nodes.awaitCloses()
	if !pa.isClosed() || pipelineWorkers(pa) != 0 {
		t.Errorf("a's pipeliner after its last user released it: got closed %v with %d workers, want closed with 0",
			pa.isClosed(), pipelineWorkers(pa))
	}

	pb := c.s.nodes.pipeliner(c.b)
	awaitWorkers(t, pb, defaultInFlight)
	c.moveTo(c.a)
	c.claim("on_a_again") // a arrives: b's pipeliner, unused, is closed at once
	c.s.nodes.awaitCloses()
	if got := c.s.nodes.addrs(); !slices.Equal(got, []string{c.a}) {
		t.Errorf("pipelined masters after b left: got %v, want [%s]", got, c.a)
	}
	if !pb.isClosed() || pipelineWorkers(pb) != 0 {
		t.Errorf("b's pipeliner, unused when b left: got closed %v with %d workers, want closed with 0",
			pb.isClosed(), pipelineWorkers(pb))
	}
	c.claim("after")
}

// TestClusterMasterChurnUnderLoad: claims running while the master moves
// back and forth never fail, none meets a pipeliner closed under it; once
// the moves end, the last master's pipeliner is the one left.
func TestClusterMasterChurnUnderLoad(t *testing.T) {
	c := newSlotMapCluster(t)
	stop := make(chan struct{})
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for w := range cap(errs) {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := dedup.Key{Namespace: "n", ID: strconv.Itoa(w) + "_" + strconv.Itoa(i)}
				if _, err := c.s.Claim(context.Background(), k, dedup.ClaimOptions{Lease: time.Minute}); err != nil {
					errs <- fmt.Errorf("Claim(%s): %w", k.ID, err)
					return
				}
			}
		})
	}
	for i := range 10 {
		c.moveTo([]string{c.b, c.a}[i%2])
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("while the master moved: got %v, want nil", err)
	}
	c.claim("after")
	c.s.nodes.awaitCloses()
	if got := c.s.nodes.addrs(); !slices.Equal(got, []string{c.a}) {
		t.Errorf("pipelined masters: got %v, want [%s], the last master", got, c.a)
	}
	others := pipelineWorkers(nil) - pipelineWorkers(c.s.pipe) - pipelineWorkers(c.s.nodes.pipeliner(c.a))
	if others != 0 {
		t.Errorf("workers of pipeliners other than the Store's and the last master's: got %d, want 0", others)
	}
}

// addrs returns the master addresses n has a pipeliner for, sorted.
func (n *nodePipes) addrs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Sorted(maps.Keys(n.m))
}

// awaitCloses waits until the pipeliners n retired so far are closed. No
// forKey or release may run meanwhile.
func (n *nodePipes) awaitCloses() { n.closing.Wait() }

// open returns the master addresses of n's pipeliners not closed, those
// retired and still in use too, sorted.
func (n *nodePipes) open() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	addrs := slices.Collect(maps.Keys(n.m))
	for np := range n.retired {
		addrs = append(addrs, np.addr)
	}
	slices.Sort(addrs)
	return addrs
}

// pipeliner returns n's pipeliner for the master at addr, or nil.
func (n *nodePipes) pipeliner(addr string) *pipeliner {
	n.mu.Lock()
	defer n.mu.Unlock()
	if np := n.m[addr]; np != nil {
		return np.p
	}
	return nil
}

// awaitWorkers waits until want of p's workers run: every worker it
// started has begun to run.
func awaitWorkers(t *testing.T, p *pipeliner, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d pipeline workers", want), func() bool { return pipelineWorkers(p) == want })
}

// pipelineWorkers returns how many of p's workers run, or of every
// pipeliner's when p is nil. A worker started and not yet scheduled is
// not counted.
func pipelineWorkers(p *pipeliner) int {
	frame := "redisstore.(*pipeliner).work("
	if p != nil {
		frame += fmt.Sprintf("%p", p)
	}
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), frame)
		}
		buf = make([]byte, 2*len(buf))
	}
}
