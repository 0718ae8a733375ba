package redisstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
)

// Auto-pipelining.
//
// Every Store operation but Forget (the Commit and Release scripts, Claim's SET
// NX GET and, for a takeover, its script, and Get's GET) is one command per
// round trip, and go-redis spends more CPU per round trip than Redis spends
// running a script. So the Store does not send each command on its own:
// concurrent operations are coalesced into go-redis pipelines, as rueidis
// does, and each caller gets its own reply. The contract:
//
//   - The Store owns inFlight worker goroutines, the dispatchers, started by
//     New and NewFromClient and stopped by Close (on a Cluster, inFlight
//     more per master, started with its first command and stopped when
//     the master is gone, see nodePipes).
//   - At most inFlight pipelines are on the wire at once. On a Cluster the
//     Store runs one pipeliner per master (see nodePipes), so this holds
//     per master, and a batch holds one master's keys. A caller whose
//     command finds another queued, or every pipeline slot taken, queues it
//     and waits. A worker, once a slot is free, takes the first queued
//     command plus every command queued meanwhile, at most maxBatch, and
//     sends them as one pipeline: one write and one read per Redis node.
//     There is no timer: the next batch goes out as soon as a slot frees.
//   - A caller that finds nothing queued and a slot free leads the batch
//     itself, on its own goroutine: handing a lone command to a worker and
//     its reply back would add two goroutine switches (some 20µs on the 2
//     shared cores) to an idle Store's latency. It queues its command and
//     yields the processor once (runtime.Gosched), so that on a busy
//     gateway the requests ready to run queue their commands behind it,
//     then sends what was gathered, at most maxBatch (waking a worker for
//     the rest when a slot is free). On an idle Store the yield returns at
//     once and the command goes alone. A worker woken meanwhile (another
//     pipeline returned) may take the leader's command with the rest: the
//     leader then waits for it as a queued caller does. Gathering this way
//     cut the CPU per unique delivery, gateway and redis-server together,
//     by a few percent in the loopback benchmark (go run ./bench
//     -dedupgw-alt), where a lone command otherwise often went out as a
//     pipeline of one.
//   - Commands of different callers are not ordered with respect to each
//     other; one caller's operations stay in order, since each call waits for
//     its reply. A command waits for the whole pipeline it travels in: on a
//     Cluster, for the slowest node the pipeline touches.
//   - Scripts go as EVALSHA. Those answered NOSCRIPT (a restarted or
//     flushed Redis) are sent again as EVAL, which also caches the script, in
//     one more pipeline: Script.Run's fallback, per command. Plain commands
//     (GET, SET) travel in the same pipelines and are sent once.
//   - Each caller honours its own context: if it ends while the command
//     waits for a worker's pipeline, the call returns the context's error.
//     A leader sending other callers' commands with its own waits for that
//     pipeline, which runs under the batch's deadline (below).
//     The command may still be applied, exactly like a call whose reply was
//     lost; every script sent here is safe to send again. A command whose context ended
//     before its batch was sent is dropped. A pipeline of one command runs
//     under its caller's context, as a plain go-redis call does; a larger one
//     under the latest deadline of its commands' contexts (none if one has
//     none), without their values (go-redis hooks do not see them), besides
//     the client's read and write timeouts.
//   - go-redis retries a pipeline that failed on a network error (MaxRetries)
//     by sending it again whole; the scripts make that safe too. (Not while
//     waiting for replicas: see Config.WaitTimeout.) On a
//     Cluster, go-redis splits a pipeline per node and follows MOVED and ASK
//     per command; behind Sentinel it follows the current master.
//   - With replicas to wait for (Config.WaitReplicas), a pipeline holding a
//     write (anything but GET) ends with WAIT, on the same connection: it
//     waits until the replicas acknowledged every write before it, and one
//     WAIT serves the whole batch. Each write's caller learns whether enough
//     replicas acknowledged it (see runWaited).
//   - Hooks see one ProcessPipelineHook call per batch, no ProcessHook.
//   - close refuses new commands (dedup.ErrClosed), lets the workers send
//     every command already queued and waits until all pipelines, the
//     callers' own included, finished and the workers exited.
type pipeliner struct {
	client   redis.UniversalClient
	maxBatch int
	// waitReplicas, when positive, ends each pipeline holding a write with
	// WAIT waitReplicas waitTimeoutMS.
	waitReplicas, waitTimeoutMS int64

	mu     sync.Mutex
	cond   sync.Cond // workers wait for queued commands and a free slot, or closed
	queue  []*op
	free   int // pipelines that may start now: inFlight less those on the wire
	closed bool

	workers sync.WaitGroup // the worker goroutines
	direct  sync.WaitGroup // pipelines callers send themselves

	// yield is runtime.Gosched: a leading caller calls it once to let
	// other callers queue behind its command (tests replace it).
	yield func()

	// onClosedWait, when set (by tests), is called with mu held when a
	// worker of a closed pipeliner waits for a slot to send the rest.
	onClosedWait func()
}

// Pipelining defaults: at most defaultInFlight pipelines on the wire, each of
// at most defaultMaxBatch commands. Measured with 32 senders on 2 cores, one
// and two pipelines in flight cost the same CPU per operation within noise
// (batches of about 9 and 4 commands in the loopback benchmark); four and
// eight make smaller batches that cost more CPU per operation and gain no
// throughput. Two let one batch be written while another's replies are read.
const (
	defaultInFlight = 2
	defaultMaxBatch = 128
)

// op is one queued command and, once done is signalled, its reply.
type op struct {
	ctx    context.Context
	script *redis.Script // nil: a plain command, all of it in args
	key    [1]string     // the script's key
	args   []any         // the script's ARGV, or the plain command

	cmd *redis.Cmd       // the script's reply
	str *redis.StringCmd // the plain command's reply
	// waitErr is non-nil when the pipeline's WAIT found too few replicas
	// acknowledged this write (it wraps dedup.ErrNotReplicated).
	waitErr error
	done    chan struct{} // one value when cmd or str is final
}

// writes reports whether o may write: every script, and every plain command
// but GET.
func (o *op) writes() bool {
	return o.script != nil || len(o.args) == 0 || o.args[0] != "get"
}

// opPool recycles ops whose callers received their replies. An op whose
// caller gave up is left to the garbage collector: a worker may still hold it.
var opPool = sync.Pool{New: func() any { return &op{done: make(chan struct{}, 1)} }}

// newOp returns an op from the pool.
func newOp(ctx context.Context, script *redis.Script, key string, args []any) *op {
	o := opPool.Get().(*op)
	o.ctx, o.script, o.key[0], o.args = ctx, script, key, args
	return o
}

// recycle returns o to the pool; its done channel is empty again.
func (o *op) recycle() {
	*o = op{done: o.done}
	opPool.Put(o)
}

// fail makes err o's reply and signals o.
func (o *op) fail(err error) {
	if o.script == nil {
		o.str = redis.NewStringCmd(o.ctx)
		o.str.SetErr(err)
	} else {
		o.cmd = redis.NewCmd(o.ctx)
		o.cmd.SetErr(err)
	}
	o.done <- struct{}{}
}

// newPipeliner starts inFlight workers sending commands on client in
// pipelines of at most maxBatch commands, each holding a write followed by
// WAIT waitReplicas when that is positive.
func newPipeliner(client redis.UniversalClient, inFlight, maxBatch, waitReplicas int, waitTimeout time.Duration) *pipeliner {
	p := &pipeliner{client: client, maxBatch: max(maxBatch, 1), free: max(inFlight, 1), yield: runtime.Gosched,
		waitReplicas: int64(waitReplicas), waitTimeoutMS: waitTimeout.Milliseconds()}
	p.cond.L = &p.mu
	for range max(inFlight, 1) {
		p.workers.Go(p.work)
	}
	return p
}

// runWaited runs script on key with args, like script.Run(ctx, client,
// []string{key}, args...), in the next pipeline. The reply's error is ctx's
// when ctx ended first and dedup.ErrClosed after close. It also returns,
// when the pipeliner waits for replicas, an error wrapping
// dedup.ErrNotReplicated if too few acknowledged the pipeline the script
// travelled in (nil otherwise).
func (p *pipeliner) runWaited(ctx context.Context, script *redis.Script, key string, args ...any) (*redis.Cmd, error) {
	o := newOp(ctx, script, key, args)
	if err := p.do(o); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd, nil
	}
	cmd, waitErr := o.cmd, o.waitErr
	o.recycle()
	return cmd, waitErr
}

// get runs GET key in the next pipeline; errors as for runWaited.
func (p *pipeliner) get(ctx context.Context, key string) *redis.StringCmd {
	return p.command(ctx, "get", key)
}

// command runs the plain command args (name, key, arguments; one key, for
// Cluster routing), whose reply is a string or nil, in the next pipeline;
// errors as for runWaited. args must not be changed until it returns.
func (p *pipeliner) command(ctx context.Context, args ...any) *redis.StringCmd {
	cmd, _ := p.commandWaited(ctx, args...)
	return cmd
}

// commandWaited is command, also returning the replicas' verdict as
// runWaited does.
func (p *pipeliner) commandWaited(ctx context.Context, args ...any) (*redis.StringCmd, error) {
	o := newOp(ctx, nil, "", args)
	if err := p.do(o); err != nil {
		cmd := redis.NewStringCmd(ctx)
		cmd.SetErr(err)
		return cmd, nil
	}
	cmd, waitErr := o.str, o.waitErr
	o.recycle()
	return cmd, waitErr
}

// do queues o and, when nothing else was queued and a slot is free, leads
// the next batch itself (see the contract above); else it waits for o's
// reply or the end of its context.
func (p *pipeliner) do(o *op) error {
	if err := o.ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return dedup.ErrClosed
	}
	if len(p.queue) == 0 && p.free > 0 {
		// Nothing queued and a slot free: this caller leads the next batch
		// itself rather than hand o to a worker and take the reply back.
		// It queues o, yields once so that goroutines ready to run (other
		// requests, on a busy gateway) can queue their commands behind it,
		// then sends what was gathered. On an idle Store nothing else is
		// ready, the yield returns at once and o goes alone. o may have
		// been taken by a worker meanwhile (with another slot free): then
		// the worker signals it, this batch carries the rest, if any, and
		// the caller waits for o as a queued caller does.
		p.free--
		p.direct.Add(1)
		p.queue = append(p.queue, o)
		p.mu.Unlock()
		p.yield()
		var buf [16]*op
		p.mu.Lock()
		batch := p.take(buf[:0])
		// o is still queued, then first, unless a worker took it.
		mine := len(batch) > 0 && batch[0] == o
		more := len(p.queue) > 0 && p.free > 0
		p.mu.Unlock()
		if more {
			p.cond.Signal() // more gathered than one batch holds: a worker may take the rest
		}
		p.send(batch)
		p.mu.Lock()
		p.free++
		wake, closed := len(p.queue) > 0, p.closed
		p.mu.Unlock()
		p.direct.Done()
		switch {
		case closed:
			// A worker of a closed pipeliner may wait for this slot to
			// send the rest, or (the rest sent meanwhile) to exit.
			p.cond.Broadcast()
		case wake:
			p.cond.Signal()
		}
		if mine {
			<-o.done // send signalled it
			return nil
		}
		return o.wait()
	}
	p.queue = append(p.queue, o)
	// A worker that is awake takes the whole queue: wake one only when the
	// queue was empty, so the rest gather into its batch.
	first := len(p.queue) == 1
	p.mu.Unlock()
	if first {
		p.cond.Signal()
	}
	return o.wait()
}

// wait waits for o's reply, which a worker sends, or the end of its
// context; nil means the reply arrived.
func (o *op) wait() error {
	select {
	case <-o.done:
		return nil
	case <-o.ctx.Done():
		select {
		case <-o.done: // the reply arrived as well: use it
			return nil
		default:
			return o.ctx.Err()
		}
	}
}

// close refuses new commands and returns once every queued command was sent
// and every worker exited.
func (p *pipeliner) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cond.Broadcast()
	p.workers.Wait()
	p.direct.Wait()
}

// work is one worker: it sends batches until the pipeliner is closed and the
// queue is empty.
func (p *pipeliner) work() {
	var batch []*op
	p.mu.Lock()
	for {
		for (len(p.queue) == 0 || p.free == 0) && !p.closed {
			p.cond.Wait()
		}
		if len(p.queue) == 0 && p.closed { // closed and drained
			p.mu.Unlock()
			// Another worker may be waiting for a slot to send what this
			// one sent: it must see the queue drained and exit too.
			p.cond.Broadcast()
			return
		}
		if p.free == 0 { // closed, but every slot busy: wait for one
			if p.onClosedWait != nil {
				p.onClosedWait()
			}
			p.cond.Wait()
			continue
		}
		p.free--
		batch = p.take(batch[:0])
		wake := len(p.queue) > 0 && p.free > 0
		p.mu.Unlock()
		if wake {
			p.cond.Signal() // more than one batch queued: another worker may take it
		}
		p.send(batch)
		clear(batch)
		p.mu.Lock()
		p.free++
	}
}

// take moves the first maxBatch queued commands (all, when fewer) to the end
// of batch and returns it. p.mu must be held.
func (p *pipeliner) take(batch []*op) []*op {
	n := min(len(p.queue), p.maxBatch)
	batch = append(batch, p.queue[:n]...)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	return batch
}

// send sends batch as one pipeline (plus one of EVALs for NOSCRIPT answers)
// and signals every op. It reuses batch's array.
func (p *pipeliner) send(batch []*op) {
	live := batch[:0]
	for _, o := range batch {
		if err := o.ctx.Err(); err != nil {
			o.fail(err) // its caller returns (or returned) err anyway
			continue
		}
		live = append(live, o)
	}
	if len(live) == 0 {
		return
	}
	// go-redis runs its retry and bad-connection checks on the pipeline's
	// first reply: a nil one (SET NX GET claiming an absent key, GET of a
	// missing key) is redis.Nil to them, some twenty errors.Is and
	// errors.As per batch. A script's reply is
	// never nil, so one goes first when the batch holds one (callers'
	// commands are not ordered with respect to each other).
	if live[0].script == nil {
		for i, o := range live {
			if o.script != nil {
				live[0], live[i] = o, live[0]
				break
			}
		}
	}
	// A panic below (in go-redis or a hook) fails this batch's commands
	// instead of the process: a worker has no net/http recover above it.
	signalled := false
	defer func() {
		if r := recover(); r != nil && !signalled {
			err := fmt.Errorf("redisstore: pipeline panicked: %v", r)
			for _, o := range live {
				o.fail(err)
			}
		}
	}()
	ctx := live[0].ctx // a lone command runs under its caller's context
	if len(live) > 1 {
		var cancel context.CancelFunc
		ctx, cancel = batchContext(live)
		defer cancel()
	}

	pipe := p.client.Pipeline()
	for _, o := range live {
		if o.script == nil {
			o.str = redis.NewStringCmd(ctx, o.args...)
			_ = pipe.Process(ctx, o.str) // queues it; Exec sends it
		} else {
			o.cmd = o.script.EvalSha(ctx, pipe, o.key[:], o.args...)
		}
	}
	wait := p.appendWait(ctx, pipe, live)
	_, err := pipe.Exec(ctx)
	stampPipelineErr(live, err)
	p.noteWait(live, wait)

	var again []*op
	for _, o := range live {
		if o.cmd != nil && isNoScript(o.cmd.Err()) {
			again = append(again, o)
		}
	}
	if len(again) > 0 {
		pipe = p.client.Pipeline()
		for _, o := range again {
			o.waitErr = nil // the EVALSHA wrote nothing: the EVAL's WAIT decides
			o.cmd = o.script.Eval(ctx, pipe, o.key[:], o.args...)
		}
		wait := p.appendWait(ctx, pipe, again) // maybe another connection
		_, err = pipe.Exec(ctx)
		stampPipelineErr(again, err)
		p.noteWait(again, wait)
	}
	p.reloadIfStale(live)
	signalled = true
	for _, o := range live {
		o.done <- struct{}{}
	}
}

// reloadIfStale asks a Cluster client to reload its slot map when one of
// ops failed as a failover makes commands fail: a master that could not be
// reached (refused, timed out, cut off) or a Cluster that answered
// CLUSTERDOWN. go-redis reloads the map by itself only on MOVED and ASK, and
// every 60s (ClusterStateReloadInterval): a dead master answers no MOVED, so
// after its replica was promoted the store would go on sending that
// master's keys to its address, failing them, for up to a minute. The
// reload runs in the background, one at a time and at most once per 200ms
// (go-redis's LazyReload), so an outage costs a few CLUSTER SLOTS a second.
func (p *pipeliner) reloadIfStale(ops []*op) {
	cc, ok := p.client.(*redis.ClusterClient)
	if !ok {
		return
	}
	for _, o := range ops {
		if staleTopology(o.err()) {
			cc.ReloadState(context.Background())
			return
		}
	}
}

// err returns o's reply error (nil before a reply).
func (o *op) err() error {
	switch {
	case o.cmd != nil:
		return o.cmd.Err()
	case o.str != nil:
		return o.str.Err()
	}
	return nil
}

// staleTopology reports whether err may mean the Cluster's masters changed:
// CLUSTERDOWN, or a failure to reach a node (not Redis's own answer, nor
// the caller's context ending, nor a closed client).
func staleTopology(err error) bool {
	switch {
	case err == nil:
		return false
	case redis.IsClusterDownError(err):
		return true
	}
	return !notTransport(err) // redis.Nil is a reply too
}

// appendWait queues WAIT at the end of pipe when p waits for replicas and
// ops hold a write; it returns WAIT's reply, or nil.
func (p *pipeliner) appendWait(ctx context.Context, pipe redis.Pipeliner, ops []*op) *redis.IntCmd {
	if p.waitReplicas <= 0 || !slices.ContainsFunc(ops, (*op).writes) {
		return nil
	}
	return p.queueWait(ctx, pipe)
}

// queueWait queues WAIT waitReplicas waitTimeoutMS at the end of pipe and
// returns its reply (see verdict).
func (p *pipeliner) queueWait(ctx context.Context, pipe redis.Pipeliner) *redis.IntCmd {
	cmd := redis.NewIntCmd(ctx, "wait", p.waitReplicas, p.waitTimeoutMS)
	_ = pipe.Process(ctx, cmd)
	return cmd
}

// noteWait gives each write in ops the verdict of its pipeline's WAIT (nil
// when there was none): an error when WAIT failed or counted too few
// replicas.
func (p *pipeliner) noteWait(ops []*op, wait *redis.IntCmd) {
	if wait == nil {
		return
	}
	err := p.verdict(wait.Result())
	for _, o := range ops {
		if o.writes() {
			o.waitErr = err
		}
	}
}

// verdict turns WAIT's reply into nil when at least waitReplicas replicas
// acknowledged, else an error wrapping dedup.ErrNotReplicated.
func (p *pipeliner) verdict(acked int64, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("WAIT failed (%w): %w", err, dedup.ErrNotReplicated)
	case acked < p.waitReplicas:
		return fmt.Errorf("%w: %d of %d acknowledged within %dms", dedup.ErrNotReplicated, acked, p.waitReplicas, p.waitTimeoutMS)
	}
	return nil
}

// stampPipelineErr makes err, the error Exec returned for ops' pipeline,
// every op's reply when none of them got one. Exec's error is normally the
// first command's own reply (redis.Nil from SET NX GET, say), and then the
// others carry theirs. But when the connection could not be set up with a
// Redis error (WRONGPASS or NOAUTH from AUTH, a failed HELLO), go-redis takes
// it for a per-command reply and stamps it on no command: they would read as
// empty replies ("unexpected type=<nil>").
func stampPipelineErr(ops []*op, err error) {
	if err == nil {
		return
	}
	for _, o := range ops {
		if o.script != nil && (o.cmd.Err() != nil || o.cmd.Val() != nil) ||
			o.script == nil && (o.str.Err() != nil || o.str.Val() != "") {
			return // replies came back: each op carries its own
		}
	}
	for _, o := range ops {
		if o.script != nil {
			o.cmd.SetErr(err)
		} else {
			o.str.SetErr(err)
		}
	}
}

// batchContext returns the context a pipeline of ops runs under: the latest
// of their deadlines, or none when one of them has none. Cancellation does
// not carry over: the other callers still want their replies.
func batchContext(ops []*op) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, o := range ops {
		d, ok := o.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// isNoScript reports whether err means Redis does not have the script
// cached, as Script.Run tests it.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
