package proxy

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/memstore"
)

type ctxKey string

func TestOpContext(t *testing.T) {
	values := context.WithoutCancel(context.WithValue(context.Background(), ctxKey("k"), "v"))

	t.Run("before the deadline", func(t *testing.T) {
		now := time.Now()
		c := newOpContext(values, now, time.Hour)
		defer c.stop()
		if d, ok := c.Deadline(); !ok || !d.Equal(now.Add(time.Hour)) {
			t.Errorf("Deadline: got %v %v, want %v true", d, ok, now.Add(time.Hour))
		}
		if err := c.Err(); err != nil {
			t.Errorf("Err: got %v, want nil", err)
		}
		if got := c.Value(ctxKey("k")); got != "v" {
			t.Errorf("Value: got %v, want v", got)
		}
		select {
		case <-c.Done():
			t.Errorf("Done is closed before the deadline")
		default:
		}
		if got := c.Value(ctxKey("k")); got != "v" {
			t.Errorf("Value after Done: got %v, want v", got)
		}
	})

	t.Run("deadline passed, Err first", func(t *testing.T) {
		c := newOpContext(values, time.Now().Add(-time.Second), time.Millisecond)
		defer c.stop()
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Err: got %v, want DeadlineExceeded", err)
		}
		select {
		case <-c.Done():
		default:
			t.Fatalf("Done is open after Err reported the deadline")
		}
		c.stop()
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Err after stop: got %v, want DeadlineExceeded", err)
		}
		if err := context.Cause(c); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Cause: got %v, want DeadlineExceeded", err)
		}
	})

	t.Run("deadline passed, Done first", func(t *testing.T) {
		c := newOpContext(values, time.Now().Add(-time.Second), time.Millisecond)
		defer c.stop()
		select {
		case <-c.Done():
		default:
			t.Fatalf("Done is open after the deadline")
		}
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Err: got %v, want DeadlineExceeded", err)
		}
	})

	t.Run("Done closes at the deadline", func(t *testing.T) {
		start := time.Now()
		c := newOpContext(values, start, 20*time.Millisecond)
		defer c.stop()
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("Done still open 10s after a 20ms deadline")
		}
		if took := time.Since(start); took < 20*time.Millisecond {
			t.Errorf("Done closed after %s, before the 20ms deadline", took)
		}
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Err: got %v, want DeadlineExceeded", err)
		}
	})

	t.Run("stop before Done", func(t *testing.T) {
		c := newOpContext(values, time.Now(), time.Hour)
		c.stop()
		if err := c.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("Err: got %v, want Canceled", err)
		}
		select {
		case <-c.Done():
		default:
			t.Errorf("Done is open after stop")
		}
		if err := c.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("Err after Done: got %v, want Canceled", err)
		}
	})

	t.Run("stop after Done", func(t *testing.T) {
		c := newOpContext(values, time.Now(), time.Hour)
		done := c.Done()
		c.stop()
		select {
		case <-done:
		default:
			t.Errorf("Done is open after stop")
		}
		if err := c.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("Err: got %v, want Canceled", err)
		}
	})

	t.Run("derived contexts follow it", func(t *testing.T) {
		c := newOpContext(values, time.Now(), time.Hour)
		child, cancel := context.WithCancel(c)
		defer cancel()
		ran := make(chan struct{})
		context.AfterFunc(c, func() { close(ran) })
		if got := child.Value(ctxKey("k")); got != "v" {
			t.Errorf("child Value: got %v, want v", got)
		}
		c.stop()
		select {
		case <-child.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("child still open 10s after stop")
		}
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Fatalf("AfterFunc did not run within 10s of stop")
		}
		if err := child.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("child Err: got %v, want Canceled", err)
		}
	})

	t.Run("concurrent use", func(t *testing.T) {
		c := newOpContext(values, time.Now(), time.Millisecond)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				for range 100 {
					switch i % 4 {
					case 0:
						_ = c.Err()
					case 1:
						<-c.Done()
					case 2:
						_ = c.Value(ctxKey("k"))
					case 3:
						_, _ = c.Deadline()
					}
				}
			})
		}
		wg.Wait()
		c.stop()
		if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Err: got %v, want DeadlineExceeded", err)
		}
	})
}

// opSeen is what ctxStore saw of one operation's context.
type opSeen struct {
	op       string
	left     time.Duration // deadline minus the time of the call
	deadline bool
	server   bool  // carries the request's http.ServerContextKey value
	errAtEnd error // ctx.Err() when the operation returned
	ctx      context.Context
}

// ctxStore records the context of every Claim, Get, Commit and Release; an
// operation named in hang waits until its context is done and fails with
// the context's error.
type ctxStore struct {
	dedup.Store
	hang    map[string]bool
	started chan string // receives an op's name as it starts hanging

	mu   sync.Mutex
	seen []opSeen
}

func (s *ctxStore) record(ctx context.Context, op string) error {
	now := time.Now()
	dl, ok := ctx.Deadline()
	var err error
	if s.hang[op] {
		if s.started != nil {
			s.started <- op
		}
		<-ctx.Done()
		err = ctx.Err()
	}
	s.mu.Lock()
	s.seen = append(s.seen, opSeen{op: op, left: dl.Sub(now), deadline: ok, server: ctx.Value(http.ServerContextKey) != nil, errAtEnd: ctx.Err(), ctx: ctx})
	s.mu.Unlock()
	return err
}

func (s *ctxStore) ops() []opSeen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]opSeen(nil), s.seen...)
}

func (s *ctxStore) Claim(ctx context.Context, k dedup.Key, o dedup.ClaimOptions) (dedup.ClaimResult, error) {
	if err := s.record(ctx, "claim"); err != nil {
		return dedup.ClaimResult{}, err
	}
	return s.Store.Claim(ctx, k, o)
}

func (s *ctxStore) Get(ctx context.Context, k dedup.Key) (dedup.Record, error) {
	if err := s.record(ctx, "get"); err != nil {
		return dedup.Record{}, err
	}
	return s.Store.Get(ctx, k)
}

func (s *ctxStore) Commit(ctx context.Context, k dedup.Key, tok string, o dedup.CommitOptions) error {
	if err := s.record(ctx, "commit"); err != nil {
		return err
	}
	return s.Store.Commit(ctx, k, tok, o)
}

func (s *ctxStore) Release(ctx context.Context, k dedup.Key, tok string, o dedup.ReleaseOptions) error {
	if err := s.record(ctx, "release"); err != nil {
		return err
	}
	return s.Store.Release(ctx, k, tok, o)
}

func ctxStoreGateway(t *testing.T, s *ctxStore, storeTimeout time.Duration, routes ...Route) *harness {
	t.Helper()
	mem := memstore.New(memstore.Options{SweepInterval: -1})
	t.Cleanup(func() { _ = mem.Close() })
	s.Store = mem
	gw, err := New(Config{Routes: routes}, s, Options{Registerer: prometheus.NewRegistry(), Backend: "memory", StoreTimeout: storeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, gw: gw, store: mem, mem: mem, srv: httptest.NewServer(gw)}
	t.Cleanup(func() { h.srv.Close(); _ = gw.Close() })
	return h
}

// TestStoreOpContexts: every store operation runs under the store timeout,
// on the request's values, and is not cancelled by anything else; after it
// returned its context is cancelled.
func TestStoreOpContexts(t *testing.T) {
	up := newUpstream(t, nil)
	api := paymentsRoute(up.URL) // fingerprints: a get before the claim
	s := &ctxStore{}
	h := ctxStoreGateway(t, s, 3*time.Second, genericRoute("orders", "/hooks/orders", up.URL), api)
	for _, tc := range []struct{ path, status string }{
		{"/hooks/orders", statusForwarded},
		{"/hooks/orders", statusDuplicate},
		{payCharge, statusForwarded},
	} {
		if got := h.send(tc.path, `{"id":"evt_1","amount":1}`, "Idempotency-Key: k1").Header.Get(HeaderDedupStatus); got != tc.status {
			t.Fatalf("%s: got Dedup-Status %q, want %q", tc.path, got, tc.status)
		}
	}
	up500 := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusInternalServerError) })
	if err := h.gw.Reload(Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up500.URL)}}); err != nil {
		t.Fatal(err)
	}
	if got := h.send("/hooks/orders", `{"id":"evt_2"}`).Status; got != http.StatusInternalServerError {
		t.Fatalf("failing upstream: got %d, want 500", got)
	}

	var ops []string
	for _, o := range s.ops() {
		ops = append(ops, o.op)
		if !o.deadline || o.left <= 0 || o.left > 3*time.Second {
			t.Errorf("%s: got deadline %v, %s after the call; want one within the 3s store timeout", o.op, o.deadline, o.left)
		}
		if !o.server {
			t.Errorf("%s: the context lacks the request's values", o.op)
		}
		if o.errAtEnd != nil {
			t.Errorf("%s: context done during the operation: %v", o.op, o.errAtEnd)
		}
		if err := o.ctx.Err(); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: got Err %v after the operation, want Canceled (released)", o.op, err)
		}
	}
	want := []string{"claim", "commit", "claim", "claim", "commit", "claim", "release"} // a fingerprinting route claims without a get first
	if len(ops) != len(want) {
		t.Fatalf("got operations %v, want %v", ops, want)
	}
	for i := range want {
		if ops[i] != want[i] {
			t.Fatalf("got operations %v, want %v", ops, want)
		}
	}
}

// TestStoreTimeoutBoundsEachOperation: a store that never answers is given
// up on after the store timeout: a hung claim is a store error (forwarded
// without deduplication by default), a hung commit still returns the
// upstream's 2xx. Neither is cut short by the sender hanging up.
func TestStoreTimeoutBoundsEachOperation(t *testing.T) {
	const timeout = 100 * time.Millisecond
	for _, op := range []string{"claim", "commit"} {
		t.Run(op, func(t *testing.T) {
			up := newUpstream(t, nil)
			s := &ctxStore{hang: map[string]bool{op: true}}
			h := ctxStoreGateway(t, s, timeout, genericRoute("orders", "/hooks/orders", up.URL))
			start := time.Now()
			resp := h.send("/hooks/orders", `{"id":"evt_1"}`)
			took := time.Since(start)
			wantStatus := map[string]string{"claim": statusStoreError, "commit": statusForwarded}[op]
			if resp.Status != http.StatusOK || resp.Header.Get(HeaderDedupStatus) != wantStatus {
				t.Errorf("got %d %q, want 200 %q", resp.Status, resp.Header.Get(HeaderDedupStatus), wantStatus)
			}
			if took < timeout {
				t.Errorf("answered after %s, before the %s store timeout", took, timeout)
			}
			var hung []opSeen
			for _, o := range s.ops() {
				if o.op == op {
					hung = append(hung, o)
				}
			}
			if len(hung) != 1 || !errors.Is(hung[0].errAtEnd, context.DeadlineExceeded) {
				t.Errorf("got %s operations %+v, want one ended by DeadlineExceeded", op, hung)
			}
		})
	}

	t.Run("sender hangs up during the claim", func(t *testing.T) {
		up := newUpstream(t, nil)
		s := &ctxStore{hang: map[string]bool{"claim": true}, started: make(chan string, 1)}
		h := ctxStoreGateway(t, s, timeout, genericRoute("orders", "/hooks/orders", up.URL))
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := h.try(ctx, http.MethodPost, "/hooks/orders", `{"id":"evt_1"}`)
			errc <- err
		}()
		recv(t, s.started, "the claim to hang")
		cancel()
		recv(t, errc, "the sender's hang-up")
		waitFor(t, "the claim to end", func() bool { return len(s.ops()) > 0 })
		if o := s.ops()[0]; !errors.Is(o.errAtEnd, context.DeadlineExceeded) {
			t.Errorf("claim ended with %v, want DeadlineExceeded (not cancelled by the sender)", o.errAtEnd)
		}
	})
}
