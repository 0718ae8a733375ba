package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/providers"
)

// Polling of on_in_flight: wait starts at waitMinBackoff and doubles up to
// waitMaxBackoff.
const (
	waitMinBackoff = 5 * time.Millisecond
	waitMaxBackoff = 200 * time.Millisecond
)

// maxAPIKeyLen bounds keys on routes with on_missing_key: reject.
const maxAPIKeyLen = 255

// delivery is the state of one request on a matched route. It is only used
// by the goroutine serving the request.
type delivery struct {
	rt        *route
	start     time.Time
	requestID string // the provider's delivery ID, clipped for logs

	key   dedup.Key
	keyed bool
	// other marks a request whose method is not one of the route's:
	// refused with 405, or passed through (on_other_method: forward). It
	// is not a delivery, so it is not counted, whatever its answer (405,
	// forwarded, or 413 and 408 for its body).
	other bool
	// clientKey is the key as the sender gave it: key.ID without the client
	// scope of a client_identity route. Logs and the duplicate ack show it.
	clientKey string
	// fingerprint binds the key to this request on routes that fingerprint;
	// empty elsewhere.
	fingerprint string
	// bodySHA is the hex SHA-256 of the body, claimed with the key.
	bodySHA string
	// token is the owner token while this delivery holds the claim.
	token      string
	leaseUntil time.Time
	// maybeProcessed is what a release or a fail-open record passes as
	// the record's MaybeProcessed: the claim found the key marked, or the
	// forward ended without an answer after the upstream may have
	// received it (see mayHaveReached).
	maybeProcessed bool
	// leaseEnd is when the claim's lease ends on this process's monotonic
	// clock (see claim); zero without a claim.
	leaseEnd time.Time
	// leaseBound is set when the forward's deadline is the lease's
	// (leaseEnd minus the commit reserve), not upstream_timeout.
	leaseBound bool
	// settled is set once the claim was committed or released, or a
	// fail-open forward's outcome queued for recording (recordLater).
	settled bool
	// detached is the request's context without its cancellation, made
	// once (see detach).
	detached context.Context

	forwarded      bool
	status         string       // the forward's Dedup-Status
	header         http.Header  // the answer's header map, for status
	body           bytes.Reader // the buffered body, read by the forward
	fwdStart       time.Time
	fwdDeadline    time.Time // the forward's (see forwardDeadline)
	upstreamStatus int
	upstreamErr    string

	outcome string // metric outcome; empty when not counted
	answer  int    // status the gateway wrote itself; 0 when the upstream's
	// upBody reads the upstream's answer body from upBuf, a buffer of
	// upPool, when readAnswer read it whole.
	upBody bytes.Reader
	upBuf  []byte
	upPool *bufferPool
	// bodyDiffers is set on a duplicate whose body is not the one the key's
	// first delivery forwarded (see answerDuplicate).
	bodyDiffers bool
}

// ServeHTTP handles one delivery: refuse a path that is not canonical (see
// canonicalPath), match the route, check the method (another one gets 405,
// or on on_other_method: forward routes is forwarded after the body is
// read, with no key and no claim), read the
// body (bounded), verify the signature, extract the key (validated on
// on_missing_key: reject routes, scoped by client_identity when set), check
// the request's fingerprint (on_fingerprint_mismatch: reject), claim the key,
// and then forward, answer as a duplicate or in flight, or apply the route's
// on_missing_key / on_store_error policy. The README's "What each delivery
// gets" lists every answer. Every answer on a matched route carries
// Dedup-Status.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !canonicalPath(r.URL) {
		g.unrouted(w, r, unroutedInvalidPath, probBadPath.with("", `the path has a "." or ".." segment, an empty segment, a backslash, a control character, an encoded slash, "?" or "#", or a double encoding; post to the path the route is configured with`))
		return
	}
	rt, ambiguous := g.routes.Load().lookup(r.URL.Path)
	if ambiguous {
		g.unrouted(w, r, unroutedInvalidPath, probBadPath.with("", "the path matches another route once case, a trailing slash, ;parameters or an extension are ignored, as many applications route; post to the path the route is configured with"))
		return
	}
	if rt == nil {
		g.unrouted(w, r, unroutedNoRoute, probNoRoute.with("", "no route is configured for this path"))
		return
	}
	if !g.enter() {
		closeIfUnread(w, r)
		setDedupStatus(w.Header(), statusRejected)
		writeProblem(w, probShuttingDown.with(rt.Name, "the gateway is shutting down; retry the delivery"), retryLaterSeconds)
		return
	}
	defer g.active.Done()

	d := &delivery{rt: rt, start: time.Now()}
	defer g.finish(d)

	d.other = !rt.allows(r.Method)
	if d.other && !rt.passes(r) {
		closeIfUnread(w, r)
		allow := rt.allowHeader()
		w.Header().Set("Allow", allow)
		detail := "this route accepts " + allow
		if rt.passesReadsOnly() {
			detail = fmt.Sprintf("this route accepts %s; being signed, it passes other methods only as a GET or HEAD without a body", strings.Join(rt.methods, ", "))
		}
		g.reject(w, d, outcomeRejectedMethod, probMethod.with(rt.Name, detail))
		return
	}

	dropConnectionHeaders(r.Header)

	body, err := g.readBody(w, r, rt.MaxBodyBytes, d.start)
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			g.reject(w, d, outcomeRejectedBody, probBodyTooLarge.with(rt.Name, fmt.Sprintf("the body exceeds max_body_bytes (%d)", rt.MaxBodyBytes)))
			return
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			w.Header().Set("Connection", "close")
			g.reject(w, d, outcomeRejectedBody, probBodyTimeout.with(rt.Name, fmt.Sprintf("the body was not received within %s", g.bodyTimeout)))
			return
		}
		g.reject(w, d, outcomeRejectedBody, probBodyUnread.with(rt.Name, "the request body could not be read"))
		return
	}
	rt.metrics.bodyBytes.Observe(float64(len(body)))

	if rt.provider.RequestID != nil {
		d.requestID = clipForLog(rt.provider.RequestID(r)) // only logged
	}
	// A request passed through (d.other) is unsigned: on a signed route
	// only a bodiless GET or HEAD gets here (route.passes).
	if v := rt.provider.Verifier; v != nil && !d.other {
		if err := v.Verify(r, body); err != nil {
			// Sampled: anyone can send forged deliveries as fast as
			// they like; dedupgw_deliveries_total counts them all.
			rt.sampledLog.Warn("signature rejected", requestIDField(d.requestID), zap.Error(err))
			g.reject(w, d, outcomeRejectedSignature, probSignature.with(rt.Name, "the delivery's signature is missing, does not match a configured secret, or its timestamp is outside the tolerance"))
			return
		}
	}

	if d.other {
		// on_other_method: forward. Not a delivery: no key, no claim.
		d.outcome = outcomeOtherMethod
		g.forward(w, r, d, body, statusUnkeyed)
		return
	}

	id, err := rt.provider.Key(r, body)
	if err != nil || id == "" {
		if err != nil && !errors.Is(err, providers.ErrNoKey) {
			rt.log.Debug("key extraction failed", requestIDField(d.requestID), zap.Error(err))
		}
		// A body a json: source cannot read is worth saying: on a webhook
		// route it means the delivery is not deduplicated.
		notJSON := errors.Is(err, providers.ErrJSONSyntax) || errors.Is(err, providers.ErrJSONDepth)
		if errors.Is(err, providers.ErrAmbiguousKey) {
			// Refused whatever on_missing_key says: forwarded without
			// deduplication, a captured delivery replayed with a second
			// key header would go through again.
			g.reject(w, d, outcomeRejectedKey, probMissingKey.with(rt.Name, "the key header appears more than once, with different values; expected "+expectedKey(rt)))
			return
		}
		if rt.OnMissingKey == Reject {
			detail := "no key in the request; expected " + expectedKey(rt)
			if notJSON {
				detail += " (the body is not valid JSON)"
			}
			g.reject(w, d, outcomeRejectedKey, probMissingKey.with(rt.Name, detail))
			return
		}
		if notJSON {
			rt.log.Warn("no key: the body is not valid JSON, so the delivery is forwarded without deduplication",
				requestIDField(d.requestID), zap.Int("body_bytes", len(body)))
		}
		d.outcome = outcomeUnkeyed
		g.forward(w, r, d, body, statusUnkeyed)
		return
	}
	if rt.OnMissingKey == Reject && !validAPIKey(id) {
		g.reject(w, d, outcomeRejectedKey, probMissingKey.with(rt.Name, fmt.Sprintf("the key must be 1 to %d printable ASCII characters; expected %s", maxAPIKeyLen, expectedKey(rt))))
		return
	}
	d.clientKey = id
	if rt.ClientIdentity != "" {
		scope, ok, twoIDs := rt.clientScope(r)
		if twoIDs {
			// Refused whatever on_missing_key says, as an ambiguous key is.
			g.reject(w, d, outcomeRejectedKey, probMissingKey.with(rt.Name, "the "+rt.ClientIdentity+" header appears more than once, with different values; this route scopes idempotency keys per client"))
			return
		}
		if !ok {
			// Without the identity the key cannot be scoped: it is missing.
			if rt.OnMissingKey == Reject {
				g.reject(w, d, outcomeRejectedKey, probMissingKey.with(rt.Name, "no "+rt.ClientIdentity+" header; this route scopes idempotency keys per client"))
				return
			}
			d.outcome = outcomeUnkeyed
			g.forward(w, r, d, body, statusUnkeyed)
			return
		}
		id = scope + ":" + id
	}
	d.key = dedup.Key{Namespace: rt.Namespace, ID: id}
	d.keyed = true

	if rt.fingerprints() {
		// The claim binds the key to this fingerprint: a key first used for
		// another request answers Conflict in any state, atomically, so a
		// failed attempt of that request is never taken over by this one.
		d.fingerprint = fingerprint(r.Method, r.URL.Path, body, rt.FingerprintExclude)
	}

	sum := sha256.Sum256(body)
	var hexSum [2 * sha256.Size]byte
	hex.Encode(hexSum[:], sum[:])
	bodySHA := string(hexSum[:])
	d.bodySHA = bodySHA
	res, err := g.claim(r.Context(), d, bodySHA)
	if err != nil {
		g.storeError(w, r, d, body, err)
		return
	}
	g.decide(w, r, d, body, bodySHA, res)
}

// decide acts on a claim's outcome.
func (g *Gateway) decide(w http.ResponseWriter, r *http.Request, d *delivery, body []byte, bodySHA string, res dedup.ClaimResult) {
	switch res.Outcome {
	case dedup.Claimed:
		d.outcome = outcomeForwarded
		g.forward(w, r, d, body, statusForwarded)
	case dedup.Duplicate:
		d.outcome = outcomeDuplicate
		d.answer = g.answerDuplicate(w, r, d, body, res.Record)
	case dedup.Conflict:
		g.rejectFingerprint(w, d)
	case dedup.InFlight:
		if d.rt.OnInFlight == Wait && g.holdWaiter() {
			g.wait(w, r, d, body, bodySHA, res.Record) // releases the slot
			return
		}
		g.inFlight(w, d, res.Record)
	default:
		g.storeError(w, r, d, body, fmt.Errorf("claim: unknown outcome %d", res.Outcome))
	}
}

// claim claims d's key on a context the sender cannot cancel, so a claim the
// store made is never lost to a hang-up. It records the token when claimed,
// and the lease's end on the local monotonic clock (d.leaseEnd): the time the
// claim was sent plus the lease's remaining duration at claim time. The store
// granted the lease at an instant after the claim was sent, so this end is
// never later than the store's, however far the store's clock is from ours
// and however long the claim's round trip took. The remaining duration is
// the route's lease, or less when the record's LeaseUntil, read against our
// clock when the claim was sent, says so (a store clock behind ours).
func (g *Gateway) claim(parent context.Context, d *delivery, bodySHA string) (dedup.ClaimResult, error) {
	sent, sentWall := g.clock()
	ctx := newOpContext(d.detach(parent), sent, g.storeTimeout)
	defer ctx.stop()
	res, err := g.store.Claim(ctx, d.key, d.claimOptions(bodySHA))
	if err != nil {
		return res, fmt.Errorf("claim %s: %w", keyForError(d.key), err)
	}
	if res.TookOver {
		d.rt.metrics.takeovers.Inc()
		d.rt.log.Warn("lease lapsed: this delivery takes over a key whose earlier attempt ended unseen (its gateway crashed or hung, or could not commit or release it); the application may have processed that attempt, so the key is marked maybe_processed until an attempt of it gets a 2xx (this log line is what remains of the takeover then)",
			keyField(d.clientKey), requestIDField(d.requestID), zap.Int("attempts", res.Record.Attempts))
	}
	if res.Outcome == dedup.Claimed {
		d.token = res.Token
		d.leaseUntil = res.Record.LeaseUntil
		d.maybeProcessed = res.Record.MaybeProcessed
		remaining := d.rt.Lease
		if r := res.Record.LeaseUntil.Sub(sentWall); !res.Record.LeaseUntil.IsZero() && r > 0 && r < remaining {
			remaining = r
		}
		d.leaseEnd = sent.Add(remaining)
	}
	return res, nil
}

// holdWaiter counts one more delivery held by on_in_flight: wait and reports
// true, or false (answer it as on_in_flight: reject) when maxWaiting are held
// already. The caller releases a true with g.waiting.Add(-1).
func (g *Gateway) holdWaiter() bool {
	if g.waiting.Add(1) <= g.maxWaiting {
		return true
	}
	g.waiting.Add(-1)
	return false
}

// wait holds a duplicate of an in-flight delivery (on_in_flight: wait) by
// polling the store, so it works across replicas sharing one store: the
// first attempt's success answers this one as a duplicate, its failure lets
// this one claim the key and be forwarded, and a lease's worth of waiting (or
// Close, or the sender hanging up) ends in 409.
//
// The caller holds a waiting slot (holdWaiter); wait gives it back when it
// answers, or before this copy is forwarded after all.
func (g *Gateway) wait(w http.ResponseWriter, r *http.Request, d *delivery, body []byte, bodySHA string, rec dedup.Record) {
	held := true
	release := func() {
		if held {
			held = false
			g.waiting.Add(-1)
		}
	}
	defer release()
	deadline := g.now().Add(d.rt.Lease)
	if !rec.LeaseUntil.IsZero() && rec.LeaseUntil.Before(deadline) {
		deadline = rec.LeaseUntil
	}
	backoff := waitMinBackoff
	timer := time.NewTimer(backoff)
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-r.Context().Done():
			g.inFlight(w, d, rec)
			return
		case <-g.ctx.Done():
			g.inFlight(w, d, rec)
			return
		}

		cur, err := g.get(r.Context(), d)
		switch {
		case err == nil && cur.State == dedup.StateProcessed:
			if d.claimOptions(bodySHA).Conflicts(cur.Fingerprint) { // another request took the key meanwhile
				g.rejectFingerprint(w, d)
				return
			}
			d.outcome = outcomeDuplicate
			d.answer = g.answerDuplicate(w, r, d, body, cur)
			return
		case err == nil && cur.State == dedup.StateProcessing:
			rec = cur
		case errors.Is(err, dedup.ErrNotFound) || (err == nil && cur.State == dedup.StateFailed):
			res, err := g.claim(r.Context(), d, bodySHA)
			if err != nil {
				d.rt.log.Debug("claim while waiting failed", keyField(d.clientKey), zap.Error(err))
				break
			}
			if res.Outcome != dedup.InFlight {
				release() // no longer held: forwarded or answered now
				g.decide(w, r, d, body, bodySHA, res)
				return
			}
			rec = res.Record
		default:
			d.rt.log.Debug("store read while waiting failed", keyField(d.clientKey), zap.Error(err))
		}

		now := g.now()
		if !now.Before(deadline) {
			g.inFlight(w, d, rec)
			return
		}
		backoff = min(2*backoff, waitMaxBackoff)
		timer.Reset(min(backoff, deadline.Sub(now)))
	}
}

// inFlight answers 409 with Retry-After: when the holder's delivery should
// be settled (see settledBy).
func (g *Gateway) inFlight(w http.ResponseWriter, d *delivery, rec dedup.Record) {
	d.outcome = outcomeInFlight
	d.answer = http.StatusConflict
	setDedupStatus(w.Header(), statusInFlight)
	now := g.now()
	writeProblem(w, probInFlight.with(d.rt.Name, "another delivery of this event is being forwarded; retry after it finished"),
		retryAfterSeconds(now, g.settledBy(d.rt, rec.LeaseUntil, now), d.rt.Lease))
}

// settledBy returns when a claim whose lease ends at leaseUntil should be
// settled: its forward ends within upstream_timeout of the claim (the
// route's lease before leaseUntil) and its commit or release within the
// store timeout after that, so a retry then finds the key processed or
// claimable, not in flight. Where that time has passed (a holder that
// crashed, or a commit retried in the background) or is not earlier, it is
// the lease's end, after which the key is taken over.
//
// The claim is in the store, so it was made no later than now: a lease that
// ends more than a lease from now was granted on a clock ahead of ours
// (another replica's on Redis, or ours before a step back), and is read as
// ending one lease from now. Otherwise a holder's clock 10 minutes ahead
// would tell every copy to come back in 10 minutes and 35 s.
func (g *Gateway) settledBy(rt *route, leaseUntil, now time.Time) time.Time {
	if leaseUntil.IsZero() {
		return leaseUntil
	}
	if latest := now.Add(rt.Lease); leaseUntil.After(latest) {
		leaseUntil = latest
	}
	by := leaseUntil.Add(-rt.Lease + rt.UpstreamTimeout + g.storeTimeout)
	if by.After(now) && by.Before(leaseUntil) {
		return by
	}
	return leaseUntil
}

// get reads d's key's record under the store timeout, on a context the sender
// cannot cancel (as claim does: a hang-up is not a store error).
func (g *Gateway) get(parent context.Context, d *delivery) (dedup.Record, error) {
	key := d.key
	ctx := newOpContext(d.detach(parent), time.Now(), g.storeTimeout)
	defer ctx.stop()
	rec, err := g.store.Get(ctx, key)
	if err != nil {
		return rec, fmt.Errorf("get %s: %w", keyForError(key), err)
	}
	return rec, nil
}

// rejectFingerprint answers 422: d's key was first used for another request
// (on_fingerprint_mismatch: reject).
func (g *Gateway) rejectFingerprint(w http.ResponseWriter, d *delivery) {
	d.rt.log.Info("idempotency key reused with a different payload", keyField(d.clientKey), requestIDField(d.requestID))
	g.reject(w, d, outcomeRejectedFingerprint, probKeyReused.with(d.rt.Name, "key reused with a different payload; send a new request under a new key"))
}

// storeError applies on_store_error after a failed claim: forward without a
// claim (fail open, Dedup-Status: store-error) or 503 with Retry-After.
//
// A fail-open forward is warned about every time, with its key: it is the
// record of which events may reach the application twice. A rejection is
// warned about sampled (see sampledLogsPerSecond): the sender retries it,
// nothing needs reconciling, and an outage would otherwise double the log
// (the delivery line already names each key and outcome).
func (g *Gateway) storeError(w http.ResponseWriter, r *http.Request, d *delivery, body []byte, err error) {
	d.outcome = outcomeStoreError
	if d.rt.OnStoreError == Reject {
		d.rt.sampledLog.Warn("store unavailable: delivery rejected", keyField(d.clientKey), requestIDField(d.requestID), zap.Error(err))
		d.answer = http.StatusServiceUnavailable
		setDedupStatus(w.Header(), statusStoreError)
		writeProblem(w, probStoreError.with(d.rt.Name, "the dedup store is unavailable; retry the delivery"), retryLaterSeconds)
		return
	}
	d.rt.log.Warn("store unavailable: forwarding without deduplication (fail open)", keyField(d.clientKey), requestIDField(d.requestID), zap.Error(err))
	g.forward(w, r, d, body, statusStoreError)
}

// reject answers a delivery the gateway refuses with Dedup-Status: rejected.
func (g *Gateway) reject(w http.ResponseWriter, d *delivery, outcome string, p problem) {
	d.outcome = outcome
	d.answer = p.Status
	setDedupStatus(w.Header(), statusRejected)
	writeProblem(w, p, 0)
}

// detach returns the delivery's request context without its cancellation:
// context.WithoutCancel(parent) on the first call, where parent is the
// request's context (claim, get, forward), and the same context afterwards.
// The store operations and the forward share it, so a sender hanging up
// never cancels them; commit and release, which are handed the forward's
// context, thus run on the request's values and not on the forward's (the
// delivery and the ReverseProxy's client trace are no store's business).
func (d *delivery) detach(parent context.Context) context.Context {
	if d.detached == nil {
		d.detached = context.WithoutCancel(parent)
	}
	return d.detached
}

// finish counts the delivery and writes its log line.
func (g *Gateway) finish(d *delivery) {
	if d.outcome != "" && !d.other {
		d.rt.metrics.delivery(d.outcome)
	}
	status := d.answer
	if status == 0 {
		status = d.upstreamStatus
	}
	// An upstream that answered other than 2xx failed the delivery: its
	// line is a warning, so log.level: warn still shows it (one that did
	// not answer has an "upstream failed" warning of its own).
	level := zap.InfoLevel
	switch {
	case d.outcome == outcomeOtherMethod:
		// An API's GETs, its 404s included: not deliveries, and many.
		level = zap.DebugLevel
	case d.outcome == outcomeRejectedSignature:
		// Anyone can send forgeries as fast as they like: the sampled
		// "signature rejected" warning says it, and
		// dedupgw_deliveries_total counts them all.
		level = zap.DebugLevel
	case d.forwarded && d.upstreamStatus != 0 && (d.upstreamStatus < 200 || d.upstreamStatus > 299):
		level = zap.WarnLevel
	}
	ce := d.rt.log.Check(level, "delivery")
	if ce == nil { // the level is above this line's: build no fields
		return
	}
	fields := make([]zap.Field, 0, 7)
	fields = append(fields,
		zap.String("outcome", d.outcome),
		zap.Int("status", status),
		zap.Float64("duration_ms", float64(time.Since(d.start).Microseconds())/1000),
	)
	if d.keyed {
		fields = append(fields, keyField(d.clientKey))
	}
	fields = append(fields, requestIDField(d.requestID))
	if d.forwarded && d.upstreamStatus != 0 { // 0: no answer, upstream_error says why
		fields = append(fields, zap.Int("upstream_status", d.upstreamStatus))
	}
	if d.forwarded && d.upstreamErr != "" {
		fields = append(fields, zap.String("upstream_error", d.upstreamErr))
	}
	if d.bodyDiffers {
		fields = append(fields, zap.Bool("body_differs", true))
	}
	ce.Write(fields...)
}

// readBody reads the whole body, at most limit bytes (beyond that it returns
// an *http.MaxBytesError) and within the gateway's body timeout from start,
// when the delivery arrived (beyond that a net.Error whose Timeout is true).
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request, limit int64, start time.Time) (_ []byte, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		closeIfUnread(w, r)
		return nil, &http.MaxBytesError{Limit: limit}
	}
	// Close cuts a body still arriving short, so it does not wait for a
	// slow sender.
	rc := http.NewResponseController(w)
	if g.reading.begin(rc, r, w, start.Add(g.bodyTimeout)) {
		// An unfinished body keeps its deadline in the past, so the
		// server's discard of the rest fails at once and the connection
		// closes, instead of a trickling sender holding it open with no
		// deadline at all. A finished one clears it: the server's
		// background read must not time out (and cancel the request) while
		// the upstream works.
		defer func() { g.reading.end(rc, r, err != nil) }()
	}
	if r.ContentLength > 0 {
		// The server's body reader stops at Content-Length: read exactly
		// that. It is at most limit (see above), so a MaxBytesReader would
		// never stop this read.
		return readExactly(r.Body, int(r.ContentLength))
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	var buf bytes.Buffer
	if _, err = buf.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	return buf.Bytes(), nil
}

// bodyChunk is the first buffer readExactly allocates for a larger body.
const bodyChunk = 64 << 10

// readExactly reads n bytes from r. Its buffer grows with the bytes that
// arrive, not with the length the sender announced: a header alone must not
// make the gateway hold max_body_bytes for each connection until the body
// timeout. The buffer is at most bodyChunk, or twice what arrived, and ends
// at exactly n bytes; a body up to bodyChunk is one allocation.
func readExactly(r io.Reader, n int) ([]byte, error) {
	buf := make([]byte, min(n, bodyChunk))
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	for len(buf) < n {
		m := len(buf)
		next := make([]byte, min(n, 2*m)) // exactly: append's growth would overshoot n
		copy(next, buf)
		buf = next
		if _, err := io.ReadFull(r, buf[m:]); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // short of Content-Length
			}
			return nil, fmt.Errorf("read body: %w", err)
		}
	}
	return buf, nil
}

// bigReplay is the size from which the write of a replayed answer is
// bounded (see answerDuplicate): net/http buffers a smaller one whole and
// writes it after the handler returned, so it cannot hold the handler. (A
// larger one can, even when it fits in the socket's buffers: a sender that
// pipelines requests on one connection and reads none of the answers fills
// them.)
const bigReplay = 2 << 10 // net/http's bufferBeforeChunkingSize

// bodyDiffers reports whether d, with body, a duplicate of rec, is
// another request than the one rec recorded: by fingerprint when both
// have one, else by the body's SHA-256 (a record without one is not
// compared), unless d's key is the body's own canonical hash
// (providers.BodyKey), which only the same payload has.
func bodyDiffers(d *delivery, body []byte, rec dedup.Record) bool {
	if d.fingerprint != "" && rec.Fingerprint != "" {
		return rec.Fingerprint != d.fingerprint
	}
	if rec.BodySHA256 == "" || d.bodySHA == "" || rec.BodySHA256 == d.bodySHA {
		return false
	}
	// Rare (a differing body), so the canonical hash is worked out here
	// rather than for every delivery.
	return d.clientKey != providers.BodyKey(body)
}

// answerDuplicate answers a duplicate with writeDuplicate, the stored answer
// as replayFor gives it for this sender. A stored answer
// over bigReplay is written under a deadline of the body timeout (a sender
// gets as long to read it as to send a body), which Close cuts short: a
// sender that stops reading it must not hold the handler, and so the drain.
//
// A duplicate whose body differs from the one the key's first delivery
// forwarded (the record's BodySHA256) is counted and flagged on its log
// line: a provider resends an event byte for byte, or nearly (one that
// re-serialises it may change a count inside), so many such duplicates
// mean the key names something other than the event (an object's ID, a
// business key two events share), and events were dropped as duplicates.
// On a route that fingerprints its requests the fingerprint decides what
// the same request is (a retry with another request_time, or its keys in
// another order, is one), so a record bound to a fingerprint is never
// flagged: another one would have been a conflict. Nor is a copy keyed by
// its own canonical body (the body source): its key is its payload.
func (g *Gateway) answerDuplicate(w http.ResponseWriter, r *http.Request, d *delivery, body []byte, rec dedup.Record) int {
	if bodyDiffers(d, body, rec) {
		d.bodyDiffers = true
		d.rt.metrics.bodyDiffers.Inc()
	}
	if d.rt.DuplicateResponse == Replay && rec.Response != nil {
		rec.Response = replayFor(rec.Response, r.Header.Values("Accept-Encoding"), d.rt.MaxReplayBytes)
		if rec.Response != nil && len(rec.Response.Body) > bigReplay {
			rc := http.NewResponseController(w)
			if g.writing.begin(rc, r, w, time.Now().Add(g.bodyTimeout)) {
				defer g.writing.end(rc, r, false)
			}
		}
	}
	return writeDuplicate(w, d.rt, d.clientKey, rec)
}

// ioCuts are the deliveries in a read or a write that Close cuts short: the
// bodies being read, or the large replayed answers being written. (A
// context.AfterFunc on the gateway's context per delivery did the same for
// three allocations, and a lock every delivery shared.)
type ioCuts struct {
	mu      sync.Mutex
	writers map[*http.Request]http.ResponseWriter // keyed by request: any ResponseWriter a middleware passes in need not be hashable
	cut     bool
	write   bool // the writes are cut, else the reads
}

// begin sets r's read (or write) deadline through rc, w's controller, and
// registers it for cutAll; once cutAll ran, the deadline is set in the past
// at once. It reports false, doing nothing, when w takes no deadlines. The
// caller then calls end.
func (b *ioCuts) begin(rc *http.ResponseController, r *http.Request, w http.ResponseWriter, deadline time.Time) bool {
	if b.set(rc, deadline) != nil {
		return false
	}
	if !b.add(r, w) {
		_ = b.set(rc, time.Unix(1, 0)) // closing already
	}
	return true
}

// end unregisters r and clears its deadline, or with cut leaves it in the
// past.
func (b *ioCuts) end(rc *http.ResponseController, r *http.Request, cut bool) {
	b.remove(r)
	if cut {
		_ = b.set(rc, time.Unix(1, 0))
		return
	}
	_ = b.set(rc, time.Time{})
}

// set sets rc's read (or write) deadline.
func (b *ioCuts) set(rc *http.ResponseController, t time.Time) error {
	if b.write {
		return rc.SetWriteDeadline(t)
	}
	return rc.SetReadDeadline(t)
}

// add registers r's read or write, through w. It reports false once cutAll
// ran: the caller cuts its own.
func (b *ioCuts) add(r *http.Request, w http.ResponseWriter) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cut {
		return false
	}
	if b.writers == nil {
		b.writers = make(map[*http.Request]http.ResponseWriter)
	}
	b.writers[r] = w
	return true
}

func (b *ioCuts) remove(r *http.Request) {
	b.mu.Lock()
	delete(b.writers, r)
	b.mu.Unlock()
}

// cutAll sets a read (or write) deadline in the past on every registered
// delivery, and makes add refuse later ones.
func (b *ioCuts) cutAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.cut = true
	for _, w := range b.writers {
		_ = b.set(http.NewResponseController(w), time.Unix(1, 0))
	}
}

// maxLoggedKey bounds a key or request ID in log lines; both come from
// senders.
const maxLoggedKey = 256

// clipForLog returns s for a log line: bytes that are not UTF-8 written as
// \xNN (JSON logs would show each as U+FFFD, and the key could not be found
// again from the log) and a backslash as \\ (so a key holding the text \xE9
// does not read like one holding the byte), truncated after maxLoggedKey
// bytes of s, marked with "…".
func clipForLog(s string) string {
	if len(s) <= maxLoggedKey && utf8.ValidString(s) && strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s) && i < maxLoggedKey; {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02X`, s[i])
			i++
			continue
		case r == '\\':
			b.WriteString(`\\`)
			i++
			continue
		}
		if i+n > maxLoggedKey {
			break
		}
		b.WriteString(s[i : i+n])
		i += n
	}
	if len(s) > maxLoggedKey {
		b.WriteString("…")
	}
	return b.String()
}

// unrouted answers r, which reached no route, with p, counts it by reason
// and logs it (sampled: see sampledLogsPerSecond) with its path, so that a
// provider posting to a misspelt URL leaves a trace.
func (g *Gateway) unrouted(w http.ResponseWriter, r *http.Request, reason string, p problem) {
	closeIfUnread(w, r)
	writeProblem(w, p, 0)
	g.metrics.unrouted.WithLabelValues(reason).Inc()
	if ce := g.sampledLog.Check(zap.InfoLevel, "request reached no route"); ce != nil {
		ce.Write(zap.String("reason", reason), zap.Int("status", p.Status), zap.String("method", clipForLog(r.Method)),
			zap.String("path", clipForLog(r.URL.EscapedPath())), zap.String("remote_addr", r.RemoteAddr))
	}
}

// keyForError is k as an error message names it, for the log lines that
// carry the error: its ID clipped as keyField clips it. A sender picks the
// ID (a json: key can be as long as the body), and a store outage logs
// every fail-open delivery with its error.
func keyForError(k dedup.Key) string {
	return k.Namespace + ":" + clipForLog(k.ID)
}

// keyField is the log field for a delivery's key (see clipForLog).
func keyField(id string) zap.Field {
	return zap.String("key", clipForLog(id))
}

// requestIDField is the log field for a delivery's request ID (clipped
// when read), none when the provider sends none.
func requestIDField(id string) zap.Field {
	if id == "" {
		return zap.Skip()
	}
	return zap.String("request_id", id)
}

// dropConnectionHeaders deletes the headers that h's Connection header
// names, as the ReverseProxy does before forwarding: the gateway verifies
// signatures and reads keys only from headers the upstream will see, so a
// sender cannot have a signature or key checked here and then stripped
// before the application reads it.
func dropConnectionHeaders(h http.Header) {
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				h.Del(name)
			}
		}
	}
}

// closeIfUnread asks the server to close the connection after an answer
// written without reading the request's body; otherwise the server would
// first wait to drain a body the sender may be sending slowly.
func closeIfUnread(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
	}
}

// validAPIKey reports whether key is acceptable on an API idempotency route:
// 1 to 255 printable ASCII characters.
func validAPIKey(key string) bool {
	if len(key) == 0 || len(key) > maxAPIKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] > 0x7e {
			return false
		}
	}
	return true
}

// expectedKey describes where rt looks for its key, for a 400's detail.
func expectedKey(rt *route) string {
	keys := rt.Provider.KeySources()
	if len(keys) == 0 {
		return "a key"
	}
	return "a non-empty value from " + strings.Join(keys, ", then ")
}
