package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// FaultSpec schedules one fault relative to the start of the traffic.
type FaultSpec struct {
	At   time.Duration
	Kind FaultKind
	// Replica is the index of the replica to kill or terminate.
	Replica int
	// For is how long Redis stays stopped or slow. Zero means 1s.
	For time.Duration
	// Delay is the per-chunk delay of FaultRedisSlow. Zero means 200ms.
	Delay time.Duration
}

// Scenario is one bounded chaos run: the gateway replicas, their store, the
// upstream App, the simulated provider and the faults.
type Scenario struct {
	Name string
	// Backend is "bolt" (one replica) or "redis".
	Backend string
	// Replicas is the number of gateway replicas. Zero means 1. Bolt allows
	// only one: each bolt file is owned by one process.
	Replicas int
	// Bin is the dedupgw binary; Dir a scratch directory for configs, logs
	// and data.
	Bin, Dir string
	Sim      SimConfig
	App      AppConfig
	// Lease and UpstreamTimeout are the gateway's defaults. Zero means 3s
	// and 1s: a 2s margin for claim and commit, so a loaded machine does not
	// overrun leases.
	Lease, UpstreamTimeout time.Duration
	Faults                 []FaultSpec
	// Deadline bounds the traffic: deliveries still without a 2xx then are
	// given up (and their events may be lost). Zero means 60s.
	Deadline time.Duration
	// RedisOptions are extra YAML lines for store.redis, each indented by
	// four spaces ("    read_timeout: 3s").
	RedisOptions string
	// OnInFlight is the defaults' on_in_flight. Empty means reject.
	OnInFlight string
	// ExtraConfig is appended verbatim to each replica's YAML.
	ExtraConfig string
	// Logf, when set, receives progress lines.
	Logf func(format string, args ...any)
}

const routeName = "stripe"

// gatewayConfig renders one replica's YAML.
func (s *Scenario) gatewayConfig(addr, admin, store, upstream string) string {
	return fmt.Sprintf(`listen: %q
admin:
  listen: %q
log:
  level: info
  format: json
store:
%s
defaults:
  window: 1h
  lease: %s
  upstream_timeout: %s
  on_store_error: forward
  on_in_flight: %s
routes:
  - name: %s
    path: /webhooks/stripe
    upstream: %q
    provider: stripe
%s`, addr, admin, store, s.Lease, s.UpstreamTimeout, s.OnInFlight, routeName, upstream, s.ExtraConfig)
}

func (s *Scenario) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

// Run runs the scenario and returns its report. An error means the run could
// not be carried out (a part did not start); invariant violations are in the
// report for the caller to judge. Every process and goroutine Run starts has
// ended when it returns.
func (s *Scenario) Run(ctx context.Context) (*Report, error) {
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	if s.Lease == 0 {
		s.Lease = 3 * time.Second
	}
	if s.UpstreamTimeout == 0 {
		s.UpstreamTimeout = time.Second
	}
	if s.Deadline == 0 {
		s.Deadline = 60 * time.Second
	}
	if s.OnInFlight == "" {
		s.OnInFlight = "reject"
	}
	if s.Backend == "bolt" && s.Replicas != 1 {
		return nil, errors.New("bolt runs one replica: a bolt file is owned by one process")
	}
	if s.Sim.IDPrefix == "" {
		s.Sim.IDPrefix = "evt_" + strings.ReplaceAll(s.Name, "-", "_") + "_"
	}
	rep := &Report{Name: s.Name, Backend: s.Backend, Replicas: s.Replicas}
	started := time.Now()

	appCfg := s.App
	appCfg.Body = Body
	appCfg.Namespace = routeName
	if appCfg.SlowDelay == 0 {
		appCfg.SlowDelay = 3 * s.UpstreamTimeout
	}
	app := NewApp(appCfg)
	defer app.Close()

	var (
		redis *Redis
		proxy *DelayProxy
		store string
	)
	switch s.Backend {
	case "bolt":
		store = fmt.Sprintf("  backend: bolt\n  bolt:\n    path: %q", filepath.Join(s.Dir, "dedupgw.db"))
	case "redis":
		var err error
		redis, err = StartRedis(ctx, s.Dir)
		if err != nil {
			return nil, err
		}
		defer redis.Close()
		proxy, err = NewDelayProxy(redis.Addr)
		if err != nil {
			return nil, err
		}
		defer proxy.Close()
		store = fmt.Sprintf("  backend: redis\n  redis:\n    addrs: [%q]\n%s", proxy.Addr(), s.RedisOptions)
	default:
		return nil, fmt.Errorf("unknown backend %q", s.Backend)
	}

	gws := make([]*Gateway, s.Replicas)
	urls := make([]string, s.Replicas)
	for i := range gws {
		g, err := NewGateway(s.Bin, s.Dir, fmt.Sprintf("r%d", i), func(addr, admin string) string {
			return s.gatewayConfig(addr, admin, store, app.URL()+"/i"+IncarnationPlaceholder)
		})
		if err != nil {
			return nil, err
		}
		defer g.Close()
		if err := g.Start(ctx); err != nil {
			return nil, err
		}
		gws[i], urls[i] = g, g.URL()+"/webhooks/stripe"
	}
	base, haveGauges, err := ScrapeGauges(ctx, gws[0].AdminURL())
	if err != nil {
		return nil, err
	}
	// An attempt waits at most the upstream timeout plus a lease (on_in_flight
	// wait) plus the store's own timeouts.
	rr := NewRoundRobin(s.UpstreamTimeout+s.Lease+5*time.Second, urls...)
	defer rr.CloseIdleConnections()
	sim := NewSimulator(s.Sim, rr)

	runCtx, cancel := context.WithTimeout(ctx, s.Deadline)
	defer cancel()
	faultCtx, stopFaults := context.WithCancel(runCtx)
	var (
		faultsMu sync.Mutex
		faults   []Fault
		faultsWG sync.WaitGroup
	)
	trafficStart := time.Now()
	s.logf("%s: %d replica(s) up after %s", s.Name, len(gws), trafficStart.Sub(started).Round(time.Millisecond))
	faultsWG.Add(1)
	go func() {
		defer faultsWG.Done()
		for _, fs := range s.Faults {
			t := time.NewTimer(time.Until(trafficStart.Add(fs.At)))
			select {
			case <-faultCtx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			f := s.inject(faultCtx, fs, gws, redis, proxy)
			s.logf("%s: fault %s %s at +%s (%s) err=%v", s.Name, f.Kind, f.Replica,
				f.Start.Sub(trafficStart).Round(time.Millisecond), f.End.Sub(f.Start).Round(time.Millisecond), f.Err)
			faultsMu.Lock()
			faults = append(faults, f)
			faultsMu.Unlock()
		}
	}()

	events := sim.Run(runCtx)
	simEnd := time.Now()
	stopFaults()
	faultsWG.Wait()
	s.logf("%s: traffic over after %s", s.Name, simEnd.Sub(trafficStart).Round(time.Millisecond))

	// Bring everything back so the keys can be read, then wait one lease:
	// after that no key may still be processing.
	if proxy != nil {
		proxy.SetDelay(0)
	}
	if redis != nil {
		if err := redis.Start(ctx); err != nil {
			return nil, err
		}
	}
	for _, g := range gws {
		if err := g.Start(ctx); err != nil {
			return nil, err
		}
	}
	wait := time.NewTimer(time.Until(simEnd.Add(s.Lease + 500*time.Millisecond)))
	select {
	case <-ctx.Done():
		wait.Stop()
		return nil, ctx.Err()
	case <-wait.C:
	}
	states, err := readKeys(ctx, gws[0].AdminURL(), events)
	if err != nil {
		return nil, err
	}
	rep.KeyStates = map[string]int{}
	for _, ev := range events {
		st := states[ev.ID]
		rep.KeyStates[st.State]++
		if st.State == "processing" {
			rep.Stuck = append(rep.Stuck, ev.ID)
		}
	}

	// A clean shutdown of every replica is part of the contract too.
	s.logf("%s: keys read at +%s", s.Name, time.Since(trafficStart).Round(time.Millisecond))

	// With the provider's and the upstream's connections closed, every
	// replica must be back near the idle baseline of a fresh one.
	rr.CloseIdleConnections()
	app.CloseClientConnections()
	if haveGauges {
		// Connections to Redis are the pool's and legitimate: the proxy
		// relays every one of them, so it can tell how many there are.
		var redisConns, extraFDs int
		if proxy != nil {
			redisConns = proxy.Conns()
		}
		for _, g := range gws {
			end, _, err := settleGauges(ctx, g.AdminURL(), base, redisConns)
			if err != nil {
				return nil, err
			}
			rep.Gauges = append(rep.Gauges, fmt.Sprintf("%s goroutines %d→%d fds %d→%d", g.Name, base.Goroutines, end.Goroutines, base.OpenFDs, end.OpenFDs))
			if end.Goroutines > base.Goroutines+goroutineSlack {
				rep.Trouble = append(rep.Trouble, fmt.Sprintf("%s leaks goroutines: %d with no connection open, a fresh replica has %d",
					g.Name, end.Goroutines, base.Goroutines))
			}
			extraFDs += max(0, end.OpenFDs-base.OpenFDs-fdSlack)
		}
		rep.Gauges = append(rep.Gauges, fmt.Sprintf("redis pool connections %d", redisConns))
		if extraFDs > redisConns {
			rep.Trouble = append(rep.Trouble, fmt.Sprintf("replicas leak descriptors: %d open beyond a fresh replica's (plus %d slack each) with no connection open and %d to Redis",
				extraFDs, fdSlack, redisConns))
		}
	}
	for _, g := range gws {
		d, err := g.Term(15 * time.Second)
		if err != nil {
			rep.Trouble = append(rep.Trouble, fmt.Sprintf("final SIGTERM of %s: %v (after %s)", g.Name, err, d))
		}
		s.logf("%s: final SIGTERM of idle %s took %s", s.Name, g.Name, d.Round(time.Millisecond))
	}
	var logs []*GatewayLog
	for _, g := range gws {
		gl, err := ReadLogFile(g.Name, g.LogPath)
		if err != nil {
			return nil, err
		}
		logs = append(logs, gl)
		rep.Trouble = append(rep.Trouble, g.Unexpected()...)
	}
	rep.App = app.Stats()
	Analyze(rep, Analysis{
		Events:          events,
		Processed:       app.Processed(),
		Faults:          faults,
		Logs:            logs,
		UpstreamTimeout: s.UpstreamTimeout,
		Lease:           s.Lease,
	})
	rep.Faults = faults
	rep.Duration = time.Since(started)
	return rep, nil
}

// inject carries out one fault and returns what happened.
func (s *Scenario) inject(ctx context.Context, fs FaultSpec, gws []*Gateway, redis *Redis, proxy *DelayProxy) Fault {
	f := Fault{Kind: fs.Kind}
	hold := fs.For
	if hold == 0 {
		hold = time.Second
	}
	switch fs.Kind {
	case FaultKill, FaultTerm:
		g := gws[fs.Replica%len(gws)]
		f.Replica, f.Addr, f.Incarnation = g.Name, g.Addr, g.Incarnation()
		f.Start = time.Now()
		if fs.Kind == FaultKill {
			f.Err = g.Kill()
		} else {
			f.Drain, f.Err = g.Term(s.UpstreamTimeout + s.Lease + 10*time.Second)
		}
		if err := g.Start(context.WithoutCancel(ctx)); err != nil && f.Err == nil {
			f.Err = err
		}
	case FaultRedisStop:
		if redis == nil {
			f.Err = errors.New("no redis in this run")
			return f
		}
		f.Start = time.Now()
		f.Err = redis.Stop()
		sleepCtx(ctx, hold)
		if err := redis.Start(context.WithoutCancel(ctx)); err != nil && f.Err == nil {
			f.Err = err
		}
	case FaultRedisSlow:
		if proxy == nil {
			f.Err = errors.New("no redis in this run")
			return f
		}
		d := fs.Delay
		if d == 0 {
			d = 200 * time.Millisecond
		}
		f.Start = time.Now()
		proxy.SetDelay(d)
		sleepCtx(ctx, hold)
		proxy.SetDelay(0)
	}
	f.End = time.Now()
	return f
}

// sleepCtx holds a fault for d, or less when ctx ends. It paces the fault, it
// does not synchronise anything.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// readKeys reads every event's record from the admin API.
func readKeys(ctx context.Context, admin string, events []*Event) (map[string]KeyState, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	out := make(map[string]KeyState, len(events))
	for _, ev := range events {
		u := admin + "/v1/keys/" + routeName + "/" + url.PathEscape(ev.ID)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return nil, err
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, fmt.Errorf("read key %s: %w", ev.ID, err)
		}
		var rec struct {
			State      string    `json:"state"`
			LeaseUntil time.Time `json:"lease_until"`
		}
		switch resp.StatusCode {
		case http.StatusOK:
			err = json.NewDecoder(resp.Body).Decode(&rec)
		case http.StatusNotFound:
			rec.State = "absent"
		default:
			err = fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
		}
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("read key %s: %w", ev.ID, err)
		}
		out[ev.ID] = KeyState{State: rec.State, LeaseUntil: rec.LeaseUntil}
	}
	return out, nil
}
