package main

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// testEnv returns an env whose "runner executable" is this test binary (see
// TestMain), with its directory in t.TempDir().
func testEnv(t *testing.T) *env {
	t.Helper()
	return &env{dir: t.TempDir(), self: testBinary(t), concurrency: 4}
}

func testBinary(t *testing.T) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("find test binary: %v", err)
	}
	return self
}

func TestChildTargetsServeAndStop(t *testing.T) {
	ctx := context.Background()
	e := testEnv(t)
	up, upURL, err := startUpstream(ctx, e)
	if err != nil {
		t.Fatalf("start upstream: %v", err)
	}
	defer up.Stop()
	e.upstreamURL = upURL

	d := newDriver(e.concurrency, 5*time.Second, newIDSpace())
	defer d.Close()
	for _, name := range []string{TargetUpstream, TargetBare} {
		t.Run(name, func(t *testing.T) {
			tg, err := startTarget(ctx, e, name, up)
			if err != nil {
				t.Fatalf("start %s: %v", name, err)
			}
			before, err := d.upstreamCount(ctx, upURL)
			if err != nil {
				t.Fatal(err)
			}
			res, err := d.run(ctx, round{url: tg.url, workload: Unique, duration: 100 * time.Millisecond})
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			after, err := d.upstreamCount(ctx, upURL)
			if err != nil {
				t.Fatal(err)
			}
			if res.failures != 0 || res.requests == 0 {
				t.Errorf("got %d requests, %d failed (%s), want some and none failed", res.requests, res.failures, res.firstFailure)
			}
			if got := after - before; got != int64(res.sent) {
				t.Errorf("got %d deliveries at the upstream, want %d (all sent)", got, res.sent)
			}
			if cpu, ok := tg.cpu(); ok && cpu <= 0 {
				t.Errorf("got %s of CPU for %s after a round, want > 0", cpu, name)
			}
			tg.stop()
			for _, c := range tg.procs {
				if !c.exited() {
					t.Errorf("got %s running after stop, want it exited", c.name)
				}
			}
		})
	}
	up.Stop()
	if err := tcpReady(strings.TrimPrefix(upURL, "http://"))(ctx); err == nil {
		t.Errorf("got upstream still accepting after Stop, want it gone")
	}
}

func TestWaitReadyReportsAChildThatExits(t *testing.T) {
	e := testEnv(t)
	c, err := startChild(context.Background(), e.dir, "broken", nil, e.self, roleUpstream, "-listen", "not-an-address")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	err = waitReady(context.Background(), c, 10*time.Second, tcpReady("127.0.0.1:1"))
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") || !strings.Contains(err.Error(), "listen") {
		t.Errorf("got %v, want an error saying the child exited, with its log", err)
	}
}

func TestStartRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	ctx := context.Background()
	c, addr, err := startRedis(ctx, testEnv(t))
	if err != nil {
		t.Fatalf("start redis: %v", err)
	}
	if err := redisReady(addr)(ctx); err != nil {
		t.Errorf("got %v from PING, want PONG", err)
	}
	c.Stop()
	if !c.exited() {
		t.Errorf("got redis-server running after Stop, want it exited")
	}
}

func TestDedupgwTargetNeedsBinary(t *testing.T) {
	e := testEnv(t)
	if _, err := startTarget(context.Background(), e, TargetBolt, nil); err == nil || !strings.Contains(err.Error(), "no dedupgw binary") {
		t.Errorf("got %v, want an error about the missing binary", err)
	}
}

func TestCPUTime(t *testing.T) {
	got, err := cpuTime(os.Getpid())
	if err != nil {
		t.Skipf("cpu time not measurable here: %v", err)
	}
	if got < 0 {
		t.Errorf("got %s of CPU for this test binary, want >= 0", got)
	}
	if _, err := cpuTime(-1); err == nil {
		t.Errorf("got no error for pid -1, want one")
	}
}

// TestBareGOGCReachesTheBareProxy checks that -bare-gogc is the bare
// proxy's GOGC and that a GOGC or GOMEMLIMIT in the runner's environment
// reaches no target, read from the child's /proc environment.
func TestBareGOGCReachesTheBareProxy(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("no /proc")
	}
	t.Setenv("GOGC", "300")
	t.Setenv("GOMEMLIMIT", "1GiB")
	for _, tt := range []struct {
		bareGOGC string
		want     []string // the child's GOGC and GOMEMLIMIT entries
	}{
		{"", nil},
		{"1000", []string{"GOGC=1000"}},
	} {
		e := testEnv(t)
		e.bareGOGC = tt.bareGOGC
		e.upstreamURL = "http://127.0.0.1:1" // never reached: the test sends nothing
		tg, err := startTarget(context.Background(), e, TargetBare, nil)
		if err != nil {
			t.Fatalf("start bare: %v", err)
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(tg.procs[0].cmd.Process.Pid) + "/environ")
		tg.stop()
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for kv := range strings.SplitSeq(string(b), "\x00") {
			if strings.HasPrefix(kv, "GOGC=") || strings.HasPrefix(kv, "GOMEMLIMIT=") {
				got = append(got, kv)
			}
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("-bare-gogc %q with GOGC=300 GOMEMLIMIT=1GiB in the runner's environment: got %q in the bare proxy's, want %q", tt.bareGOGC, got, tt.want)
		}
	}
}

// TestStoreCPU checks a target reports its co-located store's CPU time
// only when it has one.
func TestStoreCPU(t *testing.T) {
	e := testEnv(t)
	up, _, err := startUpstream(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Stop()
	if _, ok := (&target{}).storeCPU(); ok {
		t.Errorf("a target without a store process: got store CPU measured, want not")
	}
	if d, ok := (&target{storeProc: up}).storeCPU(); !ok || d < 0 {
		t.Errorf("a target with a store process: got %s, %v; want a measurement", d, ok)
	}
}
