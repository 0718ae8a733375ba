package chaos

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stripeGateway prepares, without starting it, a replica named name with a
// bolt file in a temporary directory and one unsigned Stripe route to
// upstream; it is closed when the test ends.
func stripeGateway(t *testing.T, name, upstream string) *Gateway {
	t.Helper()
	bin := gatewayBinary(t)
	dir := t.TempDir()
	g, err := NewGateway(bin, dir, name, func(addr, admin string) string {
		return fmt.Sprintf("listen: %q\nadmin:\n  listen: %q\nstore:\n  bolt:\n    path: %q\nroutes:\n  - name: stripe\n    path: /webhooks/stripe\n    upstream: %q\n    provider: stripe\n",
			addr, admin, filepath.Join(dir, name+".db"), upstream)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	return g
}

// TestFirstStartSurvivesATakenPort: another process may take a port between
// FreePort and the replica's listen (go test runs packages side by side).
// The first start then moves to fresh ports instead of failing the run, and
// the lost race is not reported as a crash.
func TestFirstStartSurvivesATakenPort(t *testing.T) {
	app := NewApp(AppConfig{})
	t.Cleanup(app.Close)
	g := stripeGateway(t, "p0", app.URL())
	taken := g.Addr
	ln, err := net.Listen("tcp", taken)
	if err != nil {
		t.Fatalf("take the replica's port: %v", err)
	}
	defer ln.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatalf("Start with its port taken: got %v, want a start on other ports", err)
	}
	if g.Addr == taken {
		t.Errorf("Addr: got the taken %s, want another", taken)
	}
	if u := g.Unexpected(); len(u) != 0 {
		t.Errorf("Unexpected: got %q, want nothing for the lost race", u)
	}
}

// TestStartThatNeverGetsHealthyStopsTheProcess: a replica that runs but
// never answers /healthz is stopped when Start gives up, so a later Start
// starts it again instead of taking it for a running replica.
func TestStartThatNeverGetsHealthyStopsTheProcess(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "never-healthy")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexec sleep 30\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	g, err := NewGateway(bin, dir, "n0", func(addr, admin string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := g.Start(ctx)
		cancel()
		if err == nil {
			t.Fatalf("Start %d of a replica that never gets healthy: got nil, want an error", i+1)
		}
		if g.Running() {
			t.Errorf("after failed Start %d: got Running, want the process stopped", i+1)
		}
	}
	if u := g.Unexpected(); len(u) != 0 {
		t.Errorf("Unexpected: got %q, want nothing for processes Start stopped itself", u)
	}
}

// TestIncarnationReachesTheApplication: each process a replica starts
// forwards with its own number in the upstream path, which the application
// records, so that a kill explains only what the killed process forwarded.
func TestIncarnationReachesTheApplication(t *testing.T) {
	app := NewApp(AppConfig{})
	t.Cleanup(app.Close)
	g := stripeGateway(t, "i0", app.URL()+"/i"+IncarnationPlaceholder)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	deliver := func(id string) {
		t.Helper()
		resp, err := http.Post(g.URL()+"/webhooks/stripe", "application/json", strings.NewReader(`{"id":"`+id+`","object":"event"}`))
		if err != nil {
			t.Fatalf("deliver %s: %v", id, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("deliver %s: got %d, want 200", id, resp.StatusCode)
		}
	}
	for n, id := range []string{"evt_first", "evt_second"} {
		if n > 0 {
			if err := g.Kill(); err != nil {
				t.Fatal(err)
			}
		}
		if err := g.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if got, want := g.Incarnation(), n+1; got != want {
			t.Errorf("Incarnation after start %d: got %d, want %d", n+1, got, want)
		}
		deliver(id)
		ps := app.Processed()[id]
		if len(ps) != 1 || ps[0].Incarnation != n+1 {
			t.Errorf("%s: got processings %+v, want one by incarnation %d", id, ps, n+1)
		}
	}
}

func TestIncarnationOf(t *testing.T) {
	tests := []struct {
		path string
		want int
	}{
		{"/i3/webhooks/stripe", 3},
		{"/i12", 12},
		{"/webhooks/stripe", 0},
		{"/ix/webhooks", 0},
		{"/i/webhooks", 0},
		{"/i-1/x", 0},
	}
	for _, tt := range tests {
		if got := incarnationOf(tt.path); got != tt.want {
			t.Errorf("incarnationOf(%q): got %d, want %d", tt.path, got, tt.want)
		}
	}
}
