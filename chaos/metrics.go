package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ProcessGauges are the Go runtime and process gauges a replica exports on
// /metrics, used to spot goroutine and descriptor leaks in the gateway.
type ProcessGauges struct {
	Goroutines, OpenFDs int
}

// ScrapeGauges reads go_goroutines and process_open_fds from admin's
// /metrics. ok is false when the replica does not export them.
func ScrapeGauges(ctx context.Context, admin string) (g ProcessGauges, ok bool, err error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/metrics", nil)
	if err != nil {
		return g, false, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return g, false, fmt.Errorf("scrape %s/metrics: %w", admin, err)
	}
	defer resp.Body.Close()
	var seen int
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, found := strings.Cut(sc.Text(), " ")
		if !found {
			continue
		}
		f, perr := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if perr != nil {
			continue
		}
		switch name {
		case "go_goroutines":
			g.Goroutines = int(f)
			seen++
		case "process_open_fds":
			g.OpenFDs = int(f)
			seen++
		}
	}
	return g, seen == 2, sc.Err()
}

// Slack a replica may keep over its idle baseline after a run: the scrape's
// own connection and a few idle connections closing.
const (
	goroutineSlack = 6
	fdSlack        = 3
)

// settleGauges polls a replica's gauges until they are back within slack of
// base (plus up to poolConns descriptors) or 5s pass, and returns the last
// reading.
func settleGauges(ctx context.Context, admin string, base ProcessGauges, poolConns int) (ProcessGauges, bool, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		g, ok, err := ScrapeGauges(ctx, admin)
		if err != nil || !ok {
			return g, ok, err
		}
		if g.Goroutines <= base.Goroutines+goroutineSlack && g.OpenFDs <= base.OpenFDs+fdSlack+poolConns {
			return g, true, nil
		}
		if time.Now().After(deadline) {
			return g, true, nil
		}
		select {
		case <-ctx.Done():
			return g, true, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
