package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc/stat and /proc/PID/stat times:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// hostTimes are the machine's CPU time counters, all CPUs together, in
// USER_HZ ticks: the first line of /proc/stat. busy is user, nice, system,
// irq and softirq: neither idle, iowait nor steal.
type hostTimes struct {
	total, busy, steal int64
}

// parseHostCPU reads the aggregate "cpu" line of /proc/stat's content: user,
// nice, system, idle, iowait, irq, softirq and steal (guest time is already
// counted in user and nice). Kernels before 2.6.11 have no steal field.
func parseHostCPU(stat string) (hostTimes, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return hostTimes{}, fmt.Errorf("/proc/stat: first line %q is not the cpu totals", line)
	}
	var h hostTimes
	for i, s := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return hostTimes{}, fmt.Errorf("/proc/stat: cpu field %d: %w", i+1, err)
		}
		h.total += n
		switch i {
		case 3, 4: // idle, iowait
		case 7:
			h.steal = n
		default:
			h.busy += n
		}
	}
	return h, nil
}

// stealSince returns the share of the CPU time between b and h that the
// hypervisor gave to other guests (steal), or 0 when no time passed.
// A steal counter that went backwards (some hypervisors) reads as 0.
func (h hostTimes) stealSince(b hostTimes) float64 {
	if d := h.total - b.total; d > 0 {
		return min(max(float64(h.steal-b.steal)/float64(d), 0), 1)
	}
	return 0
}

// busySince returns the CPU time, all CPUs together, that the machine spent
// running anything (every process and the kernel) between b and h: neither
// idle nor stolen. It reports false when the counters went backwards.
func (h hostTimes) busySince(b hostTimes) (time.Duration, bool) {
	ticks := h.busy - b.busy
	if ticks < 0 {
		return 0, false
	}
	return time.Duration(ticks) * time.Second / clockTicks, true
}

// stealLog records the steal of each round: on a shared VM a round the
// hypervisor took a fifth of the CPU from measures the neighbours as much as
// the target, and interleaving pairs it off only in part.
type stealLog struct {
	rounds []stolenRound
}

// stolenRound is one round's steal share.
type stolenRound struct {
	round    int // from 1
	workload string
	target   string // label
	share    float64
}

// noisyShare is the steal above which a round is called out.
const noisyShare = 0.05

// add records one round.
func (l *stealLog) add(round int, workload, target string, share float64) {
	l.rounds = append(l.rounds, stolenRound{round: round, workload: workload, target: target, share: share})
}

// write writes one line on the run's steal, or nothing when no round
// measured it.
func (l *stealLog) write(w io.Writer) {
	if len(l.rounds) == 0 {
		return
	}
	var sum float64
	worst, noisy := l.rounds[0], 0
	for _, r := range l.rounds {
		sum += r.share
		if r.share > worst.share {
			worst = r
		}
		if r.share > noisyShare {
			noisy++
		}
	}
	fmt.Fprintf(w, "\nCPU steal (the hypervisor running other guests) while the targets were measured: %.1f%% on average, above %.0f%% for %d of %d (a target under a workload in a round)",
		100*sum/float64(len(l.rounds)), 100*noisyShare, noisy, len(l.rounds))
	if noisy > 0 {
		fmt.Fprintf(w, "; at most %.0f%%: %s, %s, round %d", 100*worst.share, worst.target, worst.workload, worst.round)
	}
	fmt.Fprintln(w, ".")
}
