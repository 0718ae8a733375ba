package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// fixedResults returns results with made-up rounds for the report tests.
func fixedResults() *results {
	ms := func(v ...int) latencies {
		var l latencies
		for _, x := range v {
			l = append(l, time.Duration(x)*100*time.Microsecond)
		}
		return l
	}
	r := newResults([]string{Unique, Duplicate}, []string{TargetUpstream, TargetBare, TargetBolt, TargetRedis}, TargetBare)
	add := func(w, tgt string, reqs, sent int, reached int64, lat latencies) {
		r.cell(w, tgt).add(roundResult{requests: reqs, lat: lat, elapsed: time.Second, sent: sent}, reached)
	}
	add(Unique, TargetUpstream, 20000, 21000, 21000, ms(5, 10, 60))
	add(Unique, TargetBare, 8000, 8400, 8400, ms(30, 40, 120))
	add(Unique, TargetBare, 10000, 10500, 10500, ms(30, 40, 120))
	add(Unique, TargetBolt, 7000, 7350, 7350, ms(35, 45, 150))
	add(Unique, TargetBolt, 9500, 9975, 9975, ms(35, 45, 150))
	add(Duplicate, TargetBare, 9000, 9450, 9450, ms(30, 40, 100))
	add(Duplicate, TargetBolt, 20000, 21001, 1, ms(10, 15, 40))
	r.cell(Unique, TargetBare).cpu.add(1800*time.Millisecond, 18900)
	r.cell(Unique, TargetBolt).cpu.add(900*time.Millisecond, 7350)
	r.cell(Unique, TargetBare).machineCPU.add(5670*time.Millisecond, 18900)
	r.cell(Unique, TargetBolt).machineCPU.add(5880*time.Millisecond, 17325)
	r.cell(Unique, TargetBolt).addStoreOps(map[string]opStat{"claim": {sum: 0.07, count: 7350}, "commit": {sum: 22, count: 7350}})
	add(Unique, TargetRedis, 6000, 6300, 6300, ms(50, 60, 140))
	r.cell(Unique, TargetRedis).cpu.add(1260*time.Millisecond, 6300)
	r.cell(Unique, TargetRedis).storeCPU.add(189*time.Millisecond, 6300)
	r.cell(Unique, TargetRedis).addStoreOps(map[string]opStat{"claim": {sum: 6.3, count: 6300}, "commit": {sum: 6.93, count: 6300}})
	return r
}

func TestWriteTableMatchesGolden(t *testing.T) {
	var buf bytes.Buffer
	r := fixedResults()
	r.writeTable(&buf)
	r.writeStoreOps(&buf)
	r.writeGoals(&buf)
	golden := filepath.Join("testdata", "table.golden")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); got != string(want) {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestRoundRatiosPairRounds(t *testing.T) {
	cellOf := func(rps ...float64) *cell { return &cell{roundRPS: rps} }
	tests := []struct {
		name string
		c, b *cell
		want string
	}{
		{"paired", cellOf(7000, 9500), cellOf(8000, 10000), " (rounds 0.88–0.95×, met in 1 of 2)"},
		{"one round", cellOf(7000), cellOf(8000), ""},
		{"unequal rounds", cellOf(7000, 9500), cellOf(8000, 10000, 9000), ""},
		{"idle baseline round", cellOf(7000, 9500), cellOf(8000, 0), ""},
	}
	for _, tt := range tests {
		if got := formatRoundRatios(roundRatios(tt.c, tt.b), 0.9); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestFormatReached(t *testing.T) {
	tests := []struct {
		reached, sent int64
		rounds        int
		want          string
	}{
		{1, 30000, 1, "1"},
		{3, 90000, 3, "1 per round"},
		{0, 0, 1, "0"},
		{30000, 30000, 1, "100.0%"},
		{15000, 30000, 3, "50.0%"},
		{15000, 0, 1, "15000"},
	}
	for _, tt := range tests {
		if got := formatReached(tt.reached, tt.sent, tt.rounds); got != tt.want {
			t.Errorf("formatReached(%d, %d, %d): got %q, want %q", tt.reached, tt.sent, tt.rounds, got, tt.want)
		}
	}
}

func TestParseOptions(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantErr  string
		duration time.Duration
		rounds   int
		targets  string
	}{
		{name: "defaults", duration: 2500 * time.Millisecond, rounds: 3, targets: "upstream,bare,nginx,memory,bolt,redis"},
		{name: "quick", args: []string{"-quick"}, duration: time.Second, rounds: 1, targets: "upstream,bare,nginx,memory,bolt,redis"},
		{name: "quick keeps explicit rounds", args: []string{"-quick", "-rounds", "2"}, duration: time.Second, rounds: 2, targets: "upstream,bare,nginx,memory,bolt,redis"},
		{name: "targets in table order", args: []string{"-targets", "redis,bare"}, duration: 2500 * time.Millisecond, rounds: 3, targets: "bare,redis"},
		{name: "alt binary adds targets", args: []string{"-targets", "bare,bolt", "-dedupgw-alt", "/x/dedupgw"}, duration: 2500 * time.Millisecond, rounds: 3, targets: "bare,bolt,bolt@alt"},
		{name: "unknown target", args: []string{"-targets", "haproxy"}, wantErr: `unknown target "haproxy"`},
		{name: "unknown workload", args: []string{"-workloads", "burst"}, wantErr: `unknown workload "burst"`},
		{name: "no rounds", args: []string{"-rounds", "0"}, wantErr: "want at least 1"},
		{name: "stray argument", args: []string{"bolt"}, wantErr: "unexpected arguments"},
		{name: "bare GOGC", args: []string{"-bare-gogc", "1000"}, duration: 2500 * time.Millisecond, rounds: 3, targets: "upstream,bare,nginx,memory,bolt,redis"},
		{name: "bare GOGC off", args: []string{"-bare-gogc", "off"}, duration: 2500 * time.Millisecond, rounds: 3, targets: "upstream,bare,nginx,memory,bolt,redis"},
		{name: "bare GOGC not a percentage", args: []string{"-bare-gogc", "fast"}, wantErr: `-bare-gogc "fast"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := parseOptions(tt.args, &bytes.Buffer{})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if o.duration != tt.duration || o.rounds != tt.rounds || strings.Join(o.targets, ",") != tt.targets {
				t.Errorf("got duration %s rounds %d targets %s, want %s %d %s",
					o.duration, o.rounds, strings.Join(o.targets, ","), tt.duration, tt.rounds, tt.targets)
			}
		})
	}
}
