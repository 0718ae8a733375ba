package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

// gateHook records every pipeline's command names (but a new connection's
// set-up) and holds the first pipeline until release is closed, so a test can
// queue commands behind it.
type gateHook struct {
	hold    atomic.Bool
	entered chan struct{}
	release chan struct{}

	mu        sync.Mutex
	pipelines []string // "get evalsha get", one per pipeline
}

func newGateHook(t *testing.T) *gateHook {
	h := &gateHook{entered: make(chan struct{}, 1), release: make(chan struct{})}
	h.hold.Store(true)
	t.Cleanup(h.open)
	return h
}

// open lets the held pipeline (and all later ones) through.
func (h *gateHook) open() {
	select {
	case <-h.release:
	default:
		close(h.release)
	}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		if names[0] == "client" || names[0] == "hello" {
			return next(ctx, cmds) // a new connection's set-up
		}
		h.mu.Lock()
		h.pipelines = append(h.pipelines, strings.Join(names, " "))
		h.mu.Unlock()
		if h.hold.CompareAndSwap(true, false) {
			h.entered <- struct{}{}
			<-h.release
		}
		return next(ctx, cmds)
	}
}

func (h *gateHook) taken() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.pipelines)
}

// queued returns how many commands wait for a worker.
func (p *pipeliner) queued() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.queue)
}

// isClosed reports whether close was called.
func (p *pipeliner) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// run is runWaited without the replicas' verdict.
func (p *pipeliner) run(ctx context.Context, script *redis.Script, key string, args ...any) *redis.Cmd {
	cmd, _ := p.runWaited(ctx, script, key, args...)
	return cmd
}

// waitFor polls cond every millisecond until it holds, failing t after 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: still not true after 5s", what)
		}
		<-tick.C
	}
}

// await receives from ch, failing t after 5s.
func await[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	select {
	case v := <-ch:
		return v
	case <-timer.C:
		t.Fatalf("waiting for %s: nothing after 5s", what)
		panic("unreachable")
	}
}

// heldPipeliner returns a pipeliner with one worker on a fresh server whose
// first pipeline (a GET sent here) the returned hook holds.
func heldPipeliner(t *testing.T, maxBatch int) (*pipeliner, *gateHook, *redis.Client, <-chan *redis.StringCmd) {
	t.Helper()
	srv := redistest.Start(t)
	admin := srv.Client()
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	hook := newGateHook(t)
	client.AddHook(hook)
	p := newPipeliner(client, 1, maxBatch, 0, 0)
	t.Cleanup(p.close)
	first := make(chan *redis.StringCmd, 1)
	go func() { first <- p.get(context.Background(), "held") }()
	await(t, "the first pipeline", hook.entered)
	return p, hook, admin, first
}

func TestPipelineCoalesces(t *testing.T) {
	const maxBatch = 8
	p, hook, admin, first := heldPipeliner(t, maxBatch)
	ctx := context.Background()
	if err := forgetScript.Load(ctx, admin).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	// 19 callers queue behind the held pipeline: even ones GET a key holding
	// their own number, odd ones run the forget script on a key that exists
	// for every third of them, so each reply shows whose it is.
	const n = 2*maxBatch + 3
	for i := range n {
		if i%2 == 0 || i%3 == 0 {
			if err := admin.Set(ctx, "k"+strconv.Itoa(i), "v"+strconv.Itoa(i), 0).Err(); err != nil {
				t.Fatalf("SET: %v", err)
			}
		}
	}
	errs := make(chan error, n)
	for i := range n {
		go func() {
			key := "k" + strconv.Itoa(i)
			if i%2 == 0 {
				v, err := p.get(ctx, key).Result()
				if err == nil && v != "v"+strconv.Itoa(i) {
					err = errors.New("GET " + key + ": got " + v)
				}
				errs <- err
				return
			}
			got, err := forgetCode(p.run(ctx, forgetScript, key, 0, "", "0"))
			want := int64(0)
			if i%3 == 0 {
				want = 1 // the key exists
			}
			if err == nil && got != want {
				err = errors.New("forget " + key + ": got " + strconv.FormatInt(got, 10))
			}
			errs <- err
		}()
	}
	waitFor(t, "19 queued commands", func() bool { return p.queued() == n })
	hook.open()
	if err := await(t, "the held GET", first).Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("held GET: got %v, want redis.Nil", err)
	}
	for range n {
		if err := await(t, "a reply", (<-chan error)(errs)); err != nil {
			t.Error(err)
		}
	}
	// One worker: the held pipeline, then the queue in batches of maxBatch.
	var sizes []int
	for _, pl := range hook.taken() {
		sizes = append(sizes, len(strings.Fields(pl)))
	}
	if want := []int{1, maxBatch, maxBatch, n - 2*maxBatch}; !slices.Equal(sizes, want) {
		t.Errorf("pipeline sizes: got %v, want %v", sizes, want)
	}
}

// forgetCode returns the code forget.lua answered (0 absent, 1 deleted, 2
// kept), the reply these tests use to tell one command's answer from
// another's.
func forgetCode(cmd *redis.Cmd) (int64, error) {
	reply, err := cmd.Slice()
	if err != nil {
		return 0, err
	}
	n, _ := reply[0].(int64)
	return n, nil
}

func TestPipelineNoScriptOnlyScripts(t *testing.T) {
	p, hook, admin, first := heldPipeliner(t, 128)
	ctx := context.Background()
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	type reply struct {
		i   int
		n   int64
		err error
	}
	replies := make(chan reply, 4)
	for i := range 4 {
		go func() {
			if i%2 == 0 {
				_, err := p.get(ctx, "absent").Result()
				if errors.Is(err, redis.Nil) {
					err = nil
				}
				replies <- reply{i: i, err: err}
				return
			}
			n, err := forgetCode(p.run(ctx, forgetScript, "absent", 0, "", "0"))
			replies <- reply{i: i, n: n, err: err}
		}()
	}
	waitFor(t, "4 queued commands", func() bool { return p.queued() == 4 })
	hook.open()
	await(t, "the held GET", first)
	for range 4 {
		r := await(t, "a reply", (<-chan reply)(replies))
		if r.err != nil || r.n != 0 {
			t.Errorf("command %d: got (%d, %v), want (0, nil)", r.i, r.n, r.err)
		}
	}
	// The EVALSHAs answered NOSCRIPT: only they are sent again, as EVAL.
	got := hook.taken()
	if len(got) != 3 || got[2] != "eval eval" || strings.Count(got[1], "evalsha") != 2 || strings.Count(got[1], "get") != 2 {
		t.Errorf("pipelines: got %q, want [get, 2 get + 2 evalsha, eval eval]", got)
	}
}

// TestPipelineScriptLeads checks that a batch holding a script sends it
// first: go-redis runs a pipeline whose first reply is nil (a claim's SET NX
// GET, a GET of a missing key) through its retry and bad-connection checks.
func TestPipelineScriptLeads(t *testing.T) {
	p, hook, _, first := heldPipeliner(t, 128)
	ctx := context.Background()
	got := make(chan error, 2)
	go func() {
		_, err := p.get(ctx, "absent").Result()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		got <- err
	}()
	waitFor(t, "the GET queued", func() bool { return p.queued() == 1 })
	go func() {
		_, err := forgetCode(p.run(ctx, forgetScript, "absent", 0, "", "0"))
		got <- err
	}()
	waitFor(t, "the script queued", func() bool { return p.queued() == 2 })
	hook.open()
	await(t, "the held GET", first)
	for range 2 {
		if err := await(t, "a reply", (<-chan error)(got)); err != nil {
			t.Error(err)
		}
	}
	pipelines := hook.taken()
	if len(pipelines) < 2 || !strings.HasPrefix(pipelines[1], "evalsha") {
		t.Errorf("pipelines: got %q, want the second to start with evalsha", pipelines)
	}
}

func TestPipelineCallerContext(t *testing.T) {
	p, hook, _, first := heldPipeliner(t, 128)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.run(ctx, forgetScript, "k", 0).Err() }()
	waitFor(t, "a queued command", func() bool { return p.queued() == 1 })
	cancel()
	// The caller returns while its command still waits behind the held
	// pipeline.
	if err := await(t, "the cancelled call", done); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: got %v, want context.Canceled", err)
	}
	hook.open()
	await(t, "the held GET", first)
	p.close()
	// A command whose caller gave up before its batch went out is not sent.
	if got := hook.taken(); len(got) != 1 {
		t.Errorf("pipelines: got %q, want only the held one", got)
	}
}

func TestPipelineCloseFinishesQueued(t *testing.T) {
	p, hook, _, first := heldPipeliner(t, 128)
	ctx := context.Background()
	queued := make(chan error, 1)
	go func() { queued <- p.run(ctx, forgetScript, "k", 0).Err() }()
	waitFor(t, "a queued command", func() bool { return p.queued() == 1 })
	closed := make(chan struct{})
	go func() {
		p.close()
		close(closed)
	}()
	waitFor(t, "close to start", p.isClosed)
	if err := p.get(ctx, "late").Err(); !errors.Is(err, dedup.ErrClosed) {
		t.Errorf("command after close: got %v, want dedup.ErrClosed", err)
	}
	select {
	case <-closed:
		t.Fatalf("close returned while a pipeline was held")
	default:
	}
	hook.open()
	if err := await(t, "the held GET", first).Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("held GET: got %v, want redis.Nil", err)
	}
	if err := await(t, "the queued command", queued); err != nil {
		t.Errorf("command queued before close: got %v, want nil", err)
	}
	await(t, "close", (<-chan struct{})(closed))
}

// ctxHook records a context value every pipeline runs with.
type ctxHook struct{ seen chan any }

type ctxKey struct{}

func (h ctxHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h ctxHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h ctxHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() != "client" && cmds[0].Name() != "hello" {
			h.seen <- ctx.Value(ctxKey{})
		}
		return next(ctx, cmds)
	}
}

// TestPipelineLoneCommand: a command sent while nothing else is queued goes
// out at once under its caller's context, values included, as a plain
// go-redis call would.
func TestPipelineLoneCommand(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	hook := ctxHook{seen: make(chan any, 10)}
	client.AddHook(hook)
	p := newPipeliner(client, defaultInFlight, defaultMaxBatch, 0, 0)
	t.Cleanup(p.close)
	ctx := context.WithValue(context.Background(), ctxKey{}, "trace-1")
	if err := p.get(ctx, "absent").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET: got %v, want redis.Nil", err)
	}
	if got := await(t, "the pipeline", (<-chan any)(hook.seen)); got != "trace-1" {
		t.Errorf("context value in the hook: got %v, want trace-1", got)
	}
}

// recordingPipeliner returns a pipeliner with inFlight workers on a fresh
// server, whose pipelines the returned hook records without holding any,
// and a client to set keys with.
func recordingPipeliner(t *testing.T, inFlight int) (*pipeliner, *gateHook, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	hook := newGateHook(t)
	hook.hold.Store(false)
	client.AddHook(hook)
	p := newPipeliner(client, inFlight, defaultMaxBatch, 0, 0)
	t.Cleanup(p.close)
	return p, hook, srv.Client()
}

// TestPipelineLeaderGathers: a caller that finds the pipeliner idle sends
// its command together with every command queued while it yielded, in one
// pipeline, and each caller gets its own reply.
func TestPipelineLeaderGathers(t *testing.T) {
	p, hook, admin := recordingPipeliner(t, 1)
	ctx := context.Background()
	const others = 5
	for i := range others + 1 {
		if err := admin.Set(ctx, "k"+strconv.Itoa(i), "v"+strconv.Itoa(i), 0).Err(); err != nil {
			t.Fatalf("SET: %v", err)
		}
	}
	errs := make(chan error, others)
	p.yield = func() {
		// While the leader yields, other callers arrive.
		for i := 1; i <= others; i++ {
			go func() {
				key := "k" + strconv.Itoa(i)
				v, err := p.get(ctx, key).Result()
				if err == nil && v != "v"+strconv.Itoa(i) {
					err = errors.New("GET " + key + ": got " + v)
				}
				errs <- err
			}()
		}
		waitFor(t, "the other callers' commands queued", func() bool { return p.queued() == others+1 })
	}
	if v, err := p.get(ctx, "k0").Result(); err != nil || v != "v0" {
		t.Fatalf("the leader's GET: got %q, %v, want v0", v, err)
	}
	for range others {
		if err := await(t, "a reply", (<-chan error)(errs)); err != nil {
			t.Error(err)
		}
	}
	if got, want := hook.taken(), []string{strings.Repeat("get ", others) + "get"}; !slices.Equal(got, want) {
		t.Errorf("pipelines: got %q, want %q", got, want)
	}
}

// TestPipelineLeaderCommandTakenByWorker: when a worker, with a slot of its
// own, takes the leader's command while the leader yields, the leader sends
// no pipeline of its own and still returns the reply the worker got.
func TestPipelineLeaderCommandTakenByWorker(t *testing.T) {
	p, hook, admin := recordingPipeliner(t, 2)
	ctx := context.Background()
	if err := admin.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	p.yield = func() {
		p.cond.Signal() // a worker wakes, finds the command and a free slot
		waitFor(t, "a worker to take the leader's command", func() bool { return p.queued() == 0 })
	}
	if v, err := p.get(ctx, "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET: got %q, %v, want v", v, err)
	}
	if got, want := hook.taken(), []string{"get"}; !slices.Equal(got, want) {
		t.Errorf("pipelines: got %q, want %q", got, want)
	}
}

// panicHook panics in every pipeline that carries a command other than the
// connection's handshake.
type panicHook struct{}

func (panicHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (panicHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (panicHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if cmds[0].Name() != "client" && cmds[0].Name() != "hello" {
			panic("injected")
		}
		return next(ctx, cmds)
	}
}

// TestPipelinePanicFailsCommands: a panic while sending (in go-redis or a
// hook) fails the batch's commands with an error instead of crashing the
// process, and the pipeliner keeps serving.
func TestPipelinePanicFailsCommands(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	client.AddHook(panicHook{})
	p := newPipeliner(client, defaultInFlight, defaultMaxBatch, 0, 0)
	t.Cleanup(p.close)
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() { errs <- p.get(context.Background(), "k").Err() }()
	}
	for range n {
		if err := <-errs; err == nil || !strings.Contains(err.Error(), "pipeline panicked") {
			t.Errorf("command in a panicking pipeline: got %v, want a pipeline-panicked error", err)
		}
	}
}

// keyGate holds each pipeline whose first command's key has a gate until the
// gate is closed, and reports every pipeline's first key on entered.
type keyGate struct {
	gates   map[string]chan struct{}
	entered chan string
}

func (h *keyGate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *keyGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *keyGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if n := cmds[0].Name(); n == "client" || n == "hello" {
			return next(ctx, cmds) // a new connection's set-up
		}
		key, _ := cmds[0].Args()[1].(string)
		h.entered <- key
		if g := h.gates[key]; g != nil {
			<-g
		}
		return next(ctx, cmds)
	}
}

// TestPipelineCloseWakesWaitingWorker: a worker of a closed pipeliner that
// waits for a slot (both taken: one by a caller's own pipeline, one by the
// other worker) must wake when the queue was sent by the other worker and
// the caller's slot freed, else close never returns. (Found by review: the
// last worker exited and the caller freed its slot without waking it.)
func TestPipelineCloseWakesWaitingWorker(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	h := &keyGate{
		gates:   map[string]chan struct{}{"d1": make(chan struct{}), "d2": make(chan struct{}), "w": make(chan struct{})},
		entered: make(chan string, 16),
	}
	t.Cleanup(func() {
		for _, g := range h.gates {
			select {
			case <-g:
			default:
				close(g)
			}
		}
	})
	client.AddHook(h)
	p := newPipeliner(client, 2, 128, 0, 0)
	waiting := make(chan struct{}, 1)
	p.mu.Lock()
	p.onClosedWait = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	p.mu.Unlock()
	ctx := context.Background()
	get := func(key string) { go func() { _ = p.get(ctx, key) }() }

	get("d1") // nothing queued, a slot free: its caller sends it (slot 1)
	if k := await(t, "d1 on the wire", h.entered); k != "d1" {
		t.Fatalf("got pipeline %q, want d1", k)
	}
	get("d2") // the same (slot 2)
	if k := await(t, "d2 on the wire", h.entered); k != "d2" {
		t.Fatalf("got pipeline %q, want d2", k)
	}
	get("w") // no slot: queued
	waitFor(t, "w queued", func() bool { return p.queued() == 1 })
	close(h.gates["d1"]) // slot 1 frees: a worker (A) takes w and holds it
	if k := await(t, "w on the wire", h.entered); k != "w" {
		t.Fatalf("got pipeline %q, want w", k)
	}
	get("q") // no slot: queued
	waitFor(t, "q queued", func() bool { return p.queued() == 1 })

	closed := make(chan struct{})
	go func() { p.close(); close(closed) }()
	await(t, "the other worker (B) waiting for a slot after close", waiting)
	close(h.gates["w"]) // A finishes, sends q itself, and exits
	if k := await(t, "q on the wire", h.entered); k != "q" {
		t.Fatalf("got pipeline %q, want q", k)
	}
	waitFor(t, "q sent", func() bool { return p.queued() == 0 })
	close(h.gates["d2"]) // slot 2 frees with nothing queued
	await(t, "close to return", closed)
}

// TestStampPipelineErr: Exec's error becomes every reply only when no
// command got one (a failed AUTH); a per-command reply such as redis.Nil
// from SET NX GET never overwrites another command's real reply.
func TestStampPipelineErr(t *testing.T) {
	ctx := context.Background()
	errAuth := errors.New("WRONGPASS invalid username-password pair")
	plain := func(val string, err error) *op {
		o := &op{str: redis.NewStringCmd(ctx, "get", "k")}
		o.str.SetVal(val)
		o.str.SetErr(err)
		return o
	}
	script := func(val any) *op {
		o := &op{script: redis.NewScript("return 1"), cmd: redis.NewCmd(ctx, "evalsha")}
		o.cmd.SetVal(val)
		return o
	}
	tests := []struct {
		name     string
		ops      []*op
		execErr  error
		wantErrs []error
	}{
		{"no replies at all: stamped", []*op{plain("", nil), script(nil)}, errAuth, []error{errAuth, errAuth}},
		{"redis.Nil beside an empty reply", []*op{plain("", redis.Nil), plain("", nil)}, redis.Nil, []error{redis.Nil, nil}},
		{"a value beside an unanswered op", []*op{script(int64(1)), plain("", nil)}, errAuth, []error{nil, nil}},
		{"no error", []*op{plain("", nil)}, nil, []error{nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stampPipelineErr(tt.ops, tt.execErr)
			for i, o := range tt.ops {
				var got error
				if o.script != nil {
					got = o.cmd.Err()
				} else {
					got = o.str.Err()
				}
				if !errors.Is(got, tt.wantErrs[i]) || (got == nil) != (tt.wantErrs[i] == nil) {
					t.Errorf("op %d: got error %v, want %v", i, got, tt.wantErrs[i])
				}
			}
		})
	}
}

// TestStaleTopology: what makes a Cluster client reload its slot map after
// a pipeline: a node it could not reach, or CLUSTERDOWN; not Redis's own
// answers, a caller's context ending or a closed store.
func TestStaleTopology(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"no error", nil, false},
		{"key absent", redis.Nil, false},
		{"dial refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"read timeout (a hung master)", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, true},
		{"connection cut", io.EOF, true},
		{"CLUSTERDOWN", errorReply("CLUSTERDOWN The cluster is down"), true},
		{"Redis's own answer", errorReply("ERR dedupgw: undecodable record"), false},
		{"caller's context", context.Canceled, false},
		{"caller's deadline", context.DeadlineExceeded, false},
		{"store closed", dedup.ErrClosed, false},
		{"client closed", redis.ErrClosed, false},
	}
	for _, tt := range tests {
		if got := staleTopology(tt.err); got != tt.want {
			t.Errorf("%s: staleTopology(%v): got %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// waitQuietly polls cond every millisecond until it holds or 5s passed, for
// a yield hook, which runs on a caller's goroutine and so must not call
// t.Fatal: the test fails later, on what it then finds.
func waitQuietly(cond func() bool) {
	deadline := time.Now().Add(5 * time.Second)
	for !cond() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// setFree adds d to p's free pipeline slots.
func setFree(p *pipeliner, d int) {
	p.mu.Lock()
	p.free += d
	p.mu.Unlock()
}

// TestPipelineLeaderLeavesRestToWorker: when more commands gather behind a
// leader than one batch holds (maxBatch) and another slot is free, a worker
// sends the rest at once, not after the leader's pipeline returned.
func TestPipelineLeaderLeavesRestToWorker(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	gate := make(chan struct{})
	var openOnce sync.Once
	open := func() { openOnce.Do(func() { close(gate) }) }
	h := &keyGate{gates: map[string]chan struct{}{"lead": gate}, entered: make(chan string, 16)}
	client.AddHook(h)
	p := newPipeliner(client, 2, 1, 0, 0)
	t.Cleanup(p.close)
	t.Cleanup(open) // before close, which waits for the held pipeline
	ctx := context.Background()
	rest := make(chan error, 1)
	p.yield = func() {
		go func() { rest <- p.get(ctx, "rest").Err() }()
		waitQuietly(func() bool { return p.queued() == 2 })
		setFree(p, +1) // free again, and no worker woken
	}
	// Keep the other slot taken until rest is queued, so that a worker that
	// has not parked yet cannot take the leader's command.
	setFree(p, -1)
	lead := make(chan error, 1)
	go func() { lead <- p.get(ctx, "lead").Err() }()
	// The leader's pipeline is held and the other slot is free: rest goes
	// out meanwhile, in a pipeline of its own.
	got := []string{await(t, "a pipeline", h.entered), await(t, "a second pipeline while the leader's is held", h.entered)}
	if slices.Sort(got); !slices.Equal(got, []string{"lead", "rest"}) {
		t.Fatalf("pipelines' first keys: got %q, want lead and rest", got)
	}
	if err := await(t, "the rest's reply", rest); !errors.Is(err, redis.Nil) {
		t.Errorf("rest: got %v, want redis.Nil", err)
	}
	open()
	if err := await(t, "the leader's reply", lead); !errors.Is(err, redis.Nil) {
		t.Errorf("leader: got %v, want redis.Nil", err)
	}
}

// TestPipelineLeaderContextInWorkersPipeline: a leader whose command a
// worker took while it yielded waits for the reply as a queued caller does:
// when its context ends first, the call returns the context's error.
func TestPipelineLeaderContextInWorkersPipeline(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	hook := newGateHook(t) // holds the first pipeline
	client.AddHook(hook)
	p := newPipeliner(client, 2, defaultMaxBatch, 0, 0)
	t.Cleanup(p.close)
	t.Cleanup(hook.open) // before close, which waits for the held pipeline
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	other := make(chan error, 1)
	p.yield = func() {
		go func() { other <- p.get(context.Background(), "other").Err() }()
		waitQuietly(func() bool { return p.queued() == 2 })
		setFree(p, +1)
		p.cond.Signal() // a worker wakes and takes both (a batch of two: no caller's context)
		waitQuietly(func() bool { return p.queued() == 0 })
		select {
		case <-hook.entered: // the worker's pipeline is on the wire, held
		case <-time.After(5 * time.Second):
		}
		cancel()
	}
	setFree(p, -1) // until other is queued: no worker takes the leader's command alone
	lead := make(chan error, 1)
	go func() { lead <- p.get(ctx, "lead").Err() }()
	if err := await(t, "the leader's call after its context ended", lead); !errors.Is(err, context.Canceled) {
		t.Errorf("leader: got %v, want context.Canceled", err)
	}
	hook.open()
	if err := await(t, "the other reply", other); !errors.Is(err, redis.Nil) {
		t.Errorf("other: got %v, want redis.Nil", err)
	}
	if got, want := hook.taken(), []string{"get get"}; !slices.Equal(got, want) {
		t.Errorf("pipelines: got %q, want %q", got, want)
	}
}

// TestPipelineCloseWaitsForLeader: close returns only after a pipeline a
// caller sends itself finished, though no worker has anything to do.
func TestPipelineCloseWaitsForLeader(t *testing.T) {
	p, hook, _, lead := heldPipeliner(t, defaultMaxBatch) // the held GET's caller leads
	closed := make(chan struct{})
	go func() { p.close(); close(closed) }()
	waitFor(t, "close to start", p.isClosed)
	awaitWorkers(t, p, 0) // nothing queued: the worker exits
	select {
	case <-closed:
		t.Fatalf("close returned while the leader's pipeline was on the wire")
	default:
	}
	hook.open()
	if err := await(t, "the leader's reply", lead).Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("leader: got %v, want redis.Nil", err)
	}
	await(t, "close", (<-chan struct{})(closed))
}
