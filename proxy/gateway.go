// Package proxy is the dedupgw gateway: an http.Handler that finds each
// webhook delivery's route and key, claims the key in a dedup.Store, forwards
// only the first delivery of each event to the route's upstream, and commits
// or releases the claim before the sender gets its answer. It also provides
// the admin handler (health, readiness, metrics and the keys API).
package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/providers"
)

// Options carry a Gateway's collaborators. The zero value is usable.
type Options struct {
	// Logger receives one line per delivery and warnings. Nil means zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the gateway's metrics. Nil means a fresh
	// prometheus.NewRegistry() (never the default registry), exposed by Gatherer.
	Registerer prometheus.Registerer
	// Backend is the store backend's name ("bolt", "redis", "memory"), used as
	// the backend label of the store metrics. Empty means "unknown".
	Backend string
	// Version is reported by dedupgw_build_info. Empty means "unknown".
	Version string
	// Now is the clock for Retry-After, on_in_flight: wait deadlines and
	// lease-expiry warnings, and for the signature tolerance of routes whose
	// providers.Config has no Now. Nil means time.Now. Durations are always
	// measured on the monotonic clock.
	Now func() time.Time
	// Transport forwards requests upstream. Nil means a tuned *http.Transport
	// (many idle connections per host, not net/http's default 2) that Close
	// shuts down.
	Transport http.RoundTripper
	// StoreTimeout bounds each store operation (claim, commit, release, get).
	// Commit and release run under it even after the sender hung up. Zero
	// means DefaultStoreTimeout.
	StoreTimeout time.Duration
	// BodyTimeout bounds reading one delivery's body, so a slow-body sender
	// is cut off with 408 instead of holding a goroutine. It is applied with
	// http.ResponseController.SetReadDeadline (writers without deadline
	// support, like httptest.ResponseRecorder, are not bounded). Zero means
	// 30s. Slow headers are the http.Server's job (ReadHeaderTimeout).
	BodyTimeout time.Duration
	// TrustedProxies are the peer addresses whose X-Forwarded-Proto and
	// X-Forwarded-Host the upstream gets (see keepForwarded). Nil means
	// DefaultTrustedProxies.
	TrustedProxies []netip.Prefix
	// StorePingInterval, when positive, is how often the Gateway pings its
	// store in the background (once at New, then until Close), so that
	// dedupgw_store_up, dedupgw_store_errors_total{op="ping"} and the log
	// show a store that went down even while no delivery arrives and
	// nothing probes /readyz. Zero means no background ping: the store is
	// pinged only by /readyz. serve uses DefaultStorePingInterval.
	StorePingInterval time.Duration
}

// DefaultStorePingInterval is the StorePingInterval serve uses.
const DefaultStorePingInterval = 10 * time.Second

// DefaultTrustedProxies are the peers trusted with X-Forwarded-Proto and
// X-Forwarded-Host when Options.TrustedProxies is nil: loopback, the
// private ranges (RFC 1918, RFC 4193) and shared address space (RFC 6598,
// 100.64.0.0/10, where some clouds put pods), where ingresses, load
// balancers and pod neighbours connect from.
var DefaultTrustedProxies = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fc00::/7"),
}

// DefaultStoreTimeout is the StoreTimeout a zero Options gets (serve uses
// it).
const DefaultStoreTimeout = 5 * time.Second

const defaultBodyTimeout = 30 * time.Second

// sampledLogsPerSecond is how many lines of one message a sampled log
// writes each second: requests that reached no route, deliveries whose
// signature was rejected. Anyone can send those, as fast as they like; the
// rest are only counted.
const sampledLogsPerSecond = 5

// sampled returns log, writing at most sampledLogsPerSecond lines of each
// message a second. Loggers derived from the result with With share its
// counts.
func sampled(log *zap.Logger) *zap.Logger {
	return log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, sampledLogsPerSecond, 0)
	}))
}

// Gateway is the deduplicating reverse proxy. It is an http.Handler; its
// routes can be swapped with Reload while it serves.
type Gateway struct {
	log          *zap.Logger
	sampledLog   *zap.Logger // log, sampled (see sampledLogsPerSecond)
	trusted      []netip.Prefix
	store        *instrumentedStore
	metrics      *metrics
	gatherer     prometheus.Gatherer // nil unless New made the registry
	backend      string
	now          func() time.Time
	realClock    bool // now is time.Now (see clock)
	transport    http.RoundTripper
	ownTransport *http.Transport
	buffers      *bufferPool
	storeTimeout time.Duration
	bodyTimeout  time.Duration
	newProvider  newProviderFunc

	routes   atomic.Pointer[routeTable]
	reloadMu sync.Mutex

	// ctx is cancelled by Close: it wakes waiters and cancels forwards still
	// running (their claims are released with reason shutdown).
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.RWMutex // guards closed against active.Add
	closed bool
	// draining is set by Drain: /readyz answers 503 from then on.
	draining atomic.Bool
	// pinger is the background store ping (see watchStore), stopped by
	// Close.
	pinger sync.WaitGroup
	// pings numbers the store pings as they start.
	pings atomic.Uint64
	// answerMu guards what storeAnswered keeps of the pings' answers (the
	// background one's and /readyz's). The Gateway keeps it: an admin
	// handler is rebuilt when a reload changes admin.token.
	answerMu sync.Mutex
	// answered is the number of the latest ping whose answer was
	// recorded, so that an answer overtaken by a later one's is dropped.
	answered uint64
	// unready is set while the store fails its pings, so that the recovery
	// is logged once.
	unready bool
	// unreadyLogged is when, by g.now in Unix nanoseconds, the last "not
	// ready" line was written: while the store stays down, at most one a
	// minute (see notReadyLogEvery).
	unreadyLogged int64
	active        sync.WaitGroup // deliveries being served, and store writes tried again in the background
	// settleRetries counts the commits and releases being tried again in
	// the background (see settleLater).
	settleRetries atomic.Int64
	// failOpen are the fail-open forwards waiting to be recorded (see
	// recordLater).
	failOpen failOpenQueue
	closeMu  sync.Once
	// reading are the bodies being read, writing the large replayed answers
	// being written; Close cuts both short.
	reading, writing ioCuts
	// waiting counts deliveries held by on_in_flight: wait; maxWaiting
	// bounds them (each holds its body), the rest get 409 at once.
	waiting    atomic.Int64
	maxWaiting int64
}

// defaultMaxWaiting bounds the deliveries held by on_in_flight: wait across
// all routes: with the default 1 MiB max_body_bytes, at most 128 MiB of
// bodies. Providers send a few copies of an event at once, not hundreds.
const defaultMaxWaiting = 128

// New validates cfg, fills defaults, builds each route's provider and reverse
// proxy, and returns a Gateway serving cfg's routes with store. Every problem
// in cfg is reported in one error, each naming its key ("routes[1].path: …").
// The store stays the caller's: Close does not close it.
func New(cfg Config, store dedup.Store, opts Options) (*Gateway, error) {
	if store == nil {
		return nil, errors.New("proxy: store is nil")
	}
	g := &Gateway{
		log:          opts.Logger,
		backend:      opts.Backend,
		now:          opts.Now,
		transport:    opts.Transport,
		storeTimeout: opts.StoreTimeout,
		bodyTimeout:  opts.BodyTimeout,
		writing:      ioCuts{write: true},
		newProvider:  providers.New,
		buffers:      &bufferPool{},
		maxWaiting:   defaultMaxWaiting,
		trusted:      opts.TrustedProxies,
	}
	if g.trusted == nil {
		g.trusted = DefaultTrustedProxies
	}
	if g.log == nil {
		g.log = zap.NewNop()
	}
	g.log = g.log.Named("proxy")
	g.sampledLog = sampled(g.log)
	if g.backend == "" {
		g.backend = "unknown"
	}
	if g.now == nil {
		g.now, g.realClock = time.Now, true
	}
	if g.storeTimeout <= 0 {
		g.storeTimeout = DefaultStoreTimeout
	}
	if g.bodyTimeout <= 0 {
		g.bodyTimeout = defaultBodyTimeout
	}
	if g.transport == nil {
		g.ownTransport = newTransport()
		g.transport = g.ownTransport
	}

	t, err := g.build(cfg)
	if err != nil {
		return nil, err
	}

	reg := opts.Registerer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, g.gatherer = r, r
	} else if ga, ok := reg.(prometheus.Gatherer); ok {
		g.gatherer = ga
	}
	g.metrics = newMetrics(reg)
	g.metrics.init(opts.Version, g.backend)
	for _, rt := range t.all {
		rt.metrics = g.metrics.initRoute(rt.Name)
	}
	g.store = newInstrumentedStore(store, g.metrics, g.backend)
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.routes.Store(t)
	if every := opts.StorePingInterval; every > 0 {
		g.pinger.Go(func() { g.watchStore(every) })
	}
	return g, nil
}

// watchStore pings the store at once and then every interval until Close,
// reporting each answer to storeAnswered. Without it a store that went
// down would show nowhere while no delivery arrives and nothing probes
// /readyz (the chart probes /healthz unless every route rejects on store
// errors).
func (g *Gateway) watchStore(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(g.ctx, readyTimeout)
		n := g.pings.Add(1)
		err := g.store.pingUnlessCut(ctx, g.ctx)
		cancel()
		if g.ctx.Err() != nil {
			return // Close cut the ping short: not the store's answer
		}
		g.storeAnswered(n, err)
		select {
		case <-g.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// storeAnswered records the answer to store ping n (numbered by g.pings
// as it started; the background one, or /readyz's): dedupgw_store_up, a
// "not ready" warning on the first failure and then at most one a minute
// while the store stays down, and one "ready again" line when it answers
// again. An answer to a ping older than one already recorded is dropped:
// a /readyz ping that failed during an outage but answered after a later
// ping found the store back would otherwise read the store as down again.
func (g *Gateway) storeAnswered(n uint64, err error) {
	g.answerMu.Lock()
	defer g.answerMu.Unlock()
	if n < g.answered {
		return
	}
	g.answered = n
	up := g.metrics.storeUp.WithLabelValues(g.backend)
	if err != nil {
		up.Set(0)
		now := g.now().UnixNano()
		if !g.unready || now-g.unreadyLogged >= int64(notReadyLogEvery) {
			g.unready, g.unreadyLogged = true, now
			g.adminLog().Warn("not ready: the store failed its ping", zap.Error(err))
		}
		return
	}
	up.Set(1)
	if g.unready {
		g.unready = false
		g.adminLog().Info("ready again: the store answers its ping")
	}
}

// adminLog is the logger of the readiness lines, named as when only
// /readyz wrote them.
func (g *Gateway) adminLog() *zap.Logger { return g.log.Named("admin") }

// build validates cfg and returns a complete route table.
func (g *Gateway) build(cfg Config) (*routeTable, error) {
	t, err := buildRoutes(cfg, g.newProvider, g.now)
	if err != nil {
		return nil, err
	}
	for _, rt := range t.all {
		rt.log = g.log.With(zap.String("route", rt.Name))
		// A sampler of its own: a sampler's With shares its counts, so
		// forgeries flooding one route would hide every other route's
		// rejected signatures.
		rt.sampledLog = sampled(rt.log)
		rt.proxy = g.newReverseProxy(rt)
	}
	return t, nil
}

// clock returns time.Now() and g.now(): one reading for both when g.now is
// time.Now (each reading costs tens of nanoseconds).
func (g *Gateway) clock() (now, wall time.Time) {
	now = time.Now()
	if g.realClock {
		return now, now
	}
	return now, g.now()
}

// Gatherer returns the registry New created when Options.Registerer was nil,
// or the Registerer itself when it is also a Gatherer; else nil.
func (g *Gateway) Gatherer() prometheus.Gatherer { return g.gatherer }

// Reload validates cfg and atomically replaces the routes. Deliveries already
// being served finish on the routes they started with. An invalid cfg returns
// an error naming its keys and the current routes keep serving. Reloads are
// counted in dedupgw_config_reloads_total{result}.
func (g *Gateway) Reload(cfg Config) error {
	g.reloadMu.Lock()
	defer g.reloadMu.Unlock()
	t, err := g.build(cfg)
	if err != nil {
		g.metrics.reloads.WithLabelValues("failure").Inc()
		return fmt.Errorf("reload: %w", err)
	}
	kept := make(map[string]bool, len(t.all))
	for _, rt := range t.all {
		rt.metrics = g.metrics.initRoute(rt.Name)
		kept[rt.Name] = true
	}
	old := g.routes.Swap(t)
	// A removed route's series leave /metrics (they would otherwise be
	// exported, frozen, until the process restarts).
	for _, rt := range old.all {
		if !kept[rt.Name] {
			g.metrics.deleteRoute(rt.Name)
		}
	}
	g.metrics.reloads.WithLabelValues("success").Inc()
	g.log.Info("routes reloaded", zap.Int("routes", len(t.all)))
	return nil
}

// ReloadFailed counts a reload rejected before it reached Reload (a
// configuration file that does not parse or validate) in
// dedupgw_config_reloads_total{result="failure"}, the series Reload counts
// its own failures in. The routes are not touched.
func (g *Gateway) ReloadFailed() {
	g.metrics.reloads.WithLabelValues("failure").Inc()
}

// Drain marks the gateway as shutting down before its server stops
// accepting: from then on the admin handler's /readyz answers 503 draining,
// so a load balancer that still probes takes the replica out. Deliveries are
// served as before; Close ends them. Drain is idempotent.
func (g *Gateway) Drain() { g.draining.Store(true) }

// Close stops the gateway: deliveries arriving afterwards get 503, waiters
// (on_in_flight: wait) are woken and answered 409, forwards still running are
// cancelled and their claims released with reason shutdown. Close returns
// once every delivery has finished its commit or release. It does not close
// the store. Call it after http.Server.Shutdown, or when Shutdown's deadline
// passed. Close is idempotent.
func (g *Gateway) Close() error {
	g.closeMu.Do(func() {
		g.draining.Store(true)
		g.mu.Lock()
		g.closed = true
		g.mu.Unlock()
		g.cancel()
		g.reading.cutAll()
		g.writing.cutAll()
		g.active.Wait()
		g.pinger.Wait()
		if g.ownTransport != nil {
			g.ownTransport.CloseIdleConnections()
		}
	})
	return nil
}

// enter registers a delivery; it reports false once the gateway is closed.
func (g *Gateway) enter() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return false
	}
	g.active.Add(1)
	return true
}

// newTransport is the default upstream transport: the upstream is usually
// one application on the same host or pod, so keep many idle connections.
// It never compresses on its own: the upstream sees the sender's
// Accept-Encoding, and the sender gets the upstream's bytes.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy: nil, // the upstream is the local application: never an HTTP_PROXY
		// Go's default adds "Accept-Encoding: gzip" to a request without one
		// and decompresses the answer, which would change the response the
		// sender gets (and the one replay stores).
		DisableCompression: true,
		DialContext: (&net.Dialer{
			Timeout:   5 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: 1 * time.Second,
	}
}
