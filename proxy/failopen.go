package proxy

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

// Fail-open forwards recorded later.
//
// A delivery forwarded without a claim because the store failed it
// (on_store_error: forward) leaves the store as it was: a key that failed
// before the outage stays failed although the application has since
// processed a retry of it, so listing failed keys to replay them after the
// incident names events already processed, and a key with no record
// forwards its next copy again. So once the upstream answered, the
// forward joins a queue that one goroutine of the Gateway works through
// as soon as the store answers: it claims each key and commits it for a
// 2xx (its window starts then) or releases it with the upstream's status
// or error otherwise. A key the store has processed, or bound to another
// fingerprint, is left as it is; a key in flight (a copy being forwarded,
// or the gateway's own claim that timed out during the outage and that
// Redis ran late) is tried again once its claim is settled or lapsed.
//
// While the store fails, the worker tries one record at a time, in turn,
// failedRecordFirst after a failure, then twice as long each time, at most
// failedRecordMax apart: an outage adds one store error per try, not one
// per forward. After a failed try it pings the store: when the store
// answers the ping, the failure is the key's own (a corrupt record, a
// value Redis holds under another type; a Redis refusing every write fails
// its ping, see redisstore's write probe), and a record whose key fails
// maxKeyFailures times so is given up, so one bad key neither holds the
// queue nor keeps store errors rising for a whole window. The queue holds
// at most maxFailOpenRecords, and at most maxFailOpenBytes of keys and
// stored answers (a replay route's answer beyond that is not kept: its
// next copies get the plain acknowledgement). A forward beyond that, one
// whose route's window ends first, or one still queued when the gateway
// closes is logged and not recorded.
const (
	failedRecordFirst  = 250 * time.Millisecond
	failedRecordMax    = 5 * time.Second
	inFlightRecordWait = time.Second
	maxKeyFailures     = 3
	maxFailOpenRecords = 65536
	maxFailOpenBytes   = 32 << 20
	// maxUnrecordedKeys bounds the keys one "not recorded" line names.
	maxUnrecordedKeys = 100
)

// failOpenRecord is one fail-open forward waiting to be recorded.
type failOpenRecord struct {
	rt        *route
	key       dedup.Key
	claim     dedup.ClaimOptions
	status    int // the upstream's; 0 when it did not answer
	errText   string
	maybe     bool // the record's MaybeProcessed, if it is released
	stored    *dedup.Response
	until     time.Time // by g.now: the route's window from the forward
	values    context.Context
	fields    []zap.Field
	token     string    // the claim made to record it, once made
	notBefore time.Time // by the monotonic clock: a key in flight waits
	failures  int       // tries the store failed while it answered a ping
	size      int       // bytes counted in failOpenQueue.bytes
}

// failOpenQueue is the Gateway's queue of fail-open forwards to record.
type failOpenQueue struct {
	start sync.Once
	mu    sync.Mutex
	items []*failOpenRecord
	bytes int           // the items' sizes
	wake  chan struct{} // one buffered signal: items is not empty
	// maxBytes bounds bytes when not 0 (tests), else maxFailOpenBytes.
	maxBytes int
}

// recordLater queues d's fail-open forward, which the upstream answered
// with status (0 when it did not answer, with errText) and, on a replay
// route's 2xx, stored, to be recorded once the store answers.
func (g *Gateway) recordLater(d *delivery, status int, errText string, stored *dedup.Response) {
	d.settled = true // once: a 101 whose tunnel then fails comes back through errorHandler
	if !d.keyed {
		return
	}
	q := &g.failOpen
	q.start.Do(func() {
		q.wake = make(chan struct{}, 1)
		if g.enter() {
			go g.recordFailOpens()
		}
	})
	fields := []zap.Field{keyField(d.clientKey), requestIDField(d.requestID)}
	if g.ctx.Err() != nil {
		d.rt.log.Warn("fail-open forward not recorded: the gateway is closing; its next copy is forwarded again", fields...)
		return
	}
	_, wall := g.clock()
	rec := &failOpenRecord{
		rt: d.rt, key: d.key, claim: d.claimOptions(d.bodySHA), status: status, errText: errText, maybe: d.maybeProcessed, stored: stored,
		until: wall.Add(d.rt.Window), values: d.detached,
		fields: fields,
		// The store has just failed the delivery's claim: give it as long
		// as after any failed try.
		notBefore: time.Now().Add(failedRecordFirst),
	}
	keySize := 256 + len(d.key.Namespace) + len(d.key.ID) + len(rec.claim.Fingerprint)
	q.mu.Lock()
	limit := q.maxBytes
	if limit == 0 {
		limit = maxFailOpenBytes
	}
	if stored != nil && q.bytes+keySize+responseSize(stored) > limit {
		rec.stored = nil
	}
	rec.size = keySize + responseSize(rec.stored)
	full := len(q.items) >= maxFailOpenRecords || q.bytes+rec.size > limit
	if !full {
		q.items = append(q.items, rec)
		q.bytes += rec.size
	}
	q.mu.Unlock()
	if full {
		d.rt.sampledLog.Warn("fail-open forward not recorded: too many are waiting for the store already; its next copy is forwarded again", rec.fields...)
		return
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// recordFailOpens works through the queue until the gateway closes (see
// "Fail-open forwards recorded later"), then logs what is left.
func (g *Gateway) recordFailOpens() {
	defer g.active.Done()
	q := &g.failOpen
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	// sleep waits d, or less when the gateway closes: the loop's next
	// turn sees that.
	sleep := func(d time.Duration) {
		if d <= 0 {
			return
		}
		timer.Reset(d)
		select {
		case <-g.ctx.Done():
		case <-timer.C:
		}
	}
	pause := failedRecordFirst
	for {
		q.mu.Lock()
		var rec *failOpenRecord
		if len(q.items) > 0 {
			rec = q.items[0]
		}
		q.mu.Unlock()
		if rec == nil {
			select {
			case <-g.ctx.Done():
				return
			case <-q.wake:
				continue
			}
		}
		sleep(time.Until(rec.notBefore))
		if g.ctx.Err() != nil {
			g.abandonFailOpens()
			return
		}
		now, wall := g.clock()
		outcome := recordDone
		if wall.Before(rec.until) {
			outcome = g.recordOnce(newOpContext(rec.values, now, g.storeTimeout), rec)
		} else {
			rec.rt.log.Warn("fail-open forward not recorded within its window", rec.fields...)
		}
		if outcome == recordStoreDown && g.keyFails(rec, now) {
			rec.rt.log.Warn("fail-open forward not recorded: the store fails this key's claim while it answers its ping; its next copy is forwarded again",
				append(rec.fields, zap.Int("tries", rec.failures))...)
			outcome = recordDone
		}
		switch outcome {
		case recordDone:
			q.pop()
			pause = failedRecordFirst
		case recordInFlight:
			// Behind the others: its claim is settled or lapses in time.
			rec.notBefore = time.Now().Add(inFlightRecordWait)
			q.requeue()
			pause = failedRecordFirst
		case recordStoreDown:
			q.requeue() // the next try is the next record's
			sleep(pause)
			pause = min(2*pause, failedRecordMax)
		}
	}
}

// keyFails pings the store after rec's try failed, and reports whether
// the failure was the key's own for the maxKeyFailures-th time: the store
// answers its ping.
func (g *Gateway) keyFails(rec *failOpenRecord, now time.Time) bool {
	ctx := newOpContext(rec.values, now, g.storeTimeout)
	defer ctx.stop()
	if g.store.Ping(ctx) != nil {
		return false
	}
	rec.failures++
	return rec.failures >= maxKeyFailures
}

// responseSize is about how many bytes r holds.
func responseSize(r *dedup.Response) int {
	if r == nil {
		return 0
	}
	n := len(r.Body)
	for k, vs := range r.Header {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return n
}

// pop drops the queue's first record.
func (q *failOpenQueue) pop() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.bytes -= q.items[0].size
	q.items[0] = nil
	q.items = q.items[1:]
}

// requeue moves the queue's first record to its end.
func (q *failOpenQueue) requeue() {
	q.mu.Lock()
	defer q.mu.Unlock()
	first := q.items[0]
	q.items[0] = nil
	q.items = append(q.items[1:], first)
}

// abandonFailOpens logs the records still queued when the gateway closes,
// by route, naming at most maxUnrecordedKeys keys each.
func (g *Gateway) abandonFailOpens() {
	q := &g.failOpen
	q.mu.Lock()
	items := q.items
	q.items, q.bytes = nil, 0
	q.mu.Unlock()
	type unrecorded struct {
		count int
		keys  []string // the first maxUnrecordedKeys
	}
	byRoute := map[*route]*unrecorded{}
	var order []*route
	for _, rec := range items {
		u := byRoute[rec.rt]
		if u == nil {
			u = &unrecorded{}
			byRoute[rec.rt] = u
			order = append(order, rec.rt)
		}
		u.count++
		if len(u.keys) < maxUnrecordedKeys {
			u.keys = append(u.keys, clipForLog(rec.key.ID))
		}
	}
	for _, rt := range order {
		rt.log.Warn("fail-open forwards not recorded: the gateway is closing; their next copies are forwarded again (after the lease of a claim made to record one)",
			zap.Int("count", byRoute[rt].count), zap.Strings("keys", byRoute[rt].keys))
	}
}

// What one try at recording a fail-open forward came to.
const (
	recordDone      = iota // recorded, or left as the store has it
	recordInFlight         // the key is in flight: try again later
	recordStoreDown        // the store failed: try again after a pause
)

// recordOnce tries to record rec under ctx, which it stops: it claims the
// key unless rec.token holds the claim a previous try made, then commits
// or releases it.
func (g *Gateway) recordOnce(ctx *opContext, rec *failOpenRecord) int {
	defer ctx.stop()
	if rec.token == "" {
		res, err := g.store.Claim(ctx, rec.key, rec.claim)
		switch {
		case err != nil:
			return recordStoreDown
		case res.Outcome == dedup.InFlight:
			return recordInFlight
		case res.Outcome != dedup.Claimed:
			rec.rt.log.Info("fail-open forward: the store already had the key once it answered ("+string(res.Record.State)+"); left as it is", rec.fields...)
			return recordDone
		}
		rec.token = res.Token
		rec.maybe = rec.maybe || res.Record.MaybeProcessed // the mark of an attempt before the outage
	}
	var err error
	what := "recorded as processed once the store answered"
	if rec.status >= 200 && rec.status <= 299 {
		err = g.store.Commit(ctx, rec.key, rec.token, dedup.CommitOptions{Window: rec.rt.Window, Status: rec.status, Response: rec.stored})
	} else {
		what = "recorded as failed once the store answered"
		err = g.store.Release(ctx, rec.key, rec.token, dedup.ReleaseOptions{Retain: rec.rt.FailedRetention, Status: rec.status, Error: rec.errText, MaybeProcessed: rec.maybe})
	}
	switch {
	case errors.Is(err, dedup.ErrNotOwner):
		// The claim's lease ran out and another delivery took the key:
		// the next try finds what it made of it.
		rec.token = ""
		return recordInFlight
	case err != nil:
		return recordStoreDown // the next try settles the same claim
	}
	rec.rt.log.Info("fail-open forward: "+what, rec.fields...)
	return recordDone
}
