package chaos

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseLog(t *testing.T) {
	in := strings.Join([]string{
		`{"chaos":"start","ts":"2026-11-30T10:00:00Z"}`,
		`{"level":"info","ts":1764496800.5,"logger":"proxy","msg":"delivery","route":"stripe","key":"evt_1","outcome":"forwarded","status":200}`,
		`{"level":"warn","ts":"2026-11-30T10:00:01.250Z","msg":"delivery","route":"stripe","key":"stripe:evt_2","outcome":"store_error"}`,
		`{"level":"dpanic","ts":1764496802,"msg":"odd"}`,
		`panic: runtime error: index out of range`,
		`WARNING: DATA RACE`,
		`some other noise`,
	}, "\n")
	gl, err := ParseLog("r0", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"lines", len(gl.Lines), 3},
		{"forwarded", gl.Outcomes["forwarded"], 1},
		{"store_error", gl.Outcomes["store_error"], 1},
		{"trouble", len(gl.Trouble), 4},
		{"non-JSON", gl.NonJSON, 3},
		{"float ts", gl.Lines[0].TS.UnixMilli(), int64(1764496800500)},
		{"string ts", gl.Lines[1].TS.UnixMilli(), time.Date(2026, 11, 30, 10, 0, 1, 250e6, time.UTC).UnixMilli()},
		{"key", keyID(gl.Lines[1].Key), "evt_2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestAnalyzeExplainsDuplicates(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	ms := time.Millisecond
	tests := []struct {
		name      string
		processed []Processing
		faults    []Fault
		answers   []string // Dedup-Status answers the provider saw
		attempts  []Attempt
		logs      []LogLine
		want      Cause
	}{
		{
			name:      "no fault",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(3 * time.Second), Via: "a"}},
			want:      CauseUnexplained,
		},
		{
			name:      "kill of the forwarding replica just after the 2xx",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(2 * time.Second), Via: "b"}},
			faults:    []Fault{{Kind: FaultKill, Replica: "r0", Addr: "a", Start: at(5 * ms), End: at(300 * ms)}},
			want:      CauseCrash,
		},
		{
			// On a loaded machine the application may process a request
			// the killed process forwarded well after the kill.
			name:      "kill of the forwarding process, processed 600 ms later",
			processed: []Processing{{At: at(600 * ms), Via: "a", Incarnation: 1}, {At: at(2 * time.Second), Via: "a", Incarnation: 2}},
			faults:    []Fault{{Kind: FaultKill, Replica: "r0", Addr: "a", Incarnation: 1, Start: at(0), End: at(300 * ms)}},
			want:      CauseCrash,
		},
		{
			name:      "processed by the restarted process just after the kill: not the crash",
			processed: []Processing{{At: at(50 * ms), Via: "a", Incarnation: 2}, {At: at(2 * time.Second), Via: "a", Incarnation: 2}},
			faults:    []Fault{{Kind: FaultKill, Replica: "r0", Addr: "a", Incarnation: 1, Start: at(0), End: at(300 * ms)}},
			want:      CauseUnexplained,
		},
		{
			name:      "kill after the sender was answered: the commit was done, the crash explains nothing",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(2 * time.Second), Via: "a"}},
			faults:    []Fault{{Kind: FaultKill, Replica: "r0", Addr: "a", Start: at(300 * ms), End: at(400 * ms)}},
			attempts:  []Attempt{{At: at(-10 * ms), Latency: 20 * ms, Answer: Answer{Status: 200, DedupStatus: "forwarded"}}},
			want:      CauseUnexplained,
		},
		{
			name:      "kill before the answer reached the sender",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(2 * time.Second), Via: "a"}},
			faults:    []Fault{{Kind: FaultKill, Replica: "r0", Addr: "a", Start: at(300 * ms), End: at(400 * ms)}},
			attempts:  []Attempt{{At: at(-10 * ms), Latency: 320 * ms, Answer: Answer{Err: io.ErrUnexpectedEOF}}},
			want:      CauseCrash,
		},
		{
			name:      "kill of another replica explains nothing",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(2 * time.Second), Via: "b"}},
			faults:    []Fault{{Kind: FaultKill, Replica: "r1", Addr: "b", Start: at(5 * ms), End: at(300 * ms)}},
			want:      CauseUnexplained,
		},
		{
			name:      "kill long after the 2xx explains nothing",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(8 * time.Second), Via: "a"}},
			faults:    []Fault{{Kind: FaultKill, Replica: "r0", Addr: "a", Start: at(5 * time.Second), End: at(5500 * ms)}},
			want:      CauseUnexplained,
		},
		{
			name:      "sigterm is not a documented cause",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(time.Second), Via: "a"}},
			faults:    []Fault{{Kind: FaultTerm, Replica: "r0", Addr: "a", Start: at(5 * ms), End: at(300 * ms)}},
			want:      CauseUnexplained,
		},
		{
			name:      "forwarded during a redis outage, store-error answered",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(1500 * ms), Via: "a"}},
			faults:    []Fault{{Kind: FaultRedisStop, Start: at(time.Second), End: at(2 * time.Second)}},
			answers:   []string{"forwarded", "store-error"},
			want:      CauseStoreDown,
		},
		{
			name:      "forwarded during a redis outage, store error only in the log",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(1500 * ms), Via: "a"}},
			faults:    []Fault{{Kind: FaultRedisStop, Start: at(time.Second), End: at(2 * time.Second)}},
			logs:      []LogLine{{Key: "stripe:evt_x", Level: "warn", Outcome: "store_error"}},
			want:      CauseStoreDown,
		},
		{
			name:      "no fault, but the gateway logged a lease that ended before the commit",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(2 * time.Second), Via: "a"}},
			logs:      []LogLine{{Key: "evt_x", Level: "warn", Msg: "lease lost before commit: the upstream processed the event"}},
			want:      CauseLeaseOverrun,
		},
		{
			name:      "the earlier copy was processed while its forward was cut (504)",
			processed: []Processing{{At: at(900 * ms), Via: "a"}, {At: at(1500 * ms), Via: "a"}},
			faults:    []Fault{{Kind: FaultRedisSlow, Start: at(0), End: at(4 * time.Second)}},
			attempts:  []Attempt{{At: at(0), Latency: 950 * ms, Answer: Answer{Status: 504, DedupStatus: "forwarded", Target: "http://a"}}},
			want:      CauseTimeoutCut,
		},
		{
			name:      "both processings inside the cut attempt: two forwards at once",
			processed: []Processing{{At: at(900 * ms), Via: "a"}, {At: at(920 * ms), Via: "b"}},
			attempts:  []Attempt{{At: at(0), Latency: 950 * ms, Answer: Answer{Status: 504, DedupStatus: "forwarded", Target: "http://a"}}},
			want:      CauseUnexplained,
		},
		{
			name:      "the earlier processing came through another replica than the cut copy",
			processed: []Processing{{At: at(900 * ms), Via: "b"}, {At: at(1500 * ms), Via: "a"}},
			attempts:  []Attempt{{At: at(0), Latency: 950 * ms, Answer: Answer{Status: 504, DedupStatus: "forwarded", Target: "http://a"}}},
			want:      CauseUnexplained,
		},
		{
			name:      "a 504 that ended before the processing explains nothing",
			processed: []Processing{{At: at(900 * ms), Via: "a"}, {At: at(1500 * ms), Via: "a"}},
			attempts:  []Attempt{{At: at(0), Latency: 800 * ms, Answer: Answer{Status: 504, DedupStatus: "forwarded"}}},
			want:      CauseUnexplained,
		},
		{
			name:      "during a redis outage but the gateway never said so",
			processed: []Processing{{At: at(0), Via: "a"}, {At: at(1500 * ms), Via: "a"}},
			faults:    []Fault{{Kind: FaultRedisStop, Start: at(time.Second), End: at(2 * time.Second)}},
			want:      CauseUnexplained,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := &Event{ID: "evt_x", Copies: 2, Attempts: tt.attempts}
			for _, s := range tt.answers {
				ev.Attempts = append(ev.Attempts, Attempt{Answer: Answer{Status: 200, DedupStatus: s}})
			}
			r := &Report{}
			Analyze(r, Analysis{
				Events:          []*Event{ev},
				Processed:       map[string][]Processing{"evt_x": tt.processed},
				Faults:          tt.faults,
				Logs:            []*GatewayLog{{Lines: tt.logs, Outcomes: map[string]int{}}},
				UpstreamTimeout: time.Second,
				Lease:           2 * time.Second,
			})
			if len(r.Duplicates) != 1 {
				t.Fatalf("got %d duplicates, want 1", len(r.Duplicates))
			}
			if got := r.Duplicates[0].Cause; got != tt.want {
				t.Errorf("got cause %s, want %s (%s)", got, tt.want, r.Duplicates[0].Note)
			}
		})
	}
}

func TestWriteTable(t *testing.T) {
	r := &Report{Name: "x", Backend: "bolt", Replicas: 1, Events: 10, Lost: []string{"evt_1"},
		Duplicates: []Duplicate{{Cause: CauseCrash}}, Faults: []Fault{{Kind: FaultKill}, {Kind: FaultKill}}}
	var b strings.Builder
	if err := WriteTable(&b, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"events lost", "kill-9×2", "· crash"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
