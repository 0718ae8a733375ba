package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseHostCPU(t *testing.T) {
	tests := []struct {
		name, stat string
		want       hostTimes
		wantErr    bool
	}{
		{"with steal and guest fields", "cpu  100 2 30 800 5 1 2 60 7 0\ncpu0 50 1 15 400 2 0 1 30 3 0\n", hostTimes{total: 1000, busy: 135, steal: 60}, false},
		{"no steal field", "cpu  100 0 30 870\n", hostTimes{total: 1000, busy: 130}, false},
		{"not the totals", "cpu0 1 2 3 4 5 6 7 8\n", hostTimes{}, true},
		{"too short", "cpu 1 2\n", hostTimes{}, true},
		{"not a number", "cpu 1 2 x 4 5 6 7 8\n", hostTimes{}, true},
		{"empty", "", hostTimes{}, true},
	}
	for _, tt := range tests {
		got, err := parseHostCPU(tt.stat)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("%s: got (%+v, %v), want (%+v, error %v)", tt.name, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestStealSince(t *testing.T) {
	before, after := hostTimes{total: 1000, steal: 10}, hostTimes{total: 1400, steal: 90}
	if got, want := after.stealSince(before), 0.2; got != want {
		t.Errorf("stealSince: got %v, want %v", got, want)
	}
	if got := before.stealSince(before); got != 0 {
		t.Errorf("stealSince with no time passed: got %v, want 0", got)
	}
	if got := (hostTimes{total: 1400, steal: 5}).stealSince(before); got != 0 {
		t.Errorf("stealSince with the counter gone backwards: got %v, want 0", got)
	}
}

func TestBusySince(t *testing.T) {
	before, _ := parseHostCPU("cpu  100 0 50 600 0 0 0 10\n")
	tests := []struct {
		name   string
		after  string
		want   time.Duration
		wantOK bool
	}{
		// 400 ticks passed: 100 idle or iowait, 80 stolen, 220 busy.
		{"busy, idle and stolen", "cpu  250 10 100 650 50 5 5 90\n", 2200 * time.Millisecond, true},
		{"no time passed", "cpu  100 0 50 600 0 0 0 10\n", 0, true},
		// The steal counter going backwards does not change busy time.
		{"steal gone backwards", "cpu  250 10 100 650 50 5 5 5\n", 2200 * time.Millisecond, true},
		{"busy gone backwards", "cpu  90 0 50 700 0 0 0 10\n", 0, false},
	}
	for _, tt := range tests {
		after, err := parseHostCPU(tt.after)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := after.busySince(before); got != tt.want || ok != tt.wantOK {
			t.Errorf("%s: got (%v, %v), want (%v, %v)", tt.name, got, ok, tt.want, tt.wantOK)
		}
	}
}

func TestStealLogWrite(t *testing.T) {
	var empty stealLog
	var b strings.Builder
	empty.write(&b)
	if b.Len() != 0 {
		t.Errorf("no rounds: got %q, want nothing", b.String())
	}

	var calm stealLog
	calm.add(1, "unique", "bare ReverseProxy", 0.01)
	calm.add(1, "unique", "dedupgw redis", 0.03)
	b.Reset()
	calm.write(&b)
	if want := "\nCPU steal (the hypervisor running other guests) while the targets were measured: 2.0% on average, above 5% for 0 of 2 (a target under a workload in a round).\n"; b.String() != want {
		t.Errorf("calm run: got %q, want %q", b.String(), want)
	}

	var noisy stealLog
	noisy.add(1, "unique", "bare ReverseProxy", 0.02)
	noisy.add(2, "unique", "dedupgw redis", 0.21)
	noisy.add(2, "mix", "dedupgw bolt", 0.07)
	b.Reset()
	noisy.write(&b)
	if want := "above 5% for 2 of 3 (a target under a workload in a round); at most 21%: dedupgw redis, unique, round 2.\n"; !strings.HasSuffix(b.String(), want) {
		t.Errorf("noisy run: got %q, want it to end in %q", b.String(), want)
	}
}
