package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

// deliveryCtxKey carries the *delivery from ServeHTTP to the ReverseProxy's
// Rewrite, ModifyResponse and ErrorHandler, which all run on the serving
// goroutine.
type deliveryCtxKey struct{}

func deliveryFrom(ctx context.Context) *delivery {
	d, _ := ctx.Value(deliveryCtxKey{}).(*delivery)
	return d
}

// newReverseProxy builds rt's reverse proxy. The outbound request goes to
// rt.target joined with the inbound path, under the target's Host (the
// sender's with rt.PreserveHost), with X-Forwarded-For (appended to
// the sender's chain), X-Forwarded-Host/Proto (see keepForwarded), and
// Dedup-Key (see dedupKeyHeader) when the delivery is keyed. The sender's
// own Dedup-Key header never reaches the upstream.
func (g *Gateway) newReverseProxy(rt *route) *httputil.ReverseProxy {
	target := rt.target
	errLog, err := zap.NewStdLogAt(rt.log, zap.WarnLevel)
	if err != nil { // only for invalid levels
		errLog = zap.NewStdLog(rt.log)
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			rest := true // a path is left to append
			if rt.StripPath {
				rest = stripRoutePath(pr.Out.URL, rt)
			}
			pr.SetURL(target)
			if !rest { // the target's path as it is, not with a "/" added
				pr.Out.URL.Path, pr.Out.URL.RawPath = target.Path, target.RawPath
			}
			if rt.PreserveHost {
				pr.Out.Host = pr.In.Host
			}
			if xff, ok := pr.In.Header["X-Forwarded-For"]; ok && len(xff) > 0 {
				pr.Out.Header["X-Forwarded-For"] = xff
			}
			pr.SetXForwarded()
			var dropped []string // the proxy headers an untrusted peer sent
			if trustedPeer(pr.In.RemoteAddr, g.trusted) {
				keepForwarded(pr.In, pr.Out.Header)
			} else {
				dropped = proxyHeaders
				for _, name := range dropped {
					delete(pr.Out.Header, name)
				}
			}
			// Header.Del and Set with names already canonical: the map
			// operations alone.
			delete(pr.Out.Header, HeaderDedupKey)
			deleteLookalikes(pr.Out.Header, dropped)
			// The body is already buffered: waiting for a 100 Continue
			// would only delay the forward.
			delete(pr.Out.Header, "Expect")
			d := deliveryFrom(pr.In.Context())
			if d == nil {
				return
			}
			if d.keyed {
				pr.Out.Header[HeaderDedupKey] = []string{dedupKeyHeader(d.key, d.clientKey)}
			}
			if pr.In.Body != http.NoBody {
				// The body forward set, handed over as it is. The
				// ReverseProxy wrapped it in a reader of its own, which
				// net/http cannot tell from one that may block, so the
				// Transport would flush the headers in a write system call
				// of their own. The buffered body never blocks: as
				// io.NopCloser of a *bytes.Reader the request goes out in
				// one write (~10 µs less CPU per forward here, in the
				// gateway and the upstream alike). An empty one the
				// ReverseProxy dropped, as it drops every empty body, is
				// there so the Transport cannot resend the request (see
				// replayableWithoutBody). The bytes are the delivery's own,
				// never recycled, so a read by the Transport after the
				// handler returned is harmless.
				pr.Out.Body = pr.In.Body // forward's io.NopCloser(&d.body)
			}
		},
		Transport:      g.transport,
		BufferPool:     g.buffers,
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.errorHandler,
		ErrorLog:       errLog,
	}
}

// stripRoutePath removes rt's path from u's (see Route.StripPath), which rt
// matched, and reports whether any path is left.
func stripRoutePath(u *url.URL, rt *route) bool {
	strip := rt.Path
	if rt.prefix != "" {
		strip = strings.TrimSuffix(rt.prefix, "/")
	}
	u.Path = strings.TrimPrefix(u.Path, strip)
	if u.RawPath != "" {
		// The escaped form keeps its escapes below the route's path; one
		// whose route part is escaped too is rebuilt from Path.
		raw, ok := strings.CutPrefix(u.RawPath, strip)
		if !ok {
			raw = ""
		}
		u.RawPath = raw
	}
	return u.Path != ""
}

// keepForwarded puts the X-Forwarded-Proto and X-Forwarded-Host that in, a
// request from a trusted peer (an ingress, a load balancer, a neighbour in
// the pod: see Options.TrustedProxies), carries into out, over the
// gateway's own view (http, and the Host the request carried), when the
// values are sound: every comma-separated item of every line a Proto of
// http or https, or a Host without spaces or controls. Behind an ingress
// that terminates TLS the app saw https and the public host before the
// gateway stood in between, and may redirect to https or build URLs by
// them. Another peer is not trusted with them (Rails' default trusted
// proxies, for the same reason): it could name any host to the application.
//
// Another peer's proxyHeaders are dropped instead (the Rewrite in
// newReverseProxy), under their own names and, by deleteLookalikes, with
// "_" for "-": a sender would otherwise tell the application its own client
// address, scheme, port or TLS client certificate.
func keepForwarded(in *http.Request, out http.Header) {
	if v := in.Header["X-Forwarded-Proto"]; everyItem(v, func(p string) bool { return strings.EqualFold(p, "https") || strings.EqualFold(p, "http") }) {
		out["X-Forwarded-Proto"] = v
	}
	if v := in.Header["X-Forwarded-Host"]; everyItem(v, func(h string) bool {
		return h != "" && !strings.ContainsFunc(h, func(r rune) bool { return r <= ' ' || r == 0x7f })
	}) {
		out["X-Forwarded-Host"] = v
	}
}

// proxyHeaders are the headers besides X-Forwarded-For, -Host and -Proto
// (which ReverseProxy and keepForwarded handle) and Forwarded (which
// ReverseProxy drops) by which a proxy in front tells an application about
// the original request: the ones Traefik drops from untrusted peers, the
// other spellings of the scheme that Rack (X-Forwarded-Ssl, -Scheme),
// ingress-nginx (X-Scheme) and older proxies use, the client address as
// CDNs name it, and IIS's original URL. Only a trusted peer's reach the
// application.
var proxyHeaders = []string{
	"X-Real-Ip",
	"X-Forwarded-Port",
	"X-Forwarded-Prefix",
	"X-Forwarded-Server",
	"X-Forwarded-Uri",
	"X-Forwarded-Method",
	"X-Forwarded-Ssl",
	"X-Forwarded-Scheme",
	"X-Forwarded-Tls-Client-Cert",
	"X-Forwarded-Tls-Client-Cert-Info",
	"X-Url-Scheme",
	"X-Scheme",
	"Front-End-Https",
	// The client address as CDNs and load balancers name it, which apps
	// and frameworks read for rate limits, logs and allow lists.
	"True-Client-Ip",
	"X-Client-Ip",
	"Client-Ip",
	"Cf-Connecting-Ip",
	"Fastly-Client-Ip",
	"X-Cluster-Client-Ip",
	"X-Original-Forwarded-For",
	// The original URL as IIS's URL Rewrite passes it: Symfony and Zend
	// route by it (CVE-2018-14773), so an unsigned route's delivery could
	// name a signed route's handler.
	"X-Original-Url",
	"X-Rewrite-Url",
}

// everyItem reports whether lines hold at least one comma-separated item
// and ok holds for each, trimmed of spaces.
func everyItem(lines []string, ok func(string) bool) bool {
	if len(lines) == 0 {
		return false
	}
	for _, line := range lines {
		for item := range strings.SplitSeq(line, ",") {
			if !ok(strings.TrimSpace(item)) {
				return false
			}
		}
	}
	return true
}

// trustedPeer reports whether addr, a request's RemoteAddr, is in one of
// the trusted prefixes.
func trustedPeer(addr string, trusted []netip.Prefix) bool {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap().WithZone("")
	for _, p := range trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// gatewaySet are the request headers the gateway sets itself.
var gatewaySet = []string{HeaderDedupKey, "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// deleteLookalikes deletes the headers whose names differ only in "_" or
// "." for "-" (and in case) from one the gateway sets, from one it dropped
// (canonical names), or from another header of the request: CGI-style
// servers (WSGI, PHP, Rack) map both to one HTTP_ variable (PHP turns "."
// in a variable name into "_" too), so a sender's Dedup_Key, Dedup.Key,
// X_Forwarded_For or (untrusted) X_Real_IP would reach such an
// application as the gateway's own or a proxy's, and a Stripe_Signature or
// Idempotency_Key beside the real one could stand in for the value the
// gateway checked. A name with "_" or "." that collides with nothing
// passes.
func deleteLookalikes(h http.Header, dropped []string) {
	for k := range h {
		if strings.IndexAny(k, "_.") < 0 {
			continue
		}
		hyphens := http.CanonicalHeaderKey(lookalikeDashes.Replace(k))
		if _, ok := h[hyphens]; ok || slices.Contains(gatewaySet, hyphens) || slices.Contains(dropped, hyphens) {
			delete(h, k)
		}
	}
}

// lookalikeDashes writes "_" and "." as "-" (see deleteLookalikes).
var lookalikeDashes = strings.NewReplacer("_", "-", ".", "-")

// maxHeaderKey bounds the sender's key as sent verbatim in Dedup-Key; a
// longer one is sent hashed (see dedupKeyHeader). It is above the longest
// key an API idempotency route accepts (255), so such keys go verbatim.
const maxHeaderKey = 256

// hashedKeyPrefix marks a key sent hashed in Dedup-Key.
const hashedKeyPrefix = "sha256:"

// dedupKeyHeader returns the Dedup-Key value for key, whose sender-given part
// (key.ID without a client_identity scope) is clientKey. It is
// "<namespace>:<key.ID>" when that is a valid header value; otherwise the
// sender's key is replaced by "sha256:<64 hex of SHA-256(clientKey)>", so the
// header is "<namespace>:sha256:<hex>" or, on a client_identity route,
// "<namespace>:<32 hex scope>:sha256:<hex>". A key is sent hashed when it
// holds a byte a header value cannot carry (a control character other than
// HTAB, or DEL; Go's transport refuses such a request, so the event could
// never be delivered), when it is longer than maxHeaderKey bytes, or when it
// already starts with "sha256:" (so a sender cannot forge the hashed form of
// another key: the mapping stays one-to-one), or when it ends with a space
// or HTAB (Go writes a header value without the white space at its ends, so
// "evt_1 " would reach the application as "evt_1", another key's Dedup-Key).
// Bytes 0x80 and above (UTF-8) are sent as they are. The stored key and the
// keys API are unchanged: they use the key as the sender gave it.
func dedupKeyHeader(key dedup.Key, clientKey string) string {
	v := key.String()
	if len(clientKey) <= maxHeaderKey && validHeaderValue(v) && !strings.HasPrefix(clientKey, hashedKeyPrefix) &&
		!strings.HasSuffix(v, " ") && !strings.HasSuffix(v, "\t") {
		return v
	}
	sum := sha256.Sum256([]byte(clientKey))
	scope := strings.TrimSuffix(key.ID, clientKey) // "<scope>:" or ""
	return key.Namespace + ":" + scope + hashedKeyPrefix + hex.EncodeToString(sum[:])
}

// validHeaderValue reports whether v can be sent as an HTTP header value, by
// the rule of golang.org/x/net/http/httpguts.ValidHeaderFieldValue that Go's
// transport enforces: no control character other than HTAB, and no DEL.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// copyBufferSize is the size of the buffers the reverse proxies copy
// response bodies with (what ReverseProxy allocates per response otherwise).
const copyBufferSize = 32 << 10

// bufferPool recycles response copy buffers across deliveries and routes.
// A sync.Pool holds pointers, and httputil.BufferPool passes slices: the
// *[]byte that carried a buffer is kept in holders once Get took it out,
// and carries the next one Put, so neither allocates in a steady state.
type bufferPool struct{ p, holders sync.Pool }

var _ httputil.BufferPool = (*bufferPool)(nil)

// Get returns a buffer of copyBufferSize bytes.
func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		buf := *v
		*v = nil
		b.holders.Put(v)
		return buf
	}
	return make([]byte, copyBufferSize)
}

// Put returns buf to the pool.
func (b *bufferPool) Put(buf []byte) {
	if cap(buf) != copyBufferSize {
		return
	}
	h, _ := b.holders.Get().(*[]byte)
	if h == nil {
		h = new([]byte)
	}
	*h = buf[:copyBufferSize]
	b.p.Put(h)
}

// forward sends the buffered body to rt's upstream and streams the answer
// back with Dedup-Status set to status. The upstream call runs until its
// deadline (see forwardDeadline) and is not cancelled when the sender hangs
// up (so the claim is always settled by what the upstream did), only when
// the gateway is closed. A claimed key is committed or released in
// modifyResponse or errorHandler, before anything reaches the sender.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, d *delivery, body []byte, status string) {
	deadline, bound := g.forwardDeadline(d, time.Now())
	d.leaseBound = bound
	ctx, cancel := context.WithDeadline(d.detach(r.Context()), deadline)
	defer cancel()
	stop := context.AfterFunc(g.ctx, cancel)
	defer stop()
	ctx = context.WithValue(ctx, deliveryCtxKey{}, d)

	out := r.WithContext(ctx)
	out.ContentLength = int64(len(body))
	out.TransferEncoding = nil
	d.body.Reset(body)
	out.Body = io.NopCloser(&d.body) // see Rewrite
	// No GetBody: with it, the Transport would silently resend a request
	// carrying Idempotency-Key when a kept-alive upstream connection drops
	// after the request was written, and the application could process one
	// delivery twice. Without it only a request nothing was written of is
	// retried; anything else is a visible 502 and a provider retry.
	out.GetBody = nil
	if len(body) == 0 && !replayableWithoutBody(out) {
		out.Body = http.NoBody // "Content-Length: 0" on the wire
	}

	// The ReverseProxy clears w.Header() after relaying a 1xx (103 Early
	// Hints): modifyResponse and errorHandler set Dedup-Status again, in the
	// same map, so the final answer carries it too.
	d.status, d.header = status, w.Header()
	setDedupStatus(d.header, status)
	gauge := d.rt.metrics.inFlight
	gauge.Inc()
	defer gauge.Dec()
	defer func() {
		// The ReverseProxy calls modifyResponse or errorHandler on every path;
		// this is a guard so a claim is never left to its lease.
		if d.token != "" && !d.settled {
			d.maybeProcessed = true // the forward may have been sent
			g.release(ctx, d, reasonUpstreamError, 0, "no answer")
		}
	}()
	// The upstream's answer is read under the deadline, but the server has
	// no write timeout: a sender that stops reading a large answer would
	// hold this handler, and so the drain and Close, for as long as it stays
	// connected. Bound the write as well, and clear the bound for the
	// connection's next request.
	rc := http.NewResponseController(w)
	if rc.SetWriteDeadline(deadline.Add(g.storeTimeout)) == nil {
		defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	}
	d.forwarded = true
	d.fwdStart, d.fwdDeadline = time.Now(), deadline
	d.rt.proxy.ServeHTTP(w, out)
}

// forwardDeadline returns the deadline of a forward starting at now:
// now + upstream_timeout, or, when d holds a claim and it is earlier, the
// lease's end minus commitReserve, so the commit (or release) that follows
// the upstream's answer is sent with time left on the lease. bound reports
// that the lease set the deadline. Without this bound a forward started late
// in its lease (a slow claim, a store slow to answer) could end after the
// lease: a retry arriving then claims the key and is forwarded again,
// although the first sender is answered 200.
func (g *Gateway) forwardDeadline(d *delivery, now time.Time) (deadline time.Time, bound bool) {
	deadline = now.Add(d.rt.UpstreamTimeout)
	if d.token == "" || d.leaseEnd.IsZero() {
		return deadline, false
	}
	if b := d.leaseEnd.Add(-g.commitReserve(d.rt)); b.Before(deadline) {
		return b, true
	}
	return deadline, false
}

// commitReserve is the part of a route's lease kept for the commit after the
// forward: the store timeout (a commit never takes longer: it is abandoned
// then), but at most half the slack between the lease and upstream_timeout,
// so that a forward started promptly after its claim always gets its full
// upstream_timeout. With the defaults (lease 60s, upstream_timeout 30s,
// store timeout 5s) it is 5s, and only a claim that took more than 25s cuts
// a forward short.
func (g *Gateway) commitReserve(rt *route) time.Duration {
	return max(0, min(g.storeTimeout, (rt.Lease-rt.UpstreamTimeout)/2))
}

// modifyResponse settles the claim from the upstream's status line, before
// the response headers reach the sender: a 2xx commits (storing the response
// on duplicate_response: replay routes), anything else releases; a
// fail-open forward, which holds no claim, is queued to be recorded alike
// (see recordLater). A commit error is logged; the upstream's 2xx is still
// returned, because the event was processed.
func (g *Gateway) modifyResponse(resp *http.Response) error {
	d := deliveryFrom(resp.Request.Context())
	if d == nil {
		return nil
	}
	// The upstream's own Dedup-Status is never stored or passed on with
	// the answer (a 1xx before it is relayed as the upstream sent it): the
	// sender gets the gateway's, set again in case a 1xx cleared it.
	delete(resp.Header, HeaderDedupStatus) // Header.Del of a canonical name
	setDedupStatus(d.header, d.status)
	if _, ok := resp.Header["Content-Type"]; !ok {
		// An answer without a Content-Type is relayed without one: net/http
		// would otherwise sniff one from the body and add it.
		d.header["Content-Type"] = nil
	}
	d.upstreamStatus = resp.StatusCode
	d.rt.metrics.upstream[codeClassIndex(resp.StatusCode)].Observe(time.Since(d.fwdStart).Seconds())
	if d.token == "" && d.status != statusStoreError {
		return nil // nothing to settle or record
	}
	ok := resp.StatusCode >= 200 && resp.StatusCode <= 299
	if d.token != "" && time.Until(d.fwdDeadline) < 2*g.storeTimeout {
		// The settle may outlast the forward's deadline (it takes at
		// most the store timeout): read the answer first, while the
		// forward still may.
		g.readAnswer(d, resp)
	}
	var stored *dedup.Response
	if ok && d.rt.DuplicateResponse == Replay {
		stored = g.captureResponse(d, resp)
	}
	switch ctx := resp.Request.Context(); {
	case d.token == "": // a fail-open forward
		g.recordLater(d, resp.StatusCode, "", stored)
	case !ok:
		g.release(ctx, d, reasonUpstreamStatus, resp.StatusCode, "")
	default:
		g.commit(ctx, d, resp.StatusCode, stored)
	}
	return nil
}

// readAnswer reads the upstream's answer body, up to copyBufferSize bytes,
// before the claim is settled. modifyResponse calls it when that settle
// may end after the forward's deadline (an answer that came late, a slow
// store, which the lease's commit reserve allows for): the body left
// unread would then be read on an expired forward and cut short, although
// the sender gets the upstream's status. An answer that comes with more
// than twice the store timeout left is streamed after the settle.
//
// A body read to its end is then served from the buffer (an answer
// delimited by its connection's close, as an HTTP/1.0 app sends it, needs
// that connection no more); a longer one, or one whose read failed, has
// the part read put back in front of the rest. Webhook answers are small.
func (g *Gateway) readAnswer(d *delivery, resp *http.Response) {
	if resp.Body == nil || resp.Body == http.NoBody || resp.StatusCode < 200 {
		// A 101's body is the upgraded connection, tunnelled as it is.
		return
	}
	buf := g.buffers.Get()
	// Not io.ReadFull: it reports a short body's clean end as
	// io.ErrUnexpectedEOF, the error the body's reader returns for a body
	// cut mid-way (a dropped connection), which must reach the sender cut.
	var n int
	var err error
	for n < len(buf) && err == nil {
		var nn int
		nn, err = resp.Body.Read(buf[n:])
		n += nn
	}
	if err == io.EOF { // the whole body
		_ = resp.Body.Close()
		d.upBuf, d.upPool = buf, g.buffers
		d.upBody.Reset(buf[:n])
		resp.Body = (*answerBody)(d)
		return
	}
	read := bytes.Clone(buf[:n])
	g.buffers.Put(buf)
	// The rest of the body, or its read error again (the transport's
	// body reports it on every later read).
	putBack(resp, read)
}

// putBack puts read, what was read of resp's body, back in front of the
// rest of it.
func putBack(resp *http.Response, read []byte) {
	resp.Body = readCloser{Reader: io.MultiReader(bytes.NewReader(read), resp.Body), Closer: resp.Body}
}

// answerBody serves a delivery's answer body that readAnswer read whole,
// and gives its buffer back when closed.
type answerBody delivery

func (a *answerBody) Read(p []byte) (int, error) { return a.upBody.Read(p) }

// Close gives the buffer back to the pool, once.
func (a *answerBody) Close() error {
	if a.upBuf != nil {
		a.upBody.Reset(nil)
		a.upPool.Put(a.upBuf)
		a.upBuf = nil
	}
	return nil
}

// captureResponse reads up to max_replay_bytes of a 2xx body for replay and
// puts the bytes back in front of the rest of the body. It returns nil when
// the body is larger (the duplicates are then acked) or unreadable.
func (g *Gateway) captureResponse(d *delivery, resp *http.Response) *dedup.Response {
	limit := d.rt.MaxReplayBytes
	buf, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	putBack(resp, buf)
	if err != nil {
		return nil
	}
	if int64(len(buf)) > limit {
		d.rt.metrics.replayTooLarge.Inc()
		return nil
	}
	h := make(map[string][]string, len(d.rt.ReplayHeaders)+len(bodyHeaders))
	for _, names := range [][]string{d.rt.ReplayHeaders, bodyHeaders} {
		for _, name := range names {
			if v := resp.Header.Values(name); len(v) > 0 {
				h[http.CanonicalHeaderKey(name)] = append([]string(nil), v...)
			}
		}
	}
	return &dedup.Response{Status: resp.StatusCode, Header: h, Body: buf}
}

// bodyHeaders describe how the stored body bytes are encoded, so they are
// stored with it whatever replay_headers lists: the gateway passes the
// sender's Accept-Encoding upstream, and a gzip body replayed without its
// Content-Encoding would reach the client as garbage.
var bodyHeaders = []string{"Content-Encoding"}

type readCloser struct {
	io.Reader
	io.Closer
}

// errorHandler answers a forward the upstream never answered: 504 when the
// forward's deadline passed (upstream_timeout, or the claim's lease minus
// the commit reserve: see forwardDeadline), 503 when the gateway is shutting
// down, 502 otherwise. A claimed key is released first, a timeout with
// reason timeout.
func (g *Gateway) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	d := deliveryFrom(r.Context())
	if d == nil { // not a gateway request; cannot happen
		writeProblem(w, probBadGateway, 0)
		return
	}
	d.rt.metrics.upstream[codeClassError].Observe(time.Since(d.fwdStart).Seconds())

	var (
		reason string
		prob   problem
		retry  int
		text   string
	)
	switch {
	case g.ctx.Err() != nil:
		reason, prob, retry, text = reasonShutdown, probShuttingDown.with(d.rt.Name, "the gateway is shutting down; retry the delivery"), retryLaterSeconds, "shutdown"
	case (errors.Is(err, context.DeadlineExceeded) || errors.Is(r.Context().Err(), context.DeadlineExceeded)) && d.leaseBound:
		reason, prob, text = reasonTimeout, probTimeout.with(d.rt.Name, "the upstream did not answer while the claim's lease left time to record its answer (the dedup store was slow); retry the delivery"), "timeout"
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(r.Context().Err(), context.DeadlineExceeded):
		reason, prob, text = reasonTimeout, probTimeout.with(d.rt.Name, fmt.Sprintf("the upstream did not answer within %s", d.rt.UpstreamTimeout)), "timeout"
	default:
		reason, prob, text = reasonUpstreamError, probBadGateway.with(d.rt.Name, "the upstream could not be reached"), upstreamErrorText(err)
	}
	d.upstreamErr = text
	d.maybeProcessed = d.maybeProcessed || mayHaveReached(err)
	d.rt.log.Warn("upstream failed", keyField(d.clientKey), zap.String("reason", reason), zap.Bool("maybe_processed", d.maybeProcessed), zap.Error(err))
	switch {
	case d.settled:
		// modifyResponse settled the claim on the answer's status (a
		// 101 whose tunnel then failed): that was the upstream's answer.
	case d.token != "":
		g.release(r.Context(), d, reason, 0, text)
	case d.status == statusStoreError:
		g.recordLater(d, 0, text, nil)
	}
	d.answer = prob.Status
	setDedupStatus(w.Header(), d.status)
	writeProblem(w, prob, retry)
}

// upstreamErrorText is the short, secret-free description of a failed
// forward stored as the record's LastError.
func upstreamErrorText(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "dns: " + dnsErr.Err
	}
	var netErr net.Error
	if errors.As(err, &netErr) && netErr.Timeout() {
		return "connect timeout"
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err
	}
	return err.Error()
}

// mayHaveReached reports whether a forward that failed with err may have
// reached the upstream, which may then have processed the delivery: the
// Transport gives no answer on whether it wrote the request, so anything
// counts but a failed connection attempt (refused, DNS, no route, a
// connect timeout: a dial error) and a failed TLS handshake (a
// certificate refused, an alert, not TLS at all, the handshake timeout),
// which come before the request is written. A timeout that struck while
// dialling counts, as the Transport reports it as the context's error.
func mayHaveReached(err error) bool {
	var (
		op      *net.OpError
		cert    *tls.CertificateVerificationError
		alert   tls.AlertError
		record  tls.RecordHeaderError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &op) && op.Op == "dial",
		errors.As(err, &cert), errors.As(err, &alert), errors.As(err, &record),
		errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid),
		err.Error() == "net/http: TLS handshake timeout": // the Transport's own type is not exported
		return false
	}
	return true
}

// replayableWithoutBody reports whether the Transport would resend r on a
// new connection, after a kept-alive one failed with r written, if r had no
// body (http.NoBody): its method is GET, HEAD, OPTIONS or TRACE, or it
// carries Idempotency-Key or X-Idempotency-Key (net/http's own rule). Such an
// empty request keeps an empty reader as its body instead: the Transport
// cannot rewind it, so it is not resent (a POST then goes out with
// "Transfer-Encoding: chunked" and no chunk, the same empty body).
func replayableWithoutBody(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, key := r.Header["Idempotency-Key"]
	_, xKey := r.Header["X-Idempotency-Key"]
	return key || xKey
}

// commit marks d's key processed. It runs under its own timeout on a context
// the sender cannot cancel (nor the forward's deadline, nor Close). When the
// store fails it, the commit is tried again in the background (see
// settleLater) while the sender gets the upstream's answer.
func (g *Gateway) commit(parent context.Context, d *delivery, status int, stored *dedup.Response) {
	d.settled = true
	now, wall := g.clock()
	ctx := newOpContext(d.detach(parent), now, g.storeTimeout)
	defer ctx.stop()
	g.warnLateFinish(d, "commit", wall)
	opts := dedup.CommitOptions{Window: d.rt.Window, Status: status, Response: stored}
	if err := g.store.Commit(ctx, d.key, d.token, opts); err != nil {
		g.settleLater(d, commitOp, func(ctx context.Context, key dedup.Key, token string) error {
			return g.store.Commit(ctx, key, token, opts)
		}, err)
	}
}

// commitFailed logs and counts the commit error err (not nil) of a delivery
// on rt, logged with fields, when trying again cannot record the event; it
// reports whether trying again may: err is a store failure, not a verdict.
func commitFailed(rt *route, fields []zap.Field, err error) (again bool) {
	switch {
	case errors.Is(err, dedup.ErrNotOwner):
		rt.metrics.lostCommit.Inc()
		rt.log.Warn("lease lost before commit: the upstream processed the event, but the claim is gone (its lease lapsed and another delivery took the key, it was forgotten, or the store lost it in a failover), so the event is not recorded and its next copy is forwarded again",
			fields...)
	case errors.Is(err, dedup.ErrNotReplicated):
		rt.log.Warn("commit recorded on the store's primary, but its replicas did not confirm it (see error): a failover now would lose it and forward the event's next copy again",
			append(fields, zap.Error(err))...)
	case errors.Is(err, dedup.ErrClosed):
		rt.log.Error("commit failed after the upstream's 2xx: the store is closed; the key stays processing until its lease ends, then a retry is forwarded again",
			fields...)
	default:
		return true
	}
	return false
}

// Commits and releases retry in the background.
//
// A commit the store failed (a Redis failover outlasting the store's own
// retries, a full disk) leaves the key processing although the application
// answered 2xx: its copies get 409 until the lease ends, and the first after
// it is forwarded again. A release the store failed leaves the key
// processing too: its copies get 409 until the lease ends, and the claim
// that then takes the key over marks it maybe_processed, as it cannot tell
// a 500 from a crash. So the gateway goes on trying after the sender got
// its answer, settleRetryFirst after the failure, then twice as long each
// time, at most settleRetryMax apart, each try under the store timeout,
// until the commit or release lands, the store answers that the claim is no
// longer the delivery's, or the lease ends (by the gateway's clock). The
// retries belong to the Gateway: Close stops them, and waits for a try
// under way. Each failed try counts in dedupgw_store_errors_total{op=…};
// the first failure, the outcome and a give-up are logged. A store that
// fails claims as well (the usual outage) leaves only the deliveries
// already forwarded to retry; still, at most maxSettleRetries deliveries
// retry at once, so that a store failing commits alone cannot pile up a
// goroutine per delivery.
const (
	settleRetryFirst = 250 * time.Millisecond
	settleRetryMax   = 5 * time.Second
	maxSettleRetries = 1024
)

// settleOp is a commit or a release as settleLater tries it again: its
// name and its log lines.
type settleOp struct {
	name string
	// failed logs and counts an error of the op on rt that leaves another
	// try no use, and reports whether one may help (commitFailed,
	// releaseFailed).
	failed func(rt *route, fields []zap.Field, err error) (again bool)
	// failing is logged (warn) when the retries start; unsettled (error)
	// when they cannot; closing (error) when Close stops them; gaveUp
	// (error) when the lease ended first.
	failing, unsettled, closing, gaveUp string
}

var (
	commitOp = settleOp{
		name:      "commit",
		failed:    commitFailed,
		failing:   "commit failed after the upstream's 2xx: trying again until the lease ends",
		unsettled: "commit failed after the upstream's 2xx: the key stays processing until its lease ends, then a retry is forwarded again",
		closing:   "commit not tried again: the gateway is closing; the key stays processing until its lease ends, then a retry is forwarded again",
		gaveUp:    "commit failed until the lease ended: a retry is forwarded again",
	}
	releaseOp = settleOp{
		name:      "release",
		failed:    releaseFailed,
		failing:   "release failed: trying again until the lease ends (until then the key stays processing, and its copies get 409)",
		unsettled: "release failed: the key stays processing until its lease ends, then the next copy takes it over, marked maybe_processed",
		closing:   "release not tried again: the gateway is closing; the key stays processing until its lease ends, then the next copy takes it over, marked maybe_processed",
		gaveUp:    "release failed until the lease ended: the next copy takes the key over, marked maybe_processed",
	}
)

// settleLater handles d's commit or release (op), which the store failed
// with err: unless op.failed says another try is no use, it starts the
// background retries, each sending it again with send, or logs
// op.unsettled when it cannot (the lease ended, maxSettleRetries under
// way, or the gateway closed).
func (g *Gateway) settleLater(d *delivery, op settleOp, send func(ctx context.Context, key dedup.Key, token string) error, err error) {
	// What the retries read of d, copied: the delivery is finished without
	// waiting for them.
	rt, key, token, until, values := d.rt, d.key, d.token, d.leaseUntil, d.detached
	fields := []zap.Field{keyField(d.clientKey), requestIDField(d.requestID)}
	if !op.failed(rt, fields, err) {
		return
	}
	if !g.startSettleRetry(until) {
		rt.log.Error(op.unsettled, append(fields, zap.Error(err))...)
		return
	}
	rt.log.Warn(op.failing, append(fields, zap.Time("lease_until", until), zap.Error(err))...)
	go func() {
		defer g.active.Done()
		defer g.settleRetries.Add(-1)
		pause := settleRetryFirst
		timer := time.NewTimer(pause)
		defer timer.Stop()
		for tries := 2; ; tries++ {
			select {
			case <-g.ctx.Done():
				rt.log.Error(op.closing, fields...)
				return
			case <-timer.C:
			}
			now, wall := g.clock()
			if !wall.Before(until) {
				rt.log.Error(op.gaveUp, append(fields, zap.Int("tries", tries-1), zap.Error(err))...)
				return
			}
			ctx := newOpContext(values, now, g.storeTimeout)
			err = send(ctx, key, token)
			ctx.stop()
			if err == nil {
				rt.log.Info(op.name+" recorded on a later try", append(fields, zap.Int("tries", tries))...)
				return
			}
			if !op.failed(rt, fields, err) {
				return
			}
			pause = min(2*pause, settleRetryMax)
			timer.Reset(pause)
		}
	}()
}

// startSettleRetry reports whether a retry of a claim whose lease ends at
// until may start, and counts it (g.settleRetries, g.active) when it may:
// not once the lease ended, with maxSettleRetries under way, or the
// gateway closed.
func (g *Gateway) startSettleRetry(until time.Time) bool {
	if _, wall := g.clock(); until.IsZero() || !wall.Before(until) {
		return false
	}
	if g.settleRetries.Add(1) > maxSettleRetries {
		g.settleRetries.Add(-1)
		return false
	}
	if !g.enter() {
		g.settleRetries.Add(-1)
		return false
	}
	return true
}

// release marks d's key failed (claimable) and counts the reason. Like
// commit, it runs under its own timeout on a context nothing else cancels.
func (g *Gateway) release(parent context.Context, d *delivery, reason string, status int, text string) {
	d.settled = true
	d.rt.metrics.release(reason)
	now, wall := g.clock()
	ctx := newOpContext(d.detach(parent), now, g.storeTimeout)
	defer ctx.stop()
	g.warnLateFinish(d, "release", wall)
	opts := dedup.ReleaseOptions{Retain: d.rt.FailedRetention, Status: status, Error: text, MaybeProcessed: d.maybeProcessed}
	if err := g.store.Release(ctx, d.key, d.token, opts); err != nil {
		g.settleLater(d, releaseOp, func(ctx context.Context, key dedup.Key, token string) error {
			return g.store.Release(ctx, key, token, opts)
		}, err)
	}
}

// releaseFailed logs and counts the release error err (not nil) of a
// delivery on rt, logged with fields, when trying again cannot settle the
// key; it reports whether trying again may.
func releaseFailed(rt *route, fields []zap.Field, err error) (again bool) {
	switch {
	case errors.Is(err, dedup.ErrNotOwner):
		rt.metrics.lostRelease.Inc()
		rt.log.Warn("lease lost before release: the claim is gone (its lease lapsed and another delivery took the key, it was forgotten, or the store lost it in a failover)",
			fields...)
	case errors.Is(err, dedup.ErrClosed):
		rt.log.Error("release failed: the store is closed; the key stays processing until its lease ends", fields...)
	default:
		return true
	}
	return false
}

// warnLateFinish logs when a claim is settled after its lease ended (now,
// read from g.now, is after it), so another delivery may have been forwarded
// meanwhile.
func (g *Gateway) warnLateFinish(d *delivery, op string, now time.Time) {
	if !d.leaseUntil.IsZero() && now.After(d.leaseUntil) {
		d.rt.log.Warn("lease expired before "+op+": a duplicate may have been forwarded meanwhile",
			keyField(d.clientKey), zap.Time("lease_until", d.leaseUntil))
	}
}
