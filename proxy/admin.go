package proxy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

// readyTimeout bounds the store ping behind /readyz.
const readyTimeout = 2 * time.Second

// notReadyLogEvery is how often a store that stays down is logged again by
// /readyz (see admin.ready).
const notReadyLogEvery = time.Minute

// AdminOptions configure the admin handler.
type AdminOptions struct {
	// Token, when non-empty, is required on /v1/* as
	// "Authorization: Bearer <token>" (compared in constant time). Empty means
	// /v1/* is open: keep the admin listener on loopback then.
	Token string
	// AnyHost lets /v1/* without a Token answer requests addressed to any
	// host name. Without it, a token-less /v1/* answers only requests whose
	// Host is an IP address or localhost (else 403): a web page cannot reach
	// it through DNS rebinding, a name of its own resolved to 127.0.0.1.
	AnyHost bool
	// Gatherer is served on /metrics. Nil means the Gateway's own Gatherer;
	// when that is nil too, /metrics answers 404.
	Gatherer prometheus.Gatherer
}

// keyRecord is the JSON body of GET /v1/keys/{route}/{key}: the stored
// record (never its owner token or stored response) plus where it lives.
type keyRecord struct {
	Route     string `json:"route"`
	Namespace string `json:"namespace"`
	Key       string `json:"key"`
	dedup.Record
}

// NewAdmin returns the admin handler:
//
//	GET    /healthz                  200 while the process serves
//	GET    /readyz                   200 when store.Ping answers within 2s, else 503; 503 once g drains
//	GET    /metrics                  Prometheus exposition of opts.Gatherer
//	GET    /v1/keys/{route}          one page of the route's keys, {"keys":[…],"next":"…"}, filtered
//	                                 by ?state= ?since= ?until=, sized by ?limit=, resumed at
//	                                 ?cursor= (see listKeys); 400 invalid-query for a bad value
//	GET    /v1/keys/{route}/{key...} the key's record as JSON; 404 if absent or the route is unknown
//	DELETE /v1/keys/{route}/{key...} forget the key (204); 404 if absent; 409 in-flight (with
//	                                 Retry-After) while a delivery holds a live lease on it,
//	                                 unless ?force=true (a force that is not a boolean: 400);
//	                                 with ?state=S only if the key is in state S, and with
//	                                 ?keep_maybe_processed=true only if it is not marked
//	                                 maybe_processed, else 409 state-changed; the store
//	                                 checks and forgets atomically
//
// GET paths serve HEAD too; another method gets 405 with Allow, another
// path 404, and a path with an empty, "." or ".." segment 400, all as
// problem+json. /v1/* needs opts.Token when it is set (401), and without
// one answers only requests addressed to an IP address or localhost
// unless opts.AnyHost (403). Keys may contain "/". Routes are looked up in
// g's current routes, so keys are found under the route's namespace. Store
// operations are measured in g's store metrics.
func NewAdmin(g *Gateway, store dedup.Store, opts AdminOptions) http.Handler {
	a := &admin{
		g:     g,
		store: newInstrumentedStore(store, g.metrics, g.backend),
		log:   g.log.Named("admin"),
	}
	a.refused = sampled(a.log)
	if opts.Token != "" {
		sum := sha256.Sum256([]byte(opts.Token))
		a.tokenSum = sum[:]
	}
	a.anyHost = opts.AnyHost
	gatherer := opts.Gatherer
	if gatherer == nil {
		gatherer = g.Gatherer()
	}

	mux := http.NewServeMux()
	// serve registers path's handlers by method and, for any other method,
	// a 405 problem naming them (a GET handler serves HEAD too): ServeMux
	// would answer in plain text. A pattern without a method is less
	// specific than the same path with one, so it catches only the others.
	var served []string
	serve := func(path string, byMethod ...methodHandler) {
		var allow []string
		for _, m := range byMethod {
			mux.Handle(m.method+" "+path, m.h)
			allow = append(allow, m.method)
			if m.method == http.MethodGet {
				allow = append(allow, http.MethodHead)
			}
		}
		mux.Handle(path, methodNotAllowed(strings.Join(allow, ", ")))
		served = append(served, strings.Replace(path, "...", "", 1))
	}
	serve("/healthz", methodHandler{http.MethodGet, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, "application/json", map[string]string{"status": "ok"})
	})})
	serve("/readyz", methodHandler{http.MethodGet, http.HandlerFunc(a.ready)})
	if gatherer != nil {
		serve("/metrics", methodHandler{http.MethodGet, promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{
			ErrorLog: zap.NewStdLog(a.log),
		})})
	}
	serve("/v1/keys/{route}/{key...}",
		methodHandler{http.MethodGet, a.auth(http.HandlerFunc(a.getKey))},
		methodHandler{http.MethodDelete, a.auth(http.HandlerFunc(a.forgetKey))})
	serve("/v1/keys/{route}", methodHandler{http.MethodGet, a.auth(http.HandlerFunc(a.listKeys))})
	// Anything else is a 404 problem.
	detail := "the admin API serves " + strings.Join(served[:len(served)-1], ", ") + " and " + served[len(served)-1]
	notFound := func(w http.ResponseWriter, _ *http.Request) {
		writeProblem(w, probNotFound.with("", detail), 0)
	}
	mux.HandleFunc("/", notFound)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// ServeMux redirects a path with "//", "." or ".." to its cleaned
		// form, method kept: DELETE /v1/keys/r/x//y (or //v1/keys/r/x//y)
		// would forget x/y. Nothing on the admin listener is redirected.
		if p := r.URL.EscapedPath(); !cleanURLPath(p) {
			writeProblem(w, probBadPath.with("", `the path has an empty, "." or ".." segment; percent-encode a key's "/" as %2F (and a key "." or ".." as %2E)`), 0)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// methodHandler is one method's handler of an admin path.
type methodHandler struct {
	method string
	h      http.Handler
}

// methodNotAllowed answers 405 with an Allow header listing methods.
func methodNotAllowed(methods string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", methods)
		writeProblem(w, probMethod.with("", r.Method+" is not allowed here; allowed: "+methods), 0)
	})
}

// cleanURLPath reports whether p is its own path.Clean form, a trailing
// slash aside: what ServeMux serves without redirecting.
func cleanURLPath(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

type admin struct {
	g        *Gateway
	store    dedup.Store
	log      *zap.Logger
	refused  *zap.Logger // sampled: anyone who reaches the listener can be refused
	tokenSum []byte      // SHA-256 of the token; nil when /v1 is open
	anyHost  bool        // see AdminOptions.AnyHost
}

func (a *admin) ready(w http.ResponseWriter, r *http.Request) {
	if a.g.draining.Load() {
		writeProblem(w, probDraining, 0)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	n := a.g.pings.Add(1)
	err := a.store.Ping(ctx)
	// Logged as the background ping's answers are (Gateway.storeAnswered):
	// the first failure, then one a minute while the store stays down, as
	// the kubelet probes every few seconds and each replica would
	// otherwise write a line per probe.
	a.g.storeAnswered(n, err)
	if err != nil {
		writeProblem(w, probNotReady.with("", "the dedup store failed its ping (unreachable, on bolt a disk that cannot record, on Redis a master that refuses writes); the gateway's log says why"), 0)
		return
	}
	writeJSON(w, http.StatusOK, "application/json", map[string]string{"status": "ready"})
}

// auth requires the bearer token when one is configured (the scheme's name
// in any case, as RFC 9110 allows). Both sides are hashed first so the
// comparison takes the same time whatever the length. Without a token it
// requires an IP address or localhost as the Host, unless anyHost.
func (a *admin) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.tokenSum != nil {
			scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			sum := sha256.Sum256([]byte(strings.TrimLeft(got, " "))) // 1*SP, RFC 9110 11.4
			if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(sum[:], a.tokenSum) != 1 {
				// Who tried, never what they sent.
				a.refused.Warn("keys API: request refused without a valid token",
					zap.String("method", r.Method), zap.String("path", clipForLog(r.URL.Path)),
					zap.String("remote_addr", r.RemoteAddr), zap.Bool("authorization_sent", r.Header.Get("Authorization") != ""))
				w.Header().Set("WWW-Authenticate", `Bearer realm="dedupgw"`)
				writeProblem(w, probUnauthorized, 0)
				return
			}
		} else if !a.anyHost && !addressedByIP(r.Host) {
			writeProblem(w, probHostNotAllowed.with("", "without admin.token the keys API answers only requests addressed to an IP address or localhost (a defence against DNS rebinding); set admin.token to call it by another name"), 0)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// addressedByIP reports whether host (a Host header, port optional) is an
// IP address or localhost, or empty: browsers always send a Host, so a
// request without one (HTTP/1.0) is no rebinding page's.
func addressedByIP(host string) bool {
	if host == "" {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	_, err := netip.ParseAddr(host)
	return err == nil
}

// key resolves the path's route and key; it answers 404 itself for an
// unknown route.
func (a *admin) key(w http.ResponseWriter, r *http.Request) (*route, dedup.Key, bool) {
	name, id := r.PathValue("route"), r.PathValue("key")
	rt := a.g.routes.Load().byName[name]
	if rt == nil {
		writeProblem(w, probUnknownRoute.with(name, "no route has this name"), 0)
		return nil, dedup.Key{}, false
	}
	if id == "" {
		writeProblem(w, probKeyNotFound.with(name, "the key is empty"), 0)
		return nil, dedup.Key{}, false
	}
	return rt, dedup.Key{Namespace: rt.Namespace, ID: id}, true
}

// notFoundDetail explains a key the store has no record of. On a
// client_identity route the stored key carries the client's scope, which
// an operator holding only the client's own key would leave out. With a
// client_identity_secret the scope cannot be worked out from the
// credential without the secret: the hint says so, and never shows it.
func notFoundDetail(rt *route, id string) string {
	// A claim whose lease lapsed unsettled (its gateway stopped
	// mid-forward) reads as not found too, on Redis and memory, until the
	// next claim takes it over: the detail must not rule it out.
	const detail = "the store has no live record of this key: never delivered, expired or forgotten, or claimed by a gateway that stopped mid-forward and whose lease lapsed (the application may have processed that attempt; the next delivery takes the key over)"
	if rt.ClientIdentity == "" {
		return detail
	}
	if scope, _, ok := strings.Cut(id, ":"); ok && len(scope) == clientScopeLen {
		return detail
	}
	digest := "SHA-256 of the client's " + rt.ClientIdentity + " value"
	if rt.scopeMAC != nil {
		digest = "HMAC-SHA256 of the client's " + rt.ClientIdentity + " value, keyed with the route's client_identity_secret"
	}
	return detail + "; route " + rt.Name + " scopes keys per client (client_identity: " + rt.ClientIdentity + "): a stored key is the first " + strconv.Itoa(clientScopeLen) + " hex digits of the " + digest + ", a colon, then the client's key, as in the application's Dedup-Key after its namespace (unless that shows a sha256: hash)"
}

func (a *admin) getKey(w http.ResponseWriter, r *http.Request) {
	rt, key, ok := a.key(w, r)
	if !ok {
		return
	}
	rec, err := a.store.Get(r.Context(), key)
	switch {
	case errors.Is(err, dedup.ErrNotFound):
		writeProblem(w, probKeyNotFound.with(rt.Name, notFoundDetail(rt, key.ID)), 0)
	case err != nil:
		a.log.Warn("keys API: get failed", zap.String("route", rt.Name), zap.Error(err))
		writeProblem(w, probStoreError.with(rt.Name, "the dedup store did not answer"), retryLaterSeconds)
	default:
		writeJSON(w, http.StatusOK, "application/json", keyRecord{Route: rt.Name, Namespace: key.Namespace, Key: key.ID, Record: rec})
	}
}

// boolParam reads the boolean query parameter name of r, false when
// absent; a value that is not a boolean is answered 400 and reported as
// not ok.
func boolParam(w http.ResponseWriter, r *http.Request, rt *route, name string) (v, ok bool) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return false, true
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		writeProblem(w, probBadQuery.with(rt.Name, fmt.Sprintf("%s=%s: want true or false (or 1, 0)", name, clipForLog(s))), 0)
		return false, false
	}
	return v, true
}

func (a *admin) forgetKey(w http.ResponseWriter, r *http.Request) {
	rt, key, ok := a.key(w, r)
	if !ok {
		return
	}
	force, ok := boolParam(w, r, rt, "force")
	if !ok {
		return
	}
	// ?keep_maybe_processed=true keeps a key marked maybe_processed: a
	// bulk forget sends it for keys it listed unmarked, so one a retry's
	// cut forward marked since is left alone.
	keepMaybe, ok := boolParam(w, r, rt, "keep_maybe_processed")
	if !ok {
		return
	}
	// ?state= forgets the key only in that state: a bulk forget names the
	// state it listed, so a key settled otherwise since is left alone.
	// Forgetting a key whose delivery is being forwarded right now would
	// let the next copy through beside it: that needs ?force=true. The
	// store checks both and forgets in one atomic step.
	want := dedup.State(r.URL.Query().Get("state"))
	switch want {
	case "", dedup.StateProcessing, dedup.StateProcessed, dedup.StateFailed:
	default:
		writeProblem(w, probBadQuery.with(rt.Name, fmt.Sprintf("state=%s: want processing, processed or failed", clipForLog(string(want)))), 0)
		return
	}
	rec, err := a.store.Forget(r.Context(), key, dedup.ForgetOptions{State: want, KeepInFlight: !force, KeepMaybeProcessed: keepMaybe})
	switch {
	case errors.Is(err, dedup.ErrNotFound):
		writeProblem(w, probKeyNotFound.with(rt.Name, notFoundDetail(rt, key.ID)), 0)
	case errors.Is(err, dedup.ErrKept) && want != "" && rec.State != want:
		writeProblem(w, probStateChanged.with(rt.Name, fmt.Sprintf("the key is %s, not %s: nothing was forgotten", rec.State, want)), 0)
	case errors.Is(err, dedup.ErrKept) && (force || rec.State != dedup.StateProcessing):
		writeProblem(w, probStateChanged.with(rt.Name, "the key is marked maybe_processed: its application may have processed it; nothing was forgotten"), 0)
	case errors.Is(err, dedup.ErrKept):
		writeProblem(w, probInFlight.with(rt.Name, "a delivery of this key is being forwarded now; forgetting it would let a copy through beside it. Retry once it finished, or add ?force=true"),
			retryAfterSeconds(a.g.now(), rec.LeaseUntil, rt.Lease))
	case err != nil:
		a.log.Warn("keys API: forget failed", zap.String("route", rt.Name), zap.Error(err))
		writeProblem(w, probStoreError.with(rt.Name, "the dedup store did not answer"), retryLaterSeconds)
	default:
		a.log.Info("keys API: key forgotten", zap.String("route", rt.Name), keyField(key.ID), zap.Bool("force", force), zap.Bool("maybe_processed", rec.MaybeProcessed),
			zap.String("remote_addr", r.RemoteAddr))
		w.WriteHeader(http.StatusNoContent)
	}
}
