package main

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// childAttr makes the kernel kill a child when the runner dies, so an
// interrupted run leaves no server behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// cpuTime returns the user+system CPU time used so far by pid and all its
// descendants (nginx's workers), read from /proc.
func cpuTime(pid int) (time.Duration, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("read /proc: %w", err)
	}
	type stat struct{ ppid, ticks int }
	procs := map[int]stat{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// The command may hold spaces and parentheses: fields start after the last ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 13 {
			continue
		}
		// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
		ppid, _ := strconv.Atoi(f[1])
		ut, _ := strconv.Atoi(f[11])
		st, _ := strconv.Atoi(f[12])
		procs[p] = stat{ppid: ppid, ticks: ut + st}
	}
	if _, ok := procs[pid]; !ok {
		return 0, fmt.Errorf("process %d not found", pid)
	}
	// Sum pid's tree: repeat until no new descendant is found.
	tree := map[int]bool{pid: true}
	for grew := true; grew; {
		grew = false
		for p, s := range procs {
			if !tree[p] && tree[s.ppid] {
				tree[p], grew = true, true
			}
		}
	}
	ticks := 0
	for p := range tree {
		ticks += procs[p].ticks
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// hostCPU reads the machine's CPU time counters from /proc/stat.
func hostCPU() (hostTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return hostTimes{}, fmt.Errorf("read /proc/stat: %w", err)
	}
	return parseHostCPU(string(b))
}
