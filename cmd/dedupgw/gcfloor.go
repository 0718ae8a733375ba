package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
)

// defaultHeapFloor is how far the heap may grow past what the last
// collection kept before the next one starts, unless GOGC is set or
// GOMEMLIMIT is small (see heapFloor).
//
// The gateway's live heap is small (4–5 MiB under load) and short-lived
// garbage is most of what it allocates: with Go's default GOGC=100 it
// collected some 18 times a second under load, and the collector, and the
// scavenger returning freed pages to the kernel only to fault them back in,
// cost CPU and tail latency. With this floor the benchmark's first
// deliveries cost 20–24 µs less CPU on bolt and 4–26 µs less on Redis
// (README, Performance).
const defaultHeapFloor = 64 << 20

// memLimitShare is the part of a GOMEMLIMIT the floor may take: the rest is
// the live heap, the runtime's own memory, and room to collect in before the
// limit forces collections that the floor meant to spare.
const memLimitShare = 4

// gcFloor paces the garbage collector by a fixed amount of new heap instead
// of by the live heap as GOGC=100 does: after every collection it sets GOGC
// so that the next heap goal is the live heap plus floor (floor itself while
// the heap is nearly empty, see percentFor), or twice the live heap once
// that is more. In a steady state the heap is so bounded by
// live + max(live, floor).
//
// The hook is a cleanup attached to an object that only the hook holds:
// each collection frees it, and the cleanup (run by the runtime's cleanup
// goroutine) tunes and attaches the next one. After stop, the last one
// armed runs once more and returns. The runtime runs cleanups once a
// cycle's sweeping is done, which a busy process defers: after a sudden
// rise of the live heap, a collection or two may still run at the previous
// GOGC, whose goal can reach 1 + GOGC/100 (at most 17 for the default
// floor) times the new live heap. GOMEMLIMIT, which the Helm chart sets, bounds
// that.
type gcFloor struct {
	floor uint64

	mu      sync.Mutex
	stopped bool
	samples []metrics.Sample
}

// gcSentinel is the object whose collection marks a finished cycle. It holds
// a pointer so that it is never placed in a tiny-allocator block, whose
// objects may outlive a cycle.
type gcSentinel struct{ _ *byte }

// heapFloor returns the floor serve uses, from the GOGC variable (lookup)
// and the runtime's memory limit (debug.SetMemoryLimit(-1): GOMEMLIMIT, or
// math.MaxInt64 when unset): 0 (no pacing) when GOGC is set, since the
// operator then chose the collector's pace (the runtime reads an empty GOGC
// as unset); else defaultHeapFloor, at most a quarter of the memory limit,
// so that a small container (the Helm chart sets GOMEMLIMIT from its
// memory limit) keeps room.
func heapFloor(lookup func(string) (string, bool), memLimit int64) uint64 {
	if v, _ := lookup("GOGC"); v != "" {
		return 0
	}
	return min(defaultHeapFloor, uint64(max(memLimit, 0))/memLimitShare)
}

// gogcUnreadable reports whether v, a GOGC that is set, is one the runtime
// reads as 100 without a word: neither "off" nor a whole number (GOGC=20%,
// GOGC=fast). serve warns about it, since the operator meant something else.
func gogcUnreadable(v string) bool {
	_, err := strconv.ParseInt(v, 10, 32)
	return v != "" && v != "off" && err != nil
}

// startGCFloor starts tuning GOGC for floor and returns the function that
// stops it and sets GOGC back to 100, the value of an unset GOGC, the only
// case serve starts it in. A floor of 0 tunes nothing.
func startGCFloor(floor uint64) (stop func()) {
	if floor == 0 {
		return func() {}
	}
	g := &gcFloor{floor: floor, samples: []metrics.Sample{
		{Name: "/gc/heap/live:bytes"},
		{Name: "/gc/scan/stack:bytes"},
		{Name: "/gc/scan/globals:bytes"},
	}}
	g.tune() // pace the start-up heap too, before the first collection
	return g.stop
}

// arm attaches the hook to a fresh sentinel, which the next cycle frees.
func (g *gcFloor) arm() {
	runtime.AddCleanup(&gcSentinel{}, func(g *gcFloor) { g.tune() }, g)
}

// tune runs after a collection (and once at start): it sets the GOGC that
// puts the next goal floor past the live heap (percentFor), and arms the
// next hook.
func (g *gcFloor) tune() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	percent := percentFor(g.floor, g.scaled())
	debug.SetGCPercent(percent)
	g.arm()
}

// scaled returns the memory GOGC scales, as the last cycle measured it: the
// heap goal is live + (live+stacks+globals)×GOGC/100.
func (g *gcFloor) scaled() uint64 {
	metrics.Read(g.samples)
	var sum uint64
	for _, s := range g.samples {
		if s.Value.Kind() == metrics.KindUint64 { // else unknown to this runtime: 0
			sum += s.Value.Uint64()
		}
	}
	return sum
}

// heapMinimum is the runtime's smallest heap goal at GOGC=100, which it
// scales by GOGC/100 (runtime/mgcpacer.go, defaultHeapMinimum; 512 KiB
// with GOEXPERIMENT=heapminimum512kib, which would only make the goal of a
// nearly empty heap smaller than floor).
const heapMinimum = 4 << 20

// percentFor returns the GOGC that puts the heap goal floor past the live
// heap, given the memory GOGC scales (scaled: live heap, stacks and
// globals), and never below 100, Go's default. It is at most
// floor/heapMinimum×100, so that the runtime's own minimum goal, scaled
// alike, stays within floor while the heap is still almost empty.
func percentFor(floor, scaled uint64) int {
	most := max(floor*100/heapMinimum, 100)
	if scaled == 0 {
		return int(most)
	}
	p := (floor*100 + scaled - 1) / scaled // round up: the goal is at least floor past live
	return int(min(max(p, 100), most))
}

// stop ends the tuning and sets GOGC back to 100. The hook armed last is
// dropped when its sentinel is collected.
func (g *gcFloor) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	g.stopped = true
	debug.SetGCPercent(100)
}
