package chaos

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

	"go.uber.org/goleak"
)

// refGateway is a minimal in-process dedup gateway following DESIGN.md's state
// machine with an in-memory map. It is the reference the harness is checked
// against: with it, a run must show no lost event and no duplicate forwarded.
type refGateway struct {
	upstream string
	client   *http.Client

	mu    sync.Mutex
	state map[string]string
}

func (g *refGateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	var ev struct{ ID string }
	if json.Unmarshal(body, &ev) != nil || ev.ID == "" {
		http.Error(w, "no id", http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	switch g.state[ev.ID] {
	case "processed":
		g.mu.Unlock()
		w.Header().Set("Dedup-Status", "duplicate")
		w.WriteHeader(http.StatusOK)
		return
	case "processing":
		g.mu.Unlock()
		w.Header().Set("Dedup-Status", "in-flight")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusConflict)
		return
	}
	g.state[ev.ID] = "processing"
	g.mu.Unlock()

	req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, g.upstream, bytes.NewReader(body))
	req.Header.Set("Dedup-Key", routeName+":"+ev.ID)
	req.Header.Set("X-Forwarded-Host", r.Host)
	resp, err := g.client.Do(req)
	status := http.StatusBadGateway
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status = resp.StatusCode
	}
	g.mu.Lock()
	if status/100 == 2 {
		g.state[ev.ID] = "processed"
	} else {
		delete(g.state, ev.ID)
	}
	g.mu.Unlock()
	w.Header().Set("Dedup-Status", "forwarded")
	w.WriteHeader(status)
}

// refTimeout is the reference gateway's upstream timeout.
const refTimeout = time.Second

func TestSimulatorAgainstReferenceGateway(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tests := []struct {
		name    string
		dedup   bool
		app     AppConfig
		wantDup func(r *Report) int
	}{
		{
			name:    "reference gateway, flaky upstream: nothing lost, nothing duplicated",
			dedup:   true,
			app:     AppConfig{FailRate: 0.05, SlowRate: 0.02, ResetRate: 0.02, SlowDelay: 3 * refTimeout, Seed: 1},
			wantDup: func(*Report) int { return 0 },
		},
		{
			name:  "no gateway: every copy the provider sends is a duplicate forwarded",
			dedup: false,
			app:   AppConfig{Seed: 2},
			wantDup: func(r *Report) int {
				return r.DuplicatesSent
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := NewApp(AppConfig{
				FailRate: tt.app.FailRate, SlowRate: tt.app.SlowRate, ResetRate: tt.app.ResetRate,
				SlowDelay: tt.app.SlowDelay, Seed: tt.app.Seed, Body: Body, Namespace: routeName,
			})
			defer app.Close()
			var urls []string
			if tt.dedup {
				// The reference cuts a forward at refTimeout and releases its
				// key, as a gateway's upstream_timeout does; an application
				// that processed it meanwhile (a timeout-cut, which the
				// reference does not log) would count as unexplained. So
				// only the slow requests (SlowDelay) may reach it: on a loaded
				// machine a 200 ms limit also cut ordinary ones.
				ref := &refGateway{
					upstream: app.URL(),
					client:   &http.Client{Timeout: refTimeout, Transport: &http.Transport{}},
					state:    map[string]string{},
				}
				defer ref.client.CloseIdleConnections()
				// Two "replicas" sharing one state, like two gateways on one Redis.
				for range 2 {
					s := httptest.NewServer(ref)
					defer s.Close()
					urls = append(urls, s.URL)
				}
			} else {
				urls = []string{app.URL()}
			}
			rr := NewRoundRobin(5*time.Second, urls...)
			defer rr.CloseIdleConnections()
			sim := NewSimulator(SimConfig{
				Events: 150, Rate: 300, DuplicateRate: 0.1, BurstRate: 0.05,
				DuplicateDelay: 50 * time.Millisecond, BackoffMin: 10 * time.Millisecond,
				BackoffMax: 100 * time.Millisecond, Seed: 3,
			}, rr)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			events := sim.Run(ctx)
			rep := &Report{Name: "ref"}
			rep.App = app.Stats()
			Analyze(rep, Analysis{Events: events, Processed: app.Processed(), UpstreamTimeout: refTimeout, Lease: time.Second})

			if got := len(rep.Lost); got != 0 {
				t.Errorf("got %d events lost, want 0\n%s", got, rep.Details())
			}
			if got, want := len(rep.Duplicates), tt.wantDup(rep); got != want {
				t.Errorf("got %d duplicates forwarded, want %d\n%s", got, want, rep.Details())
			}
			if got, want := rep.ByCause()[CauseUnexplained], len(rep.Duplicates); got != want {
				t.Errorf("got %d unexplained duplicates, want all %d (no fault was injected)", got, want)
			}
			if got := rep.Events; got != 150 {
				t.Errorf("got %d events, want 150", got)
			}
			if rep.DuplicatesSent == 0 {
				t.Errorf("got 0 duplicates sent, want some (DuplicateRate 0.1, BurstRate 0.05)")
			}
			if got := rep.App.BadBody + rep.App.BadDedupKey; tt.dedup && got != 0 {
				t.Errorf("got %d requests with an altered body or a wrong Dedup-Key, want 0", got)
			}
			var unfinished int
			for _, ev := range events {
				unfinished += ev.Unfinished
			}
			if unfinished != 0 {
				t.Errorf("got %d unfinished copies, want 0", unfinished)
			}
		})
	}
}

func TestSimulatorStopsAtDeadline(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	// An endpoint that never succeeds: the provider retries until the deadline.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	rr := NewRoundRobin(time.Second, srv.URL)
	defer rr.CloseIdleConnections()
	sim := NewSimulator(SimConfig{Events: 20, Rate: 100, BackoffMin: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond}, rr)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	events := sim.Run(ctx)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Run took %s after a 300ms deadline, want it to return promptly", took)
	}
	if got := len(events); got != 20 {
		t.Fatalf("got %d events, want 20", got)
	}
	for _, ev := range events {
		if !ev.FirstOK.IsZero() {
			t.Errorf("event %s: got a 2xx from an endpoint that only answers 503", ev.ID)
		}
		if ev.Unfinished != ev.Copies {
			t.Errorf("event %s: got %d unfinished copies, want %d", ev.ID, ev.Unfinished, ev.Copies)
		}
	}
}
