package main

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPercentFor(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name          string
		floor, scaled uint64
		want          int
	}{
		{"nothing measured yet: the runtime's minimum goal is the floor", 64 * mib, 0, 1600},
		{"a tiny heap: capped so the minimum goal stays the floor", 64 * mib, 1 * mib, 1600},
		{"a small heap: the goal is floor past it", 64 * mib, 8 * mib, 800},
		{"rounded up, never short of the floor", 64 * mib, 7 * mib, 915},
		{"a heap the size of the floor: Go's default", 64 * mib, 64 * mib, 100},
		{"a heap past the floor: Go's default", 64 * mib, 512 * mib, 100},
		{"a floor below the runtime's minimum: Go's default", 1 * mib, 512 << 10, 100},
	}
	for _, tt := range tests {
		if got := percentFor(tt.floor, tt.scaled); got != tt.want {
			t.Errorf("%s: percentFor(%d, %d) = %d, want %d", tt.name, tt.floor, tt.scaled, got, tt.want)
		}
	}
}

func TestHeapFloor(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name     string
		env      map[string]string
		memLimit int64
		want     uint64
	}{
		{"GOGC and GOMEMLIMIT unset", nil, math.MaxInt64, defaultHeapFloor},
		{"GOGC empty, which the runtime reads as unset", map[string]string{"GOGC": ""}, math.MaxInt64, defaultHeapFloor},
		{"GOGC set: the operator chose", map[string]string{"GOGC": "200"}, math.MaxInt64, 0},
		{"GOGC=off", map[string]string{"GOGC": "off"}, math.MaxInt64, 0},
		{"the chart's GOMEMLIMIT for 256Mi: a quarter of it", nil, 241591910, 241591910 / 4},
		{"the sidecar example's GOMEMLIMIT for 128Mi", nil, 115 * mib, 115 * mib / 4},
		{"a large GOMEMLIMIT", nil, 4096 * mib, defaultHeapFloor},
		{"GOGC set and a small GOMEMLIMIT", map[string]string{"GOGC": "100"}, 100 * mib, 0},
	}
	for _, tt := range tests {
		lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
		if got := heapFloor(lookup, tt.memLimit); got != tt.want {
			t.Errorf("%s: got floor %d, want %d", tt.name, got, tt.want)
		}
	}
}

func TestGOGCUnreadable(t *testing.T) {
	for v, want := range map[string]bool{"": false, "off": false, "100": false, "-1": false, "2000": false, "20%": true, "fast": true, "1e3": true, "OFF": true} {
		if got := gogcUnreadable(v); got != want {
			t.Errorf("gogcUnreadable(%q): got %v, want %v", v, got, want)
		}
	}
}

// readGC returns the runtime's GOGC, heap goal and live heap.
func readGC() (percent, goal, live uint64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/heap/goal:bytes"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64()
}

// waitGC runs collections until ok accepts the runtime's GOGC, heap goal
// and live heap (the cleanup that tunes runs on its own goroutine after a
// collection), or fails after 10s.
func waitGC(t *testing.T, what string, ok func(percent, goal, live uint64) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC() // frees the sentinel; its cleanup tunes and arms the next
		percent, goal, live := readGC()
		if ok(percent, goal, live) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after collections for 10s, got GOGC %d, heap goal %d for live heap %d", what, percent, goal, live)
		}
		time.Sleep(10 * time.Millisecond) // let the cleanup goroutine run
	}
}

// TestGCFloorPacesTheCollector runs real collections and follows the live
// heap: nearly empty, the goal is the floor; with 24 MiB more live, GOGC
// falls so that the goal is the floor past it (each collection re-tunes);
// once that is garbage, back to the floor. After stop, GOGC is 100 and a
// late hook changes nothing.
func TestGCFloorPacesTheCollector(t *testing.T) {
	const floor = 48 << 20
	defer debug.SetGCPercent(debug.SetGCPercent(100)) // restore what the test binary had
	stop := startGCFloor(floor)
	defer stop()

	floorPastLive := func(goal, live uint64) bool {
		// percentFor rounds up: at most 1 % of the scaled memory more.
		return goal >= live+floor && goal <= live+floor+floor/16
	}
	waitGC(t, "nearly empty heap: want the goal at the floor", func(percent, goal, live uint64) bool {
		return live < 8<<20 && percent > 100 && goal >= floor && goal <= live+floor
	})
	ballast := make([][]byte, 24)
	for i := range ballast {
		ballast[i] = make([]byte, 1<<20)
	}
	waitGC(t, "24 MiB more live: want the goal the floor past it", func(percent, goal, live uint64) bool {
		return live > 24<<20 && percent < 400 && floorPastLive(goal, live)
	})
	runtime.KeepAlive(ballast)
	waitGC(t, "the 24 MiB garbage: want the goal back at the floor", func(percent, goal, live uint64) bool {
		return live < 8<<20 && goal >= floor && goal <= live+floor
	})

	stop()
	if percent, _, _ := readGC(); percent != 100 {
		t.Errorf("after stop: got GOGC %d, want 100", percent)
	}
	g := &gcFloor{floor: floor, stopped: true}
	g.tune() // a hook that runs after stop
	if percent, _, _ := readGC(); percent != 100 {
		t.Errorf("a hook run after stop: got GOGC %d, want 100", percent)
	}
}

// TestE2EHeapFloor checks serve paces its collector unless GOGC is set, by
// a floor a quarter of a small GOMEMLIMIT: go_gc_gogc_percent on /metrics
// shows the GOGC in force, and the start-up log the floor.
func TestE2EHeapFloor(t *testing.T) {
	tests := []struct {
		name   string
		env    []string
		floor  uint64 // 0: not paced
		gogc   int    // the GOGC in force when not paced
		warned bool   // an unreadable GOGC is warned about
	}{
		{"GOGC and GOMEMLIMIT unset (empty)", []string{"GOGC=", "GOMEMLIMIT="}, defaultHeapFloor, 0, false},
		{"GOMEMLIMIT 100MiB", []string{"GOGC=", "GOMEMLIMIT=100MiB"}, 25 << 20, 0, false},
		{"GOGC set", []string{"GOGC=150", "GOMEMLIMIT="}, 0, 150, false},
		{"GOGC unreadable", []string{"GOGC=fast", "GOMEMLIMIT="}, 0, 100, true}, // what the runtime makes of it
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t)
			g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", ""), tt.env...)
			got, err := strconv.Atoi(metricValue(t, g, "go_gc_gogc_percent"))
			if err != nil {
				t.Fatalf("go_gc_gogc_percent: %v", err)
			}
			if tt.floor > 0 && got <= 100 {
				t.Errorf("got GOGC %d, want more than 100 for the heap floor", got)
			}
			if tt.floor == 0 && got != tt.gogc {
				t.Errorf("got GOGC %d, want %d", got, tt.gogc)
			}
			if warned := strings.Contains(g.logs(), "GOGC is neither"); warned != tt.warned {
				t.Errorf("got the unreadable GOGC warned about %v, want %v", warned, tt.warned)
			}
			logged := strings.Contains(g.logs(), "paced for a heap floor")
			want := fmt.Sprintf(`"heap_floor_bytes":%d`, tt.floor)
			if logged != (tt.floor > 0) || (logged && !strings.Contains(g.logs(), want)) {
				t.Errorf("got the heap floor logged %v, want %v with %s", logged, tt.floor > 0, want)
			}
		})
	}
}
