package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"
)

// driver is the load driver: its own keep-alive HTTP client and a fixed number
// of concurrent senders, each posting one event at a time and waiting for the
// answer (closed loop). Every target faces the same driver.
type driver struct {
	client      *http.Client
	transport   *http.Transport
	concurrency int
	ids         *idSpace
}

// newDriver returns a driver with concurrency senders. Requests time out after
// timeout. Close releases its idle connections.
func newDriver(concurrency int, timeout time.Duration, ids *idSpace) *driver {
	tr := newTransport(concurrency * 2)
	return &driver{
		client:      &http.Client{Transport: tr, Timeout: timeout},
		transport:   tr,
		concurrency: concurrency,
		ids:         ids,
	}
}

// Close closes the driver's idle connections.
func (d *driver) Close() { d.transport.CloseIdleConnections() }

// round describes one measured round against one target.
type round struct {
	url      string        // where events are posted
	workload string        // Unique, Duplicate or Mix
	warmup   time.Duration // sent but not measured
	duration time.Duration // measured
}

// roundResult is what one round measured.
type roundResult struct {
	// requests is the number of requests that completed inside the measured
	// span; lat holds their latencies.
	requests int
	lat      latencies
	elapsed  time.Duration // the measured span
	// sent counts every request of the round: priming, warm-up and measured.
	sent int
	// failures counts measured requests that did not get a 2xx (transport
	// errors included); firstFailure describes the first of them.
	failures     int
	firstFailure string
}

// post sends one event and reads the whole answer. It returns the status code.
func (d *driver) post(ctx context.Context, url string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("new request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return resp.StatusCode, fmt.Errorf("read answer: %w", err)
	}
	return resp.StatusCode, nil
}

// run drives one round: it primes the round's event for Duplicate, then runs
// the senders for warmup+duration and measures the requests that complete
// inside the last duration. It returns early with ctx's error when ctx ends.
func (d *driver) run(ctx context.Context, r round) (roundResult, error) {
	var res roundResult
	var fixed string
	if r.workload == Duplicate {
		fixed = d.ids.newID()
		status, err := d.post(ctx, r.url, appendEvent(nil, []byte(fixed)))
		res.sent++
		if err != nil {
			return res, fmt.Errorf("prime duplicate event: %w", err)
		}
		if status/100 != 2 {
			return res, fmt.Errorf("prime duplicate event: got status %d, want 2xx", status)
		}
	}

	start := time.Now()
	from := start.Add(r.warmup)
	end := from.Add(r.duration)
	results := make([]roundResult, d.concurrency)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			results[i] = d.send(ctx, r, fixed, from, end)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return res, err
	}

	res.elapsed = r.duration
	n := 0
	for _, s := range results {
		n += len(s.lat)
	}
	res.lat = make(latencies, 0, n)
	for _, s := range results {
		res.requests += s.requests
		res.sent += s.sent
		res.failures += s.failures
		if res.firstFailure == "" {
			res.firstFailure = s.firstFailure
		}
		res.lat = append(res.lat, s.lat...)
	}
	return res, nil
}

// send is one sender's loop: post, wait for the answer, repeat until end.
func (d *driver) send(ctx context.Context, r round, fixed string, from, end time.Time) roundResult {
	var res roundResult
	seq := newSequence(r.workload, d.ids, fixed)
	// A sender does at most one request per ~20µs; preallocate for that pace.
	res.lat = make(latencies, 0, int(r.duration/(20*time.Microsecond))/d.concurrency+16)
	for ctx.Err() == nil {
		t0 := time.Now()
		if !t0.Before(end) {
			break
		}
		status, err := d.post(ctx, r.url, seq.next())
		t1 := time.Now()
		res.sent++
		if t1.Before(from) || t1.After(end) { // count completions inside the span
			continue
		}
		res.requests++
		res.lat = append(res.lat, t1.Sub(t0))
		if err == nil && status/100 != 2 {
			err = fmt.Errorf("status %d", status)
		}
		if err != nil && !errors.Is(err, context.Canceled) {
			res.failures++
			if res.firstFailure == "" {
				res.firstFailure = err.Error()
			}
		}
	}
	return res
}

// upstreamCount asks the upstream how many deliveries it has received.
func (d *driver) upstreamCount(ctx context.Context, upstreamURL string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, upstreamURL+countPath, nil)
	if err != nil {
		return 0, fmt.Errorf("new request: %w", err)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("ask upstream for its count: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, fmt.Errorf("read upstream count: %w", err)
	}
	var n int64
	if _, err := fmt.Sscan(string(b), &n); err != nil {
		return 0, fmt.Errorf("parse upstream count %q: %w", b, err)
	}
	return n, nil
}
