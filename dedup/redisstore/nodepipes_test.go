package redisstore

import (
	"context"
	"errors"
	"net"
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
