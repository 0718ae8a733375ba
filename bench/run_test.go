package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestRunEndToEnd runs the whole runner as `go run ./bench` would, with
// short rounds: real child processes for the upstream, the bare proxy and a
// dedupgw built from ./cmd/dedupgw, and checks the table it prints.
func TestRunEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs dedupgw; skipped with -short")
	}
	var stdout, stderr bytes.Buffer
	err := run([]string{
		"-targets", "upstream,bare,memory",
		"-workloads", "unique,duplicate,mix",
		"-rounds", "1", "-duration", "300ms", "-warmup", "100ms", "-concurrency", "4",
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	out := stdout.String()
	if strings.Contains(out, "Skipped:") {
		t.Fatalf("got skipped targets, want none:\n%s\nstderr:\n%s", out, stderr.String())
	}
	tests := []struct {
		row  string // workload | target
		want string // a later cell of that row
	}{
		{"| unique | upstream (direct) |", "| 100.0% | 0 |"},
		{"| unique | bare ReverseProxy |", "| 1.00× |"},
		{"| unique | dedupgw memory |", "| 100.0% | 0 |"},
		{"| duplicate | dedupgw memory |", "| 1 | 0 |"},
		{"| mix | dedupgw memory |", "% | 0 |"},
	}
	for _, tt := range tests {
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, tt.row) {
				line = l
				break // the first table; the store operations table follows
			}
		}
		if line == "" || !strings.Contains(line, tt.want) {
			t.Errorf("got row %q, want a row %s… containing %q; output:\n%s", line, tt.row, tt.want, out)
		}
	}
	if !strings.Contains(out, "Goals (same run, against the baseline):") {
		t.Errorf("got no goals section, want one:\n%s", out)
	}
}
