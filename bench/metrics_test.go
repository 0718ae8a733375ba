package main

import (
	"strings"
	"testing"
)

func TestParseStoreOps(t *testing.T) {
	const text = `# HELP dedupgw_store_operation_duration_seconds Store operation latency.
# TYPE dedupgw_store_operation_duration_seconds histogram
dedupgw_store_operation_duration_seconds_bucket{backend="bolt",op="claim",le="0.0001"} 3
dedupgw_store_operation_duration_seconds_sum{backend="bolt",op="claim"} 0.25
dedupgw_store_operation_duration_seconds_count{backend="bolt",op="claim"} 1000
dedupgw_store_operation_duration_seconds_sum{backend="bolt",op="commit"} 12
dedupgw_store_operation_duration_seconds_count{backend="bolt",op="commit"} 1000
dedupgw_store_errors_total{backend="bolt",op="commit"} 0
`
	ops, err := parseStoreOps(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		op   string
		want float64 // mean ms
	}{
		{"claim", 0.25},
		{"commit", 12},
		{"release", 0},
	}
	for _, tt := range tests {
		if got := ops[tt.op].meanMillis(); got != tt.want {
			t.Errorf("%s: got mean %v ms, want %v", tt.op, got, tt.want)
		}
	}
	if got := ops["commit"].sub(opStat{sum: 2, count: 500}).meanMillis(); got != 20 {
		t.Errorf("delta: got mean %v ms, want 20", got)
	}
}
