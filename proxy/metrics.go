package proxy

import (
	"context"
	"errors"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/dedupgw/dedupgw/dedup"
)

// Delivery outcomes, the values of dedupgw_deliveries_total's outcome label.
const (
	outcomeForwarded           = "forwarded"
	outcomeDuplicate           = "duplicate"
	outcomeInFlight            = "in_flight"
	outcomeUnkeyed             = "unkeyed"
	outcomeRejectedSignature   = "rejected_signature"
	outcomeRejectedBody        = "rejected_body"
	outcomeRejectedKey         = "rejected_key"
	outcomeRejectedFingerprint = "rejected_fingerprint"
	outcomeStoreError          = "store_error"
)

// outcomeRejectedMethod is the delivery log's outcome for a method the route
// does not accept (405). It is not a delivery, so it is not counted.
const outcomeRejectedMethod = "rejected_method"

// outcomeOtherMethod is the delivery log's outcome for a method the route
// passes through (on_other_method: forward). It is not a delivery either.
const outcomeOtherMethod = "other_method"

var outcomes = []string{
	outcomeForwarded, outcomeDuplicate, outcomeInFlight, outcomeUnkeyed,
	outcomeRejectedSignature, outcomeRejectedBody, outcomeRejectedKey,
	outcomeRejectedFingerprint, outcomeStoreError,
}

// Release reasons, the values of dedupgw_releases_total's reason label.
const (
	reasonUpstreamStatus = "upstream_status"
	reasonUpstreamError  = "upstream_error"
	reasonTimeout        = "timeout"
	reasonShutdown       = "shutdown"
)

var reasons = []string{reasonUpstreamStatus, reasonUpstreamError, reasonTimeout, reasonShutdown}

// Code classes of dedupgw_upstream_duration_seconds; "error" when the upstream
// never answered.
var codeClasses = []string{"2xx", "3xx", "4xx", "5xx", "error"}

// Store operations, the values of the op label of the store metrics.
const (
	opClaim   = "claim"
	opCommit  = "commit"
	opRelease = "release"
	opGet     = "get"
	opForget  = "forget"
	opList    = "list"
	opPing    = "ping"
)

var storeOps = []string{opClaim, opCommit, opRelease, opGet, opForget, opList, opPing}

// storeOp indexes storeOps, so an operation's series are found without a
// label lookup.
type storeOp int

const (
	storeOpClaim storeOp = iota
	storeOpCommit
	storeOpRelease
	storeOpGet
	storeOpForget
	storeOpList
	storeOpPing
	numStoreOps
)

// metrics holds every collector of one Gateway. It is registered on the
// Registerer the Gateway was given, never on the default registry.
type metrics struct {
	deliveries     *prometheus.CounterVec
	upstream       *prometheus.HistogramVec
	storeDuration  *prometheus.HistogramVec
	storeErrors    *prometheus.CounterVec
	releases       *prometheus.CounterVec
	buildInfo      *prometheus.GaugeVec
	inFlight       *prometheus.GaugeVec
	bodyBytes      *prometheus.HistogramVec
	reloads        *prometheus.CounterVec
	replayTooLarge *prometheus.CounterVec
	leasesLost     *prometheus.CounterVec
	takeovers      *prometheus.CounterVec
	bodyDiffers    *prometheus.CounterVec
	unrouted       *prometheus.CounterVec
	storeUp        *prometheus.GaugeVec
}

// Reasons of dedupgw_unrouted_requests_total.
const (
	unroutedNoRoute     = "no_route"
	unroutedInvalidPath = "invalid_path"
)

// newMetrics creates and registers the gateway's collectors on reg. It panics,
// as promauto does, when reg already holds collectors of the same names.
func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	return &metrics{
		deliveries: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dedupgw",
			Name:      "deliveries_total",
			Help:      "Deliveries received on a route, by what the gateway did with them.",
		}, []string{"route", "outcome"}),
		upstream: f.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "dedupgw",
			Name:      "upstream_duration_seconds",
			Help:      "Time from forwarding a delivery to the upstream's response headers, by status class (error: no answer).",
			Buckets:   []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"route", "code_class"}),
		storeDuration: f.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "dedupgw",
			Name:      "store_operation_duration_seconds",
			Help:      "Duration of dedup store operations.",
			Buckets:   prometheus.ExponentialBuckets(0.0001, 2.5, 12),
		}, []string{"backend", "op"}),
		storeErrors: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dedupgw",
			Name:      "store_errors_total",
			Help:      "Dedup store operations that failed (not found and lost leases are not errors).",
		}, []string{"backend", "op"}),
		releases: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dedupgw",
			Name:      "releases_total",
			Help:      "Claims released to failed (claimable) after a forward that did not succeed, by reason.",
		}, []string{"route", "reason"}),
		buildInfo: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "dedupgw",
			Name:      "build_info",
			Help:      "Always 1; labelled with the dedupgw version and the Go version that built it.",
		}, []string{"version", "goversion"}),
		inFlight: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "dedupgw",
			Name:      "in_flight",
			Help:      "Deliveries this process is forwarding to the upstream right now.",
		}, []string{"route"}),
		bodyBytes: f.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "dedupgw",
			Name:      "body_bytes",
			Help:      "Size of accepted delivery bodies.",
			Buckets:   prometheus.ExponentialBuckets(256, 4, 9), // 256 B .. 16 MiB
		}, []string{"route"}),
		reloads: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dedupgw",
			Name:      "config_reloads_total",
			Help:      "Route configuration reloads, by result (success, failure).",
		}, []string{"result"}),
		replayTooLarge: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dedupgw",
			Name:      "replay_too_large_total",
			Help:      "Successful responses on duplicate_response: replay routes too large to store; their duplicates are acked instead.",
		}, []string{"route"}),
		leasesLost: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dedupgw",
			Name:      "leases_lost_total",
			Help:      "Forwards whose claim was gone when they settled it (op commit: the event was processed but is not recorded, so its next copy is forwarded again): the lease lapsed and another delivery took the key, an operator forgot it, or the store lost it in a failover.",
		}, []string{"route", "op"}),
		takeovers: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dedupgw",
			Name:      "lease_takeovers_total",
			Help:      "Claims that took a key over from a lapsed lease: an earlier attempt held it and ended unseen (its gateway crashed or hung, or its commit or release never landed), so the application may have processed it; the key is marked maybe_processed until an attempt of it gets a 2xx. A bolt store loses its leases with its process, so a claim after a restart is not counted.",
		}, []string{"route"}),
		bodyDiffers: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dedupgw",
			Name:      "duplicate_body_differs_total",
			Help:      "Duplicates whose body differs from the one the key's first delivery forwarded. Providers resend an event unchanged (or nearly: one that re-serialises it may change a count inside), so a steady rate means the route's key names something other than the event, such as an object's ID, and events were acknowledged as duplicates without reaching the application.",
		}, []string{"route"}),
		storeUp: f.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "dedupgw",
			Name:      "store_up",
			Help:      "1 when the dedup store answered its last ping, 0 when it failed. dedupgw serve pings it every 10s, traffic or not, and on each /readyz.",
		}, []string{"backend"}),
		unrouted: f.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dedupgw",
			Name:      "unrouted_requests_total",
			Help:      "Requests on the webhook listener that reached no route, by reason (no_route: 404, no route for the path; invalid_path: 400, a path not in canonical form or ambiguous between routes). A provider sending to a misspelt URL shows here.",
		}, []string{"reason"}),
	}
}

// init sets build info and creates the fixed-label series so they read 0
// before the first event.
func (m *metrics) init(version, backend string) {
	if version == "" {
		version = "unknown"
	}
	m.buildInfo.WithLabelValues(version, runtime.Version()).Set(1)
	for _, op := range storeOps {
		m.storeDuration.WithLabelValues(backend, op)
		m.storeErrors.WithLabelValues(backend, op)
	}
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	m.unrouted.WithLabelValues(unroutedNoRoute)
	m.unrouted.WithLabelValues(unroutedInvalidPath)
}

// deleteRoute removes every series of the route named name, for a route a
// reload removed. Deliveries of that route still running keep their
// resolved series and count into them, unexported: a deleted series is not
// recreated by its holders.
func (m *metrics) deleteRoute(name string) {
	l := prometheus.Labels{"route": name}
	m.deliveries.DeletePartialMatch(l)
	m.upstream.DeletePartialMatch(l)
	m.releases.DeletePartialMatch(l)
	m.inFlight.DeletePartialMatch(l)
	m.bodyBytes.DeletePartialMatch(l)
	m.replayTooLarge.DeletePartialMatch(l)
	m.leasesLost.DeletePartialMatch(l)
	m.takeovers.DeletePartialMatch(l)
	m.bodyDiffers.DeletePartialMatch(l)
}

// routeMetrics are one route's series, resolved when the route is built (New,
// Reload) so a delivery does not look them up by label values: the maps and
// slices are only read afterwards.
type routeMetrics struct {
	name string
	m    *metrics // for a label value missing from the maps below

	deliveries     map[string]prometheus.Counter // by outcome
	upstream       []prometheus.Observer         // by codeClassIndex
	releases       map[string]prometheus.Counter // by reason
	inFlight       prometheus.Gauge
	bodyBytes      prometheus.Observer
	replayTooLarge prometheus.Counter
	// lostCommit and lostRelease count dedupgw_leases_lost_total.
	lostCommit, lostRelease prometheus.Counter
	takeovers               prometheus.Counter
	bodyDiffers             prometheus.Counter
}

// initRoute creates every series of the route named name so it exists at 0,
// and returns them.
func (m *metrics) initRoute(name string) *routeMetrics {
	rm := &routeMetrics{
		name:           name,
		m:              m,
		deliveries:     make(map[string]prometheus.Counter, len(outcomes)),
		upstream:       make([]prometheus.Observer, len(codeClasses)),
		releases:       make(map[string]prometheus.Counter, len(reasons)),
		inFlight:       m.inFlight.WithLabelValues(name),
		bodyBytes:      m.bodyBytes.WithLabelValues(name),
		replayTooLarge: m.replayTooLarge.WithLabelValues(name),
		lostCommit:     m.leasesLost.WithLabelValues(name, opCommit),
		lostRelease:    m.leasesLost.WithLabelValues(name, opRelease),
		takeovers:      m.takeovers.WithLabelValues(name),
		bodyDiffers:    m.bodyDiffers.WithLabelValues(name),
	}
	for _, o := range outcomes {
		rm.deliveries[o] = m.deliveries.WithLabelValues(name, o)
	}
	for i, c := range codeClasses {
		rm.upstream[i] = m.upstream.WithLabelValues(name, c)
	}
	for _, r := range reasons {
		rm.releases[r] = m.releases.WithLabelValues(name, r)
	}
	return rm
}

// delivery counts one delivery with outcome o (one of outcomes).
func (rm *routeMetrics) delivery(o string) {
	c, ok := rm.deliveries[o]
	if !ok {
		c = rm.m.deliveries.WithLabelValues(rm.name, o)
	}
	c.Inc()
}

// release counts one release with reason r (one of reasons).
func (rm *routeMetrics) release(r string) {
	c, ok := rm.releases[r]
	if !ok {
		c = rm.m.releases.WithLabelValues(rm.name, r)
	}
	c.Inc()
}

// codeClass maps an HTTP status to the code_class label.
func codeClass(status int) string { return codeClasses[codeClassIndex(status)] }

// codeClassIndex maps an HTTP status to its code_class's index in codeClasses.
func codeClassIndex(status int) int {
	switch {
	case status >= 200 && status < 300:
		return 0
	case status >= 300 && status < 400:
		return 1
	case status >= 400 && status < 500:
		return 2
	case status >= 500 && status < 600:
		return 3
	}
	return codeClassError
}

// codeClassError is the index of "error" in codeClasses: no answer.
const codeClassError = 4

// instrumentedStore wraps a dedup.Store and records the duration and errors of
// every operation. ErrNotFound, ErrNotOwner and ErrKept are answers, not
// errors, and ErrBadCursor is the caller's.
type instrumentedStore struct {
	next dedup.Store
	// Each operation's series, indexed by storeOp.
	durations [numStoreOps]prometheus.Observer
	errors    [numStoreOps]prometheus.Counter
}

var _ dedup.Store = (*instrumentedStore)(nil)

// newInstrumentedStore wraps next, recording into m's store series of
// backend (which m.init created).
func newInstrumentedStore(next dedup.Store, m *metrics, backend string) *instrumentedStore {
	s := &instrumentedStore{next: next}
	for i, op := range storeOps {
		s.durations[i] = m.storeDuration.WithLabelValues(backend, op)
		s.errors[i] = m.storeErrors.WithLabelValues(backend, op)
	}
	return s
}

func (s *instrumentedStore) observe(op storeOp, start time.Time, err error) {
	s.durations[op].Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, dedup.ErrNotFound) && !errors.Is(err, dedup.ErrNotOwner) && !errors.Is(err, dedup.ErrKept) && !errors.Is(err, dedup.ErrBadCursor) {
		s.errors[op].Inc()
	}
}

// Claim implements dedup.Store.
func (s *instrumentedStore) Claim(ctx context.Context, key dedup.Key, opts dedup.ClaimOptions) (dedup.ClaimResult, error) {
	start := time.Now()
	res, err := s.next.Claim(ctx, key, opts)
	s.observe(storeOpClaim, start, err)
	return res, err
}

// Commit implements dedup.Store.
func (s *instrumentedStore) Commit(ctx context.Context, key dedup.Key, token string, opts dedup.CommitOptions) error {
	start := time.Now()
	err := s.next.Commit(ctx, key, token, opts)
	s.observe(storeOpCommit, start, err)
	return err
}

// Release implements dedup.Store.
func (s *instrumentedStore) Release(ctx context.Context, key dedup.Key, token string, opts dedup.ReleaseOptions) error {
	start := time.Now()
	err := s.next.Release(ctx, key, token, opts)
	s.observe(storeOpRelease, start, err)
	return err
}

// Get implements dedup.Store.
func (s *instrumentedStore) Get(ctx context.Context, key dedup.Key) (dedup.Record, error) {
	start := time.Now()
	rec, err := s.next.Get(ctx, key)
	s.observe(storeOpGet, start, err)
	return rec, err
}

// Forget implements dedup.Store.
func (s *instrumentedStore) Forget(ctx context.Context, key dedup.Key, opts dedup.ForgetOptions) (dedup.Record, error) {
	start := time.Now()
	rec, err := s.next.Forget(ctx, key, opts)
	s.observe(storeOpForget, start, err)
	return rec, err
}

// List implements dedup.Store.
func (s *instrumentedStore) List(ctx context.Context, namespace string, opts dedup.ListOptions) (dedup.ListPage, error) {
	start := time.Now()
	page, err := s.next.List(ctx, namespace, opts)
	s.observe(storeOpList, start, err)
	return page, err
}

// Ping implements dedup.Store.
func (s *instrumentedStore) Ping(ctx context.Context) error {
	start := time.Now()
	err := s.next.Ping(ctx)
	s.observe(storeOpPing, start, err)
	return err
}

// pingUnlessCut pings the store as Ping does, but records nothing when
// stop ended meanwhile: a ping Close cut short is no answer of the store's,
// and no error of it either.
func (s *instrumentedStore) pingUnlessCut(ctx, stop context.Context) error {
	start := time.Now()
	err := s.next.Ping(ctx)
	if stop.Err() == nil {
		s.observe(storeOpPing, start, err)
	}
	return err
}

// Close implements dedup.Store by closing the wrapped store. The Gateway never
// calls it: the store belongs to the caller.
func (s *instrumentedStore) Close() error { return s.next.Close() }
