package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// dedupFront is a minimal in-test stand-in for a dedup gateway: it forwards
// the first delivery of each event ID to next and answers later ones itself.
// It checks the runner's accounting of what reaches the upstream.
type dedupFront struct {
	next http.Handler
	mu   sync.Mutex
	seen map[string]bool
}

func (f *dedupFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var ev struct{ ID string }
	_ = json.Unmarshal(body, &ev)
	f.mu.Lock()
	dup := f.seen[ev.ID]
	f.seen[ev.ID] = true
	f.mu.Unlock()
	if dup {
		w.Write([]byte(`{"status":"duplicate"}`))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	f.next.ServeHTTP(w, r)
}

func TestDriverRoundsAndUpstreamAccounting(t *testing.T) {
	up := httptest.NewServer(&upstream{})
	defer up.Close()
	bare, err := newBareProxy(up.URL, 8)
	if err != nil {
		t.Fatal(err)
	}
	bareSrv := httptest.NewServer(bare)
	defer bareSrv.Close()
	defer bare.Transport.(*http.Transport).CloseIdleConnections()
	// The front's upstream is in-process, so its count is read directly.
	shared := &upstream{}
	front := httptest.NewServer(&dedupFront{next: shared, seen: map[string]bool{}})
	defer front.Close()

	const senders = 4
	tests := []struct {
		name     string
		url      string
		workload string
		// want is the range of deliveries the upstream must see for sent requests.
		want func(sent int) (lo, hi int64)
	}{
		{"upstream unique", up.URL, Unique, all},
		{"bare duplicate", bareSrv.URL, Duplicate, all},
		{"front unique", front.URL, Unique, all},
		{"front duplicate", front.URL, Duplicate, func(int) (int64, int64) { return 1, 1 }},
		// Every event twice, but a sender may stop between an event and its repeat.
		{"front mix", front.URL, Mix, func(sent int) (int64, int64) { return int64(sent) / 2, int64(sent+senders) / 2 }},
	}
	d := newDriver(senders, 5*time.Second, newIDSpace())
	defer d.Close()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			count := func() int64 {
				if tt.url == front.URL {
					return shared.received.Load()
				}
				n, err := d.upstreamCount(context.Background(), up.URL)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := count()
			res, err := d.run(context.Background(), round{url: tt.url + webhookPath, workload: tt.workload, warmup: 20 * time.Millisecond, duration: 300 * time.Millisecond})
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			reached := count() - before
			if res.requests == 0 || len(res.lat) != res.requests {
				t.Errorf("got %d requests and %d latencies, want as many and more than 0", res.requests, len(res.lat))
			}
			if res.failures != 0 {
				t.Errorf("got %d failures (first: %s), want 0", res.failures, res.firstFailure)
			}
			if res.sent < res.requests {
				t.Errorf("got %d sent < %d measured, want sent to include measured", res.sent, res.requests)
			}
			if lo, hi := tt.want(res.sent); reached < lo || reached > hi {
				t.Errorf("got %d deliveries at the upstream of %d sent, want %d..%d", reached, res.sent, lo, hi)
			}
		})
	}
}

func all(sent int) (int64, int64) { return int64(sent), int64(sent) }

func TestDriverReportsFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "in flight", http.StatusConflict)
	}))
	defer srv.Close()
	d := newDriver(2, 5*time.Second, newIDSpace())
	defer d.Close()
	res, err := d.run(context.Background(), round{url: srv.URL, workload: Unique, duration: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("got error %v, want none", err)
	}
	if res.failures != res.requests || res.firstFailure != "status 409" {
		t.Errorf("got %d failures of %d, first %q; want all, first %q", res.failures, res.requests, res.firstFailure, "status 409")
	}
	// A duplicate round whose priming fails is an error: the round would
	// measure nothing useful.
	if _, err := d.run(context.Background(), round{url: srv.URL, workload: Duplicate, duration: 50 * time.Millisecond}); err == nil {
		t.Errorf("got no error for a failed priming, want one")
	}
}

func TestDriverStopsWhenContextEnds(t *testing.T) {
	srv := httptest.NewServer(&upstream{})
	defer srv.Close()
	d := newDriver(2, 5*time.Second, newIDSpace())
	defer d.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := d.run(ctx, round{url: srv.URL, workload: Unique, duration: time.Hour}); err == nil {
		t.Errorf("got no error from a cancelled round, want context.Canceled")
	}
}
