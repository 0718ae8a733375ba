package main

import (
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

func TestHeapFloorFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want uint64
	}{
		{"GOGC unset", nil, defaultHeapFloor},
		{"GOGC empty, which the runtime reads as unset", map[string]string{"GOGC": ""}, defaultHeapFloor},
		{"GOGC set: the operator chose", map[string]string{"GOGC": "200"}, 0},
		{"GOGC=off", map[string]string{"GOGC": "off"}, 0},
	}
	for _, tt := range tests {
		lookup := func(k string) (string, bool) { v, ok := tt.env[k]; return v, ok }
		if got := heapFloorFromEnv(lookup); got != tt.want {
			t.Errorf("%s: got floor %d, want %d", tt.name, got, tt.want)
		}
	}
}

// readGC returns the runtime's GOGC, heap goal and live heap.
func readGC() (percent, goal, live uint64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/heap/goal:bytes"}, {Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64(), s[2].Value.Uint64()
}

// TestGCFloorPacesTheCollector runs real collections: after one, the next
// heap goal is at least the floor (the test binary's live heap is far
// smaller), and at most the floor past the live heap; after stop, GOGC is
// back to 100 and a late hook changes nothing.
func TestGCFloorPacesTheCollector(t *testing.T) {
	const floor = 48 << 20
	defer debug.SetGCPercent(100)
	stop := startGCFloor(floor)
	defer stop()

	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC() // frees the sentinel; its cleanup tunes and arms the next
		percent, goal, live := readGC()
		if percent > 100 && goal >= floor && goal <= live+floor {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after collections for 10s: got GOGC %d, heap goal %d for live heap %d, want GOGC > 100 and a goal of at least %d, at most that past the live heap", percent, goal, live, floor)
		}
		time.Sleep(10 * time.Millisecond) // let the cleanup goroutine run
	}

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

// TestE2EHeapFloor checks serve paces its collector unless GOGC is set:
// go_gc_gogc_percent on /metrics shows the GOGC in force.
func TestE2EHeapFloor(t *testing.T) {
	tests := []struct {
		name, env string
		paced     bool
	}{
		{"GOGC unset (empty)", "GOGC=", true},
		{"GOGC set", "GOGC=150", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t)
			g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", ""), tt.env)
			got, err := strconv.Atoi(metricValue(t, g, "go_gc_gogc_percent"))
			if err != nil {
				t.Fatalf("go_gc_gogc_percent: %v", err)
			}
			if tt.paced && got <= 100 {
				t.Errorf("got GOGC %d, want more than 100 for the heap floor", got)
			}
			if !tt.paced && got != 150 {
				t.Errorf("got GOGC %d, want the environment's 150", got)
			}
			if logged := strings.Contains(g.logs(), "heap floor"); logged != tt.paced {
				t.Errorf("got the heap floor logged %v, want %v", logged, tt.paced)
			}
		})
	}
}
