package chaos

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Modes. The default (and -short) is the CI mode: a few hundred events per
// run, the whole package well under a minute. DEDUPGW_CHAOS=full runs
// thousands of events with repeated faults, bounded to about three minutes,
// against a gateway built with -race.
func fullMode() bool { return os.Getenv("DEDUPGW_CHAOS") == "full" }

var (
	buildOnce sync.Once
	binPath   string
	binErr    error
	binDir    string

	reportsMu sync.Mutex
	reports   []*Report
)

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	reportsMu.Lock()
	if len(reports) > 0 {
		var b strings.Builder
		_ = WriteTable(&b, reports...)
		if testing.Verbose() {
			fmt.Printf("\ndedupgw chaos summary (%s mode)\n%s", modeName(), b.String())
		}
		if p := os.Getenv("DEDUPGW_CHAOS_REPORT"); p != "" {
			_ = os.WriteFile(p, []byte(b.String()), 0o644)
		}
	}
	reportsMu.Unlock()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func modeName() string {
	if fullMode() {
		return "full"
	}
	return "short"
}

// gatewayBinary builds cmd/dedupgw once per test binary. It fails the test
// when the build fails: the suite exists to run the real binary.
func gatewayBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		wd, err := os.Getwd()
		if err != nil {
			binErr = err
			return
		}
		root, err := ModuleRoot(wd)
		if err != nil {
			binErr = err
			return
		}
		binDir, err = os.MkdirTemp("", "dedupgw-chaos-bin-")
		if err != nil {
			binErr = err
			return
		}
		race := fullMode() || os.Getenv("DEDUPGW_CHAOS_RACE") == "1"
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		binPath, binErr = Build(ctx, root, binDir, race)
	})
	if binErr != nil {
		t.Fatalf("build the gateway: %v", binErr)
	}
	return binPath
}

// runDir is a scratch directory for a run's configs, logs and data: under
// DEDUPGW_CHAOS_KEEP when set (kept for post-mortems), else t.TempDir().
func runDir(t *testing.T, name string) string {
	t.Helper()
	keep := os.Getenv("DEDUPGW_CHAOS_KEEP")
	if keep == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(keep, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(keep, name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: configs, logs and data kept in %s", name, dir)
	return dir
}

// shortParallel runs a subtest in parallel with its siblings in short mode,
// to keep CI fast; full mode runs them one at a time so figures are clean.
// Leak checks stay on the parent test, which ends after all of them.
func shortParallel(t *testing.T) {
	if !fullMode() {
		t.Parallel()
	}
}

// needRedis skips when redis-server is missing, unless CI requires it.
func needRedis(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("DEDUPGW_REQUIRE_REDIS") != "" {
			t.Fatalf("redis-server not found and DEDUPGW_REQUIRE_REDIS is set: %v", err)
		}
		t.Skipf("redis-server not found: %v", err)
	}
}

// countFDs counts the test process's open file descriptors.
func countFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count file descriptors: %v", err)
	}
	return len(ents)
}

// leakCheck records goroutines and descriptors now and checks at cleanup
// that the run gave every one back.
func leakCheck(t *testing.T) {
	t.Helper()
	// The runtime's network poller opens its descriptors on first use; open
	// them before counting.
	if ln, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		ln.Close()
	}
	before := countFDs(t)
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, ignore)
		// Every child was waited for and its log closed before its done
		// channel closed, so the count is final now.
		after := countFDs(t)
		if after > before {
			t.Errorf("got %d open file descriptors after the run, want at most %d (before)", after, before)
		}
	})
}

// runScenario runs s, logs its table and details, and records it for the
// package summary.
func runScenario(t *testing.T, s Scenario) *Report {
	t.Helper()
	buildStart := time.Now()
	s.Bin = gatewayBinary(t)
	t.Logf("gateway binary ready after %s", time.Since(buildStart).Round(time.Millisecond))
	s.Dir = runDir(t, s.Name)
	s.Logf = t.Logf
	if s.Sim.Seed == 0 {
		s.Sim.Seed = uint64(time.Now().UnixNano())
	}
	if s.App.Seed == 0 {
		s.App.Seed = s.Sim.Seed + 1
	}
	t.Logf("%s: seeds sim=%d app=%d", s.Name, s.Sim.Seed, s.App.Seed)
	ctx, cancel := context.WithTimeout(context.Background(), s.Deadline+2*time.Minute)
	defer cancel()
	runStart := time.Now()
	rep, err := s.Run(ctx)
	t.Logf("%s: Run returned after %s", s.Name, time.Since(runStart).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("run %s: %v (logs in %s)", s.Name, err, s.Dir)
	}
	var b strings.Builder
	_ = WriteTable(&b, rep)
	t.Logf("\n%s%s", b.String(), rep.Details())
	reportsMu.Lock()
	reports = append(reports, rep)
	reportsMu.Unlock()
	return rep
}

// checkInvariants asserts the product's promise on a finished run.
func checkInvariants(t *testing.T, rep *Report, faults bool) {
	t.Helper()
	if got := len(rep.Lost); got != 0 {
		t.Errorf("got %d events lost (never processed by the upstream), want 0: %s", got, head(rep.Lost, 10))
	}
	if got := rep.ByCause()[CauseUnexplained]; got != 0 {
		t.Errorf("got %d duplicates forwarded without a documented cause, want 0", got)
	}
	if got := rep.ByCause()[CauseLeaseOverrun]; got != 0 {
		msg := fmt.Sprintf("got %d duplicates forwarded because a commit came after its lease ended (the gateway logged each); DESIGN.md does not list this limit (see TestSlowCommitAfterLease)", got)
		if fullMode() {
			t.Error(msg)
		} else {
			// A loaded CI machine can stall a replica past the lease margin;
			// the deterministic test carries the finding.
			t.Log("FINDING (not failed in short mode): " + msg)
		}
	}
	if got := len(rep.Duplicates) - rep.ByCause()[CauseLeaseOverrun]; !faults && got != 0 {
		t.Errorf("got %d duplicates forwarded in a run without faults, want 0", got)
	}
	if got := len(rep.Stuck); got != 0 {
		t.Errorf("got %d keys still processing one lease after the last delivery, want 0: %s", got, head(rep.Stuck, 10))
	}
	for _, f := range rep.FaultErrors() {
		t.Errorf("fault did not go as planned: %s", f)
	}
	for _, tr := range rep.Trouble {
		t.Errorf("gateway trouble: %s", tr)
	}
	if got := rep.App.BadBody; got != 0 {
		t.Errorf("got %d requests whose body the gateway altered, want 0", got)
	}
	if got := rep.App.BadDedupKey; got != 0 {
		t.Errorf("got %d requests with a missing or wrong Dedup-Key header, want 0", got)
	}
	if got := rep.App.SlowCompleted; got != 0 {
		t.Errorf("got %d upstream answers slower than upstream_timeout that the gateway waited for, want 0", got)
	}
}

// upstreamFaults is the upstream's own misbehaviour in every run: 5% 5xx,
// 3% slower than upstream_timeout, 2% connection resets.
var upstreamFaults = AppConfig{FailRate: 0.05, SlowRate: 0.03, ResetRate: 0.02}

func traffic(events int, rate float64) SimConfig {
	return SimConfig{
		Events: events, Rate: rate,
		DuplicateRate: 0.10, BurstRate: 0.05, BurstSize: 5,
		DuplicateDelay: 500 * time.Millisecond,
		BackoffMin:     50 * time.Millisecond, BackoffMax: time.Second,
	}
}

func TestChaosNoFaults(t *testing.T) {
	leakCheck(t)
	events, rate := 100, 100.0
	if fullMode() {
		events, rate = 1000, 200
	}
	tests := []struct {
		name     string
		backend  string
		replicas int
	}{
		{"bolt", "bolt", 1},
		{"redis", "redis", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shortParallel(t)
			if tt.backend == "redis" {
				needRedis(t)
			}
			rep := runScenario(t, Scenario{
				Name: "nofault-" + tt.name, Backend: tt.backend, Replicas: tt.replicas,
				Sim: traffic(events, rate), App: upstreamFaults, Deadline: 30 * time.Second,
			})
			checkInvariants(t, rep, false)
		})
	}
}

// faultPlan spreads faults over the traffic: in short mode one of each, in
// full mode the cycle repeats every few seconds.
func faultPlan(backend string, replicas int, span time.Duration) []FaultSpec {
	var cycle []FaultSpec
	switch backend {
	case "bolt":
		cycle = []FaultSpec{{Kind: FaultKill}, {Kind: FaultTerm}}
	case "redis":
		cycle = []FaultSpec{
			{Kind: FaultKill, Replica: 0},
			{Kind: FaultRedisStop, For: time.Second},
			{Kind: FaultRedisSlow, For: time.Second, Delay: 200 * time.Millisecond},
			{Kind: FaultTerm, Replica: 1},
		}
	}
	var plan []FaultSpec
	step := span / time.Duration(len(cycle)+1)
	if fullMode() {
		step = 4 * time.Second
	}
	n := 0
	for at := step; at < span; at += step {
		f := cycle[n%len(cycle)]
		f.At = at
		if f.Kind == FaultKill || f.Kind == FaultTerm {
			f.Replica = (f.Replica + n/len(cycle)) % replicas
		}
		plan = append(plan, f)
		n++
	}
	return plan
}

func TestChaosFaults(t *testing.T) {
	leakCheck(t)
	events, rate := 200, 40.0
	deadline := 40 * time.Second
	if fullMode() {
		events, rate, deadline = 2000, 50, 90*time.Second
	}
	span := time.Duration(float64(events) / rate * float64(time.Second))
	tests := []struct {
		name     string
		backend  string
		replicas int
		lease    time.Duration // zero: the suite's 3 s
	}{
		{"bolt", "bolt", 1, 0},
		{"redis", "redis", 3, 0},
		// A lease long enough for Redis commits to take their fast path
		// (SET XX GET: more than redisstore's 15 s margin left at commit
		// time); with the suite's 3 s lease every commit runs commit.lua.
		{"redis-fast-commit", "redis", 3, 20 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shortParallel(t)
			if tt.backend == "redis" {
				needRedis(t)
			}
			rep := runScenario(t, Scenario{
				Name: "faults-" + tt.name, Backend: tt.backend, Replicas: tt.replicas, Lease: tt.lease,
				Sim: traffic(events, rate), App: upstreamFaults, Deadline: deadline + tt.lease,
				Faults: faultPlan(tt.backend, tt.replicas, span),
			})
			checkInvariants(t, rep, true)
			if got := len(rep.Faults); got == 0 {
				t.Errorf("got 0 faults injected, want some")
			}
		})
	}
}

// TestChaosVariants runs in full mode only: policies and faults beyond the
// default plan.
func TestChaosVariants(t *testing.T) {
	if !fullMode() {
		t.Skip("full mode only (DEDUPGW_CHAOS=full)")
	}
	needRedis(t)
	leakCheck(t)
	tests := []struct {
		name string
		s    Scenario
	}{
		{
			// Held duplicates (on_in_flight: wait) under the usual faults.
			name: "redis-wait",
			s: Scenario{
				Backend: "redis", Replicas: 3, OnInFlight: "wait",
				Sim: traffic(600, 60), App: upstreamFaults, Deadline: 60 * time.Second,
				Faults: faultPlan("redis", 3, 10*time.Second),
			},
		},
		{
			// Redis slower than the gateway's store timeouts and than the
			// lease: the gateway must fail open and say so, never lose.
			name: "redis-slower-than-lease",
			s: Scenario{
				Backend: "redis", Replicas: 2,
				Sim: traffic(300, 30), App: upstreamFaults, Deadline: 60 * time.Second,
				Faults: []FaultSpec{{At: 2 * time.Second, Kind: FaultRedisSlow, For: 4 * time.Second, Delay: 1200 * time.Millisecond}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.s.Name = tt.name
			rep := runScenario(t, tt.s)
			checkInvariants(t, rep, true)
		})
	}
}
