package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// storeOpMetric is dedupgw's histogram of store operation latencies.
const storeOpMetric = "dedupgw_store_operation_duration_seconds"

// opStat is the _sum and _count of one store operation's histogram.
type opStat struct {
	sum   float64 // seconds
	count float64
}

// sub returns the operations between an earlier scrape and s.
func (s opStat) sub(before opStat) opStat {
	return opStat{sum: s.sum - before.sum, count: s.count - before.count}
}

// meanMillis returns the mean latency in milliseconds, 0 without operations.
func (s opStat) meanMillis() float64 {
	if s.count <= 0 {
		return 0
	}
	return s.sum / s.count * 1000
}

// scrapeStoreOps reads dedupgw's /metrics at url and returns the store
// operation histograms' sums and counts by op (claim, commit, …).
func scrapeStoreOps(ctx context.Context, client *http.Client, url string) (map[string]opStat, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: got status %d, want 200", url, resp.StatusCode)
	}
	return parseStoreOps(resp.Body)
}

// parseStoreOps extracts the store operation sums and counts from the
// Prometheus text format.
func parseStoreOps(r io.Reader) (map[string]opStat, error) {
	ops := map[string]opStat{}
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		line := s.Text()
		rest, ok := strings.CutPrefix(line, storeOpMetric+"_")
		if !ok {
			continue
		}
		kind, rest, ok := strings.Cut(rest, "{")
		if !ok || (kind != "sum" && kind != "count") {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		op := labelValue(labels, "op")
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil || op == "" {
			continue
		}
		st := ops[op]
		if kind == "sum" {
			st.sum = v
		} else {
			st.count = v
		}
		ops[op] = st
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	return ops, nil
}

// labelValue returns the value of label name in `a="x",b="y"`.
func labelValue(labels, name string) string {
	for _, kv := range strings.Split(labels, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}
