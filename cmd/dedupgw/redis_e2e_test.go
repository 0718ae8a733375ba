package main

// Redis end-to-end tests: several real dedupgw processes (the binary built by
// TestMain) share real redis-servers that redistest starts on free loopback
// ports: a single node, a three-master Cluster and a Sentinel set-up. They
// check issue 3's process-level promises: one dedup view across replicas,
// readiness and on_store_error through an outage with no gateway restart,
// on_in_flight: wait across replicas, and a kill -9 that blocks a key for at
// most one lease. A machine without redis-server skips them (see redistest).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

// redisRoute is one route of a Redis-backed test configuration, keyed by the
// Idempotency-Key header.
type redisRoute struct {
	name, path string
	policy     string // extra route lines, each indented four spaces
}

// redisStore is the store.redis block of a test configuration.
type redisStore struct {
	addrs              []string
	cluster            bool
	masterName         string
	waitReplicas       int
	username, password string
	// the sentinels' own credentials
	sentinelUsername, sentinelPassword string
}

// redisConfig writes, in a new temporary directory, a configuration for
// gateways sharing the Redis deployment st, forwarding to upstreamURL, and
// returns its path. With no routes it has one route "orders" on
// /hooks/orders.
func redisConfig(t *testing.T, upstreamURL string, st redisStore, routes ...redisRoute) string {
	t.Helper()
	if len(routes) == 0 {
		routes = []redisRoute{{name: "orders", path: "/hooks/orders"}}
	}
	addrs := make([]string, len(st.addrs))
	for i, a := range st.addrs {
		addrs[i] = strconv.Quote(a)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `listen: "127.0.0.1:0"
admin:
  listen: "127.0.0.1:0"
log:
  level: info
store:
  backend: redis
  redis:
    addrs: [%s]
    cluster: %v
    master_name: %q
    wait_replicas: %d
    username: %q
    password: %q
    sentinel_username: %q
    sentinel_password: %q
routes:
`, strings.Join(addrs, ", "), st.cluster, st.masterName, st.waitReplicas, st.username, st.password, st.sentinelUsername, st.sentinelPassword)
	for _, r := range routes {
		fmt.Fprintf(&b, `  - name: %s
    path: %s
    upstream: %q
    provider: generic
    keys: ["header:Idempotency-Key"]
%s`, r.name, r.path, upstreamURL, r.policy)
	}
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startReplicas starts n gateways on the same configuration.
func startReplicas(t *testing.T, n int, cfg string) []*gateway {
	t.Helper()
	gws := make([]*gateway, n)
	for i := range gws {
		gws[i] = startGateway(t, cfg)
	}
	return gws
}

// deliverHeader is tryDeliver that also returns the answer's headers.
func deliverHeader(url, key, body string) (answer, http.Header, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{}, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, nil, err
	}
	return answer{status: resp.StatusCode, dedup: resp.Header.Get("Dedup-Status"), body: string(b)}, resp.Header, nil
}

// asyncDeliver delivers in a goroutine; the channel yields the result.
func asyncDeliver(url, key, body string) <-chan deliveryResult {
	ch := make(chan deliveryResult, 1)
	go func() {
		a, h, err := deliverHeader(url, key, body)
		ch <- deliveryResult{a, h, err}
	}()
	return ch
}

// deliveryResult is what asyncDeliver yields.
type deliveryResult struct {
	a   answer
	h   http.Header
	err error
}

// receive waits for ch, or fails the test after timeout.
func receive[T any](t *testing.T, ch <-chan T, timeout time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(timeout):
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
		var zero T
		return zero
	}
}

// readyStatus returns the status of the gateway's /readyz, or 0 when the
// admin listener did not answer.
func readyStatus(g *gateway) int {
	resp, err := client.Get(g.adminURL("/readyz"))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// sampleLine matches one sample of the Prometheus text format.
var (
	sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$`)
	labelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// metricSum returns the sum of the samples of metric name on the gateway's
// /metrics whose labels include every pair of labels, whatever their order.
func metricSum(t *testing.T, g *gateway, name string, labels map[string]string) float64 {
	t.Helper()
	resp, err := client.Get(g.adminURL("/metrics"))
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read /metrics: %v", err)
	}
	sum := 0.0
	for line := range strings.SplitSeq(string(b), "\n") {
		m := sampleLine.FindStringSubmatch(line)
		if m == nil || m[1] != name {
			continue
		}
		have := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			have[p[1]] = p[2]
		}
		match := true
		for k, v := range labels {
			if have[k] != v {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// ownRedis reports why the server answering on s's port is not s's own
// redis-server process (its working directory is not s.Dir()), or "" when it
// is. redistest.Server.Start accepts a PONG from whatever answers on the
// port, so when another process took the port between redistest's free-port
// probe and the bind (or during a Stop), the test would silently share that
// process's Redis and see its restarts and flushes.
func ownRedis(s *redistest.Server) string {
	want, err := filepath.EvalSymlinks(s.Dir())
	if err != nil {
		return err.Error()
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	got, err := c.ConfigGet(context.Background(), "dir").Result()
	if err != nil {
		return fmt.Sprintf("CONFIG GET dir on %s: %v", s.Addr(), err)
	}
	if got["dir"] != want {
		return fmt.Sprintf("%s is served from %q, want %q: another process's redis-server holds the port", s.Addr(), got["dir"], want)
	}
	return ""
}

// mustOwnRedis fails the test unless every server is its own process.
func mustOwnRedis(t *testing.T, servers ...*redistest.Server) {
	t.Helper()
	for _, s := range servers {
		if why := ownRedis(s); why != "" {
			t.Fatal(why)
		}
	}
}

// startRedis starts a single redis-server (redistest.Start), moving to
// another port when the chosen one turned out to be served by another
// process.
func startRedis(t *testing.T) *redistest.Server {
	t.Helper()
	for range 3 {
		s := redistest.Start(t)
		why := ownRedis(s)
		if why == "" {
			return s
		}
		t.Logf("trying another port: %s", why)
	}
	t.Fatal("no port of our own for redis-server after 3 tries")
	return nil
}

// holdingUpstream is an upstream whose first delivery of a key in holds
// reports its arrival and then waits for the status to answer with.
// Everything else gets 200.
type holdingUpstream struct {
	*upstream
	holds map[string]*hold // by Dedup-Key; fixed before the first delivery
}

// hold is one held first delivery.
type hold struct {
	arrived chan struct{} // closed when the first delivery reached the upstream
	release chan int      // receives the status to answer it with
}

// newHoldingUpstream starts an upstream holding the first delivery of each
// of dedupKeys ("route:key"). A held delivery ends when released, when its
// sender hangs up, or when the test ends.
func newHoldingUpstream(t *testing.T, dedupKeys ...string) *holdingUpstream {
	t.Helper()
	u := &holdingUpstream{upstream: newUpstream(t), holds: map[string]*hold{}}
	for _, k := range dedupKeys {
		u.holds[k] = &hold{arrived: make(chan struct{}), release: make(chan int, 1)}
	}
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) }) // runs before the upstream's Close
	u.setHandler(func(w http.ResponseWriter, r *http.Request, n int) {
		if h := u.holds[r.Header.Get("Dedup-Key")]; h != nil && n == 1 {
			close(h.arrived)
			select {
			case status := <-h.release:
				w.WriteHeader(status)
				_, _ = fmt.Fprintf(w, "first attempt: %d", status)
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	return u
}

// TestRedisReplicasForwardOnce sends 30 concurrent copies of each of several
// events spread over three gateways sharing one Redis: each event reaches
// the upstream exactly once. Redis's script cache is flushed between two
// events (a NOSCRIPT fallback must not break anything).
func TestRedisReplicasForwardOnce(t *testing.T) {
	srv := startRedis(t)
	u := newUpstream(t)
	gws := startReplicas(t, 3, redisConfig(t, u.URL, redisStore{addrs: []string{srv.Addr()}}))

	const events, copies = 5, 30
	for e := range events {
		key := fmt.Sprintf("evt_%d", e)
		if e == 2 {
			if err := srv.Client().ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatalf("SCRIPT FLUSH: %v", err)
			}
		}
		answers := make([]answer, copies)
		errs := make([]error, copies)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range copies {
			wg.Go(func() {
				<-start
				answers[i], errs[i] = tryDeliver(gws[i%len(gws)].url("/hooks/orders"), key, `{"id":"`+key+`"}`)
			})
		}
		close(start)
		wg.Wait()

		forwarded := 0
		for i, a := range answers {
			if errs[i] != nil {
				t.Errorf("%s copy %d: %v", key, i, errs[i])
				continue
			}
			switch {
			case a.status == 200 && a.dedup == "forwarded":
				forwarded++
			case a.status == 200 && a.dedup == "duplicate", a.status == 409 && a.dedup == "in-flight":
			default:
				t.Errorf("%s copy %d at replica %d: got %d %q (%s), want 200 forwarded/duplicate or 409 in-flight",
					key, i, i%len(gws), a.status, a.dedup, a.body)
			}
		}
		if forwarded != 1 {
			t.Errorf("%s: forwarded answers: got %d, want 1", key, forwarded)
		}
		wantHits(t, u, key, 1)
		// Every replica now answers the event as a duplicate.
		for i, g := range gws {
			wantAnswer(t, fmt.Sprintf("%s at replica %d afterwards", key, i), deliver(t, g.url("/hooks/orders"), key, "{}"), 200, "duplicate")
		}
	}
	if got, want := u.total.Load(), int64(events); got != want {
		t.Errorf("upstream deliveries in all: got %d, want %d", got, want)
	}
}

// TestRedisOutageAndRecovery stops Redis under a running gateway and starts
// it again on the same port: /readyz follows, on_store_error forward and
// reject answer as documented while it is down, and deduplication works
// again afterwards without a gateway restart.
func TestRedisOutageAndRecovery(t *testing.T) {
	srv := startRedis(t)
	u := newUpstream(t)
	cfg := redisConfig(t, u.URL, redisStore{addrs: []string{srv.Addr()}},
		redisRoute{name: "orders", path: "/hooks/orders", policy: "    on_store_error: forward\n"},
		redisRoute{name: "strict", path: "/hooks/strict", policy: "    on_store_error: reject\n"},
	)
	g := startGateway(t, cfg)
	orders, strict := g.url("/hooks/orders"), g.url("/hooks/strict")
	storeErrors := func() float64 {
		return metricSum(t, g, "dedupgw_deliveries_total", map[string]string{"route": "orders", "outcome": "store_error"})
	}

	if got := readyStatus(g); got != 200 {
		t.Fatalf("/readyz with Redis up: got %d, want 200", got)
	}
	wantAnswer(t, "before the outage", deliver(t, orders, "evt_before", "{}"), 200, "forwarded")
	wantAnswer(t, "duplicate before the outage", deliver(t, orders, "evt_before", "{}"), 200, "duplicate")

	srv.Stop()
	var last int
	eventually(t, 10*time.Second, func() bool { last = readyStatus(g); return last == 503 },
		func() string { return fmt.Sprintf("/readyz 503 while Redis is down; last %d", last) })

	// Fail open: forwarded, marked and counted.
	before := storeErrors()
	a := deliver(t, orders, "evt_down", "{}")
	wantAnswer(t, "on_store_error: forward while Redis is down", a, 200, "store-error")
	if a.body != `{"ok":true}` {
		t.Errorf("fail-open body: got %q, want the upstream's %q", a.body, `{"ok":true}`)
	}
	wantHits(t, u, "evt_down", 1)
	if got := storeErrors() - before; got != 1 {
		t.Errorf(`dedupgw_deliveries_total{route="orders",outcome="store_error"} increase: got %v, want 1`, got)
	}
	if got := metricSum(t, g, "dedupgw_store_errors_total", map[string]string{"backend": "redis", "op": "claim"}); got < 1 {
		t.Errorf(`dedupgw_store_errors_total{backend="redis",op="claim"}: got %v, want at least 1`, got)
	}

	// Fail closed: 503 with Retry-After, nothing forwarded.
	upBefore := u.total.Load()
	rej, hdr, err := deliverHeader(strict, "evt_strict", "{}")
	if err != nil {
		t.Fatalf("deliver to the reject route: %v", err)
	}
	wantAnswer(t, "on_store_error: reject while Redis is down", rej, 503, "store-error")
	if ra := hdr.Get("Retry-After"); ra == "" {
		t.Errorf("Retry-After on the 503: got none, want a number of seconds")
	} else if n, err := strconv.Atoi(ra); err != nil || n <= 0 {
		t.Errorf("Retry-After on the 503: got %q, want a positive number of seconds", ra)
	}
	if got := u.total.Load() - upBefore; got != 0 {
		t.Errorf("upstream deliveries from the reject route while Redis is down: got %d, want 0", got)
	}
	if got := readyStatus(g); got != 503 {
		t.Errorf("/readyz still down: got %d, want 503", got)
	}

	srv.Start() // same port, empty (no persistence)
	mustOwnRedis(t, srv)
	eventually(t, 10*time.Second, func() bool { last = readyStatus(g); return last == 200 },
		func() string { return fmt.Sprintf("/readyz 200 once Redis is back; last %d", last) })

	errorsBefore := storeErrors()
	for _, r := range []struct{ name, url, key string }{
		{"orders", orders, "evt_after"},
		{"strict", strict, "evt_strict"}, // refused while down: this is its first forward
	} {
		wantAnswer(t, r.name+" after recovery", deliver(t, r.url, r.key, "{}"), 200, "forwarded")
		wantAnswer(t, r.name+" duplicate after recovery", deliver(t, r.url, r.key, "{}"), 200, "duplicate")
	}
	wantHits(t, u, "evt_after", 1)
	if got := u.count("strict:evt_strict"); got != 1 {
		t.Errorf("upstream deliveries of strict:evt_strict: got %d, want 1", got)
	}
	if got := storeErrors() - errorsBefore; got != 0 {
		t.Errorf("store_error deliveries after recovery: got %v, want 0", got)
	}
	select {
	case <-g.done:
		t.Errorf("gateway exited (code %d) during the outage, want it running throughout", g.exitCode)
	default:
	}
	// go-redis logs failed dials through its own process-wide logger; the
	// gateway routes it through zap so log collectors see JSON only.
	for _, line := range strings.Split(strings.TrimSpace(g.logs()), "\n") {
		if line != "" && !json.Valid([]byte(line)) {
			t.Errorf("gateway log line during the outage is not JSON: %q", line)
		}
	}
}

// TestRedisRefusesWrites runs a gateway against a Redis that answers but
// refuses writes (maxmemory reached, under noeviction): /readyz turns 503,
// a copy of an event Redis holds as processed is still answered as a
// duplicate, a new event fails open, and its fail-open record is kept
// (not given up as a bad key) until Redis takes writes again, then lands.
func TestRedisRefusesWrites(t *testing.T) {
	srv := startRedis(t)
	u := newUpstream(t)
	g := startGateway(t, redisConfig(t, u.URL, redisStore{addrs: []string{srv.Addr()}}))
	orders := g.url("/hooks/orders")
	ctx := context.Background()
	claimErrors := func() float64 {
		return metricSum(t, g, "dedupgw_store_errors_total", map[string]string{"backend": "redis", "op": "claim"})
	}

	wantAnswer(t, "before", deliver(t, orders, "evt_before", "{}"), 200, "forwarded")
	if err := srv.Client().ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	var last int
	eventually(t, 10*time.Second, func() bool { last = readyStatus(g); return last == 503 },
		func() string { return fmt.Sprintf("/readyz 503 while Redis refuses writes; last %d", last) })

	wantAnswer(t, "a copy of a processed event", deliver(t, orders, "evt_before", "{}"), 200, "duplicate")
	wantHits(t, u, "evt_before", 1)
	before := claimErrors()
	wantAnswer(t, "a new event", deliver(t, orders, "evt_new", "{}"), 200, "store-error")
	wantHits(t, u, "evt_new", 1)
	// The fail-open record's tries fail too; more than the three after
	// which a key failing while the store answered its ping was given up.
	var errs float64
	eventually(t, 20*time.Second, func() bool { errs = claimErrors() - before; return errs >= 5 },
		func() string {
			return fmt.Sprintf("claim errors: got %v, want the forward's and four record tries", errs)
		})

	if err := srv.Client().ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() bool { last = readyStatus(g); return last == 200 },
		func() string { return fmt.Sprintf("/readyz 200 once Redis takes writes; last %d", last) })
	var state string
	eventually(t, 20*time.Second, func() bool {
		resp, err := client.Get(g.adminURL("/v1/keys/orders/evt_new"))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var rec struct {
			State string `json:"state"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&rec)
		state = rec.State
		return state == "processed"
	}, func() string { return fmt.Sprintf("the fail-open forward recorded as processed; state %q", state) })
	wantAnswer(t, "the new event once recorded", deliver(t, orders, "evt_new", "{}"), 200, "duplicate")
	wantHits(t, u, "evt_new", 1)
	if logs := g.logs(); strings.Contains(logs, "fail-open forward not recorded") {
		t.Errorf("gateway log: got a fail-open forward given up, want it kept until Redis took writes:\n%s", logs)
	}
}

// TestRedisInFlightWaitAcrossReplicas holds the first delivery (at replica
// A) in the upstream while a duplicate waits at replica B (on_in_flight:
// wait): B answers only after A's attempt ended, as a duplicate when it
// succeeded and by forwarding it itself when it failed.
func TestRedisInFlightWaitAcrossReplicas(t *testing.T) {
	tests := []struct {
		name        string
		key         string
		firstStatus int
		wantB       answer // status and Dedup-Status of B's waiting duplicate
		wantHits    int
	}{
		{"first succeeds: duplicate", "evt_wait_ok", 200, answer{status: 200, dedup: "duplicate"}, 1},
		{"first fails: the waiter claims and is forwarded", "evt_wait_fail", 500, answer{status: 200, dedup: "forwarded"}, 2},
	}
	srv := startRedis(t)
	var keys []string
	for _, tt := range tests {
		keys = append(keys, "orders:"+tt.key)
	}
	u := newHoldingUpstream(t, keys...)
	gws := startReplicas(t, 2, redisConfig(t, u.URL, redisStore{addrs: []string{srv.Addr()}},
		redisRoute{name: "orders", path: "/hooks/orders", policy: "    on_in_flight: wait\n    lease: 20s\n    upstream_timeout: 15s\n"}))
	a, b := gws[0], gws[1]
	gets := func() float64 {
		return metricSum(t, b, "dedupgw_store_operation_duration_seconds_count", map[string]string{"backend": "redis", "op": "get"})
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := u.holds["orders:"+tt.key]
			first := asyncDeliver(a.url("/hooks/orders"), tt.key, "{}")
			receive(t, h.arrived, 15*time.Second, "the first delivery at the upstream")

			getsBefore := gets()
			dup := asyncDeliver(b.url("/hooks/orders"), tt.key, "{}")
			// B polls the store while it waits: its Get count rising shows
			// that it found the key in flight and is waiting.
			eventually(t, 15*time.Second, func() bool { return gets() > getsBefore },
				func() string { return "replica B to read the store while waiting" })
			select {
			case r := <-dup:
				t.Fatalf("replica B answered while the first attempt was in flight: %+v %v", r.a, r.err)
			default:
			}

			h.release <- tt.firstStatus
			r1 := receive(t, first, 15*time.Second, "replica A's answer")
			if r1.err != nil {
				t.Fatalf("first delivery: %v", r1.err)
			}
			wantAnswer(t, "first delivery at A", r1.a, tt.firstStatus, "forwarded")
			r2 := receive(t, dup, 15*time.Second, "replica B's answer")
			if r2.err != nil {
				t.Fatalf("waiting duplicate: %v", r2.err)
			}
			wantAnswer(t, "waiting duplicate at B", r2.a, tt.wantB.status, tt.wantB.dedup)
			wantHits(t, u.upstream, tt.key, tt.wantHits)
			wantAnswer(t, "later copy at A", deliver(t, a.url("/hooks/orders"), tt.key, "{}"), 200, "duplicate")
		})
	}
}

// TestRedisKill9BlocksKeyForOneLease kills a gateway with SIGKILL while the
// upstream holds its delivery: another replica answers retries 409 in-flight
// until the dead claim's lease ends, then forwards the next retry.
func TestRedisKill9BlocksKeyForOneLease(t *testing.T) {
	const (
		lease = 2 * time.Second
		key   = "evt_kill"
		// clockSlack covers the millisecond rounding of the stored lease.
		clockSlack = 50 * time.Millisecond
	)
	srv := startRedis(t)
	u := newHoldingUpstream(t, "orders:"+key)
	gws := startReplicas(t, 2, redisConfig(t, u.URL, redisStore{addrs: []string{srv.Addr()}},
		redisRoute{name: "orders", path: "/hooks/orders", policy: fmt.Sprintf("    lease: %v\n    upstream_timeout: 1s\n", lease)}))
	a, b := gws[0], gws[1]
	url := b.url("/hooks/orders")

	// Leases are wall-clock times (replicas on different hosts share only
	// the wall clock), so the bounds below are checked on wall-clock
	// readings; the monotonic clock only reports how far the two diverged.
	sent := time.Now() // the dead claim was taken after this
	first := asyncDeliver(a.url("/hooks/orders"), key, "{}")
	receive(t, u.holds["orders:"+key].arrived, 15*time.Second, "the first delivery at the upstream")
	a.kill()
	killed := time.Now()
	if r := receive(t, first, 15*time.Second, "the killed gateway's answer"); r.err == nil {
		t.Errorf("delivery to the killed gateway: got %d %q, want a connection error", r.a.status, r.a.dedup)
	}

	retry, hdr, err := deliverHeader(url, key, "{}")
	if err != nil {
		t.Fatalf("retry right after the kill: %v", err)
	}
	wantAnswer(t, "retry right after the kill", retry, 409, "in-flight")
	if hdr.Get("Retry-After") == "" {
		t.Errorf("Retry-After on the 409: got none, want one")
	}

	var (
		last            answer
		asked, answered time.Time // around the first forwarded retry
		lastInFlight    time.Time // when the last 409 was asked
		inFlight        int
	)
	eventually(t, lease+10*time.Second, func() bool {
		asked = time.Now()
		last = deliver(t, url, key, "{}")
		answered = time.Now()
		switch {
		case last.status == 409 && last.dedup == "in-flight":
			inFlight++
			lastInFlight = asked
			return false
		case last.status == 200 && last.dedup == "forwarded":
			return true
		}
		t.Fatalf("retry while the lease lasts: got %d %q (%s), want 409 in-flight or 200 forwarded", last.status, last.dedup, last.body)
		return false
	}, func() string { return fmt.Sprintf("a forwarded retry after the lease; last %+v", last) })

	// wallSince is b-a on the wall clock.
	wallSince := func(b, a time.Time) time.Duration { return b.Round(0).Sub(a.Round(0)) }
	t.Logf("kill %v after the send; first forwarded retry asked %v and answered %v after the kill (lease %v), after %d in-flight answers; wall clock minus monotonic over the test: %v",
		killed.Sub(sent), asked.Sub(killed), answered.Sub(killed), lease, inFlight, wallSince(answered, sent)-answered.Sub(sent))
	// The dead claim was taken after sent, so its lease ended after
	// sent+lease, and the forwarded retry's claim ran before its answer.
	if got := wallSince(answered, sent); got <= lease {
		t.Errorf("forwarded retry answered %v after the first delivery was sent, want after the %v lease", got, lease)
	}
	// The dead claim was taken before the kill, so its lease ended by
	// killed+lease: no retry asked after that may find the key in flight.
	// (Asked, not answered: a loaded machine only delays the answers.)
	if got := wallSince(lastInFlight, killed); inFlight > 0 && got > lease+clockSlack {
		t.Errorf("a retry asked %v after the kill got 409 in-flight, want none asked after the %v lease (+%v)", got, lease, clockSlack)
	}
	if inFlight == 0 {
		t.Errorf("in-flight answers before the lease ended: got 0, want some")
	}
	wantHits(t, u.upstream, key, 2) // the held one and the forwarded retry
	wantAnswer(t, "after the forwarded retry", deliver(t, url, key, "{}"), 200, "duplicate")
}

// TestRedisCluster spreads many events over the slots of a three-master
// Redis Cluster through one gateway and sends their duplicates through
// another: each reaches the upstream once.
func TestRedisCluster(t *testing.T) {
	const events, workers = 200, 8
	cl := redistest.StartCluster(t, 3)
	mustOwnRedis(t, cl.Nodes...)
	u := newUpstream(t)
	gws := startReplicas(t, 2, redisConfig(t, u.URL, redisStore{addrs: cl.Addrs()}))

	// run delivers every event to g with workers in parallel and checks
	// each answer.
	run := func(g *gateway, what string, status int, dedup string) {
		t.Helper()
		next := make(chan int)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := range next {
					key := fmt.Sprintf("evt_%03d", i)
					a, err := tryDeliver(g.url("/hooks/orders"), key, "{}")
					if err != nil {
						t.Errorf("%s %s: %v", what, key, err)
						continue
					}
					if a.status != status || a.dedup != dedup {
						t.Errorf("%s %s: got %d %q (%s), want %d %q", what, key, a.status, a.dedup, a.body, status, dedup)
					}
				}
			})
		}
		for i := range events {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	run(gws[0], "first delivery", 200, "forwarded")
	run(gws[1], "duplicate at the other replica", 200, "duplicate")
	for i := range events {
		wantHits(t, u, fmt.Sprintf("evt_%03d", i), 1)
	}

	// The keys are spread over every master.
	total := int64(0)
	for i, n := range cl.Nodes {
		size, err := n.Client().DBSize(context.Background()).Result()
		if err != nil {
			t.Fatalf("DBSIZE on node %d: %v", i, err)
		}
		if size == 0 {
			t.Errorf("keys on node %d (%s): got 0, want some (keys spread over slots)", i, n.Addr())
		}
		total += size
	}
	if total != events {
		t.Errorf("keys in the cluster: got %d, want %d", total, events)
	}
}

// TestRedisSentinel reaches the master through a Sentinel (master_name) and
// keeps deduplicating after the Sentinel fails over to the replica.
//
// Right after SENTINEL FAILOVER the gateway may write to the old master for a
// moment: go-redis switches on the sentinel's +switch-master message, and the
// old master accepts writes until the sentinel converts it into a replica
// (seconds later), which drops them. The test waits until the gateway writes
// to the new master and logs how many deliveries fell into that window.
//
// With wait_replicas: 1, no delivery forwarded in that window is lost: each
// one forwarded is on the new master, the others were refused (503) until
// the new master has a replica again.
// TestRedisSentinelCredentials: sentinel_username and sentinel_password
// reach a sentinel that requires them, from the configuration file on.
func TestRedisSentinelCredentials(t *testing.T) {
	st := redistest.StartSentinelWithUser(t, "gw", "s3ntinel-pw")
	u := newUpstream(t)
	g := startGateway(t, redisConfig(t, u.URL, redisStore{addrs: []string{st.Sentinel.Addr()}, masterName: st.MasterName,
		sentinelUsername: "gw", sentinelPassword: "s3ntinel-pw"}))
	url := g.url("/hooks/orders")
	wantAnswer(t, "first delivery", deliver(t, url, "evt_auth", "{}"), 200, "forwarded")
	wantAnswer(t, "duplicate", deliver(t, url, "evt_auth", "{}"), 200, "duplicate")
	wantHits(t, u, "evt_auth", 1)
}

func TestRedisSentinel(t *testing.T) {
	for _, wait := range []int{0, 1} {
		t.Run(fmt.Sprintf("wait_replicas %d", wait), func(t *testing.T) { testSentinelFailover(t, wait) })
	}
}

func testSentinelFailover(t *testing.T, waitReplicas int) {
	st := redistest.StartSentinel(t)
	mustOwnRedis(t, st.Master, st.Replica)
	u := newUpstream(t)
	g := startGateway(t, redisConfig(t, u.URL, redisStore{addrs: []string{st.Sentinel.Addr()}, masterName: st.MasterName, waitReplicas: waitReplicas},
		// Reject on store errors, so a delivery that meets the failover is
		// never forwarded without deduplication.
		redisRoute{name: "orders", path: "/hooks/orders", policy: "    on_store_error: reject\n"}))
	url := g.url("/hooks/orders")
	ctx := context.Background()
	oldMaster, newMaster := st.Master.Client(), st.Replica.Client()
	// exists reports whether c holds the record of key.
	exists := func(c *redis.Client, key string) bool {
		n, err := c.Exists(ctx, "dedupgw:orders:"+key).Result()
		return err == nil && n == 1
	}

	wantAnswer(t, "first delivery", deliver(t, url, "evt_s1", "{}"), 200, "forwarded")
	wantAnswer(t, "duplicate", deliver(t, url, "evt_s1", "{}"), 200, "duplicate")
	wantHits(t, u, "evt_s1", 1)
	if !exists(oldMaster, "evt_s1") {
		t.Fatalf("evt_s1 on the master: got none, want its record")
	}

	// Fail over once the record reached the replica.
	eventually(t, 10*time.Second, func() bool { return exists(newMaster, "evt_s1") },
		func() string { return "evt_s1 replicated" })
	failoverStart := time.Now()
	st.Failover()
	failedOver := time.Now()

	// Probe with new events until one is recorded on the new master.
	var (
		last      answer
		probes    []string
		forwarded []string
	)
	// With wait_replicas the new master takes claims only once it has a
	// replica again: the demoted master, after its full sync (about 15s).
	patience := 15 * time.Second
	if waitReplicas > 0 {
		patience = time.Minute
	}
	eventually(t, patience, func() bool {
		key := fmt.Sprintf("probe_%d", len(probes))
		probes = append(probes, key)
		last = deliver(t, url, key, "{}")
		switch {
		case last.status == 200 && last.dedup == "forwarded":
			forwarded = append(forwarded, key)
			return exists(newMaster, key)
		case last.status == 503 && last.dedup == "store-error":
			return false
		}
		t.Fatalf("%s during the failover: got %d %q (%s), want 200 forwarded or 503 store-error", key, last.status, last.dedup, last.body)
		return false
	}, func() string { return fmt.Sprintf("a delivery recorded on the new master; last %+v", last) })
	onOld := 0
	for _, p := range probes[:len(probes)-1] {
		if exists(oldMaster, p) {
			onOld++
		}
	}
	t.Logf("SENTINEL FAILOVER took %v; the gateway wrote to the new master %v later; %d of %d deliveries before were recorded on the demoted master",
		failedOver.Sub(failoverStart), time.Since(failedOver), onOld, len(probes)-1)
	lost := 0
	for _, p := range forwarded {
		if !exists(newMaster, p) {
			lost++
		}
	}
	t.Logf("%d of %d deliveries forwarded in the failover are not on the new master", lost, len(forwarded))
	if waitReplicas > 0 && lost > 0 {
		t.Errorf("with wait_replicas %d: got %d forwarded deliveries missing on the new master, want none", waitReplicas, lost)
	}

	wantAnswer(t, "new event after the failover", deliver(t, url, "evt_s2", "{}"), 200, "forwarded")
	wantAnswer(t, "its duplicate", deliver(t, url, "evt_s2", "{}"), 200, "duplicate")
	if !exists(newMaster, "evt_s2") {
		t.Errorf("evt_s2 on the new master: got none, want its record")
	}
	wantAnswer(t, "event from before the failover", deliver(t, url, "evt_s1", "{}"), 200, "duplicate")
	wantHits(t, u, "evt_s1", 1)
	wantHits(t, u, "evt_s2", 1)
}
