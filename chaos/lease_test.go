package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSlowCommitAfterLease covers a store that turns slow while a delivery
// is at the upstream, so that its commit reaches the store after its lease
// ended. DESIGN.md's state machine only forbids a late finisher to overwrite
// the state of an attempt that took over; DESIGN.md's honest limits do not
// list a duplicate here. So:
//
//   - "no retry meanwhile": nobody took the key over, the late commit must
//     still record the event, and a later copy is a duplicate;
//   - "retry meanwhile": copies retried during the overrun must not be
//     forwarded again while the first sender was answered 200. The gateway
//     bounds every forward by its claim's lease (proxy.forwardDeadline), so a
//     copy that claims the lapsed key is cut at its own lease end (504)
//     before the slow store lets it reach the upstream; the event is
//     processed once. What remains (a store slower than the commit reserve
//     once it is fast again) is in the README's honest limits.
func TestSlowCommitAfterLease(t *testing.T) {
	needRedis(t)
	leakCheck(t)
	tests := []struct {
		name string
		// retry sends copies every 100ms while the first is in flight.
		retry bool
	}{
		{"no retry meanwhile: the late commit is kept", false},
		{"retry meanwhile", true},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shortParallel(t)
			slowCommit(t, fmt.Sprintf("evt_slow_commit_%d", i), tt.retry)
		})
	}
}

func slowCommit(t *testing.T, id string, retry bool) {
	bin := gatewayBinary(t)
	dir := runDir(t, "slow-commit")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	redis, err := StartRedis(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer redis.Close()
	proxy, err := NewDelayProxy(redis.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()

	var once sync.Once
	// The claim is done when the request reaches the upstream; from then on
	// each packet to or from Redis waits 1s, so the commit, sent after the
	// upstream's answer 200ms later, lands 1.2s after the claim, past the 1s
	// lease (which is longer than the 500ms upstream timeout, as required).
	app := NewApp(AppConfig{
		Delay: 200 * time.Millisecond,
		OnRequest: func(got string) {
			if got == id {
				once.Do(func() { proxy.SetDelay(time.Second) })
			}
		},
	})
	defer app.Close()
	s := &Scenario{Lease: time.Second, UpstreamTimeout: 500 * time.Millisecond, OnInFlight: "reject"}
	store := fmt.Sprintf("  backend: redis\n  redis:\n    addrs: [%q]\n    read_timeout: 4s\n    write_timeout: 4s", proxy.Addr())
	g, err := NewGateway(bin, dir, "l0", func(addr, admin string) string {
		return s.gatewayConfig(addr, admin, store, app.URL())
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	send := func(id string) (int, string) {
		resp, err := c.Post(g.URL()+"/webhooks/stripe", "application/json", bytes.NewReader(Body(id)))
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Dedup-Status")
	}
	// Warm the pool so the claim needs no new connection.
	if st, ds := send("evt_warm_up_" + id); st != http.StatusOK {
		t.Fatalf("warm-up delivery: got %d %q, want 200", st, ds)
	}

	first := make(chan string, 1)
	go func() {
		st, ds := send(id)
		first <- fmt.Sprintf("%d %s", st, ds)
	}()
	// Wait until the first delivery has claimed the key and reached the
	// upstream (the warm-up was the first request).
	reached := time.Now().Add(5 * time.Second)
	for app.Stats().Requests < 2 && time.Now().Before(reached) {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	var copies []string
	if retry {
		// A provider retrying a second copy every 100ms until it gets a
		// 2xx, as Stripe does after a timeout on its side.
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			st, ds := send(id)
			copies = append(copies, fmt.Sprintf("%d %s", st, ds))
			if st/100 == 2 {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	got := <-first
	proxy.SetDelay(0)
	if !retry {
		// The first was answered, so its commit is done: a copy now must be
		// answered as a duplicate.
		st, ds := send(id)
		copies = append(copies, fmt.Sprintf("%d %s", st, ds))
	}
	t.Logf("first delivery: %s; copies: %s", got, strings.Join(copies, ", "))
	gl, err := ReadLogFile(g.Name, g.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range gl.Lines {
		if l.Key == id && l.Level != "info" {
			t.Logf("gateway %s: %s", l.Level, l.Msg)
		}
	}
	if n := len(app.Processed()[id]); n != 1 {
		t.Errorf("got the event processed %d times by the upstream, want 1 (first delivery answered %q)", n, got)
	}
}
