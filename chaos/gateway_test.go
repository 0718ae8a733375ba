package chaos

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestFirstStartSurvivesATakenPort: another process may take a port between
// FreePort and the replica's listen (go test runs packages side by side).
// The first start then moves to fresh ports instead of failing the run, and
// the lost race is not reported as a crash.
func TestFirstStartSurvivesATakenPort(t *testing.T) {
	bin := gatewayBinary(t)
	dir := t.TempDir()
	app := NewApp(AppConfig{})
	t.Cleanup(app.Close)
	g, err := NewGateway(bin, dir, "p0", func(addr, admin string) string {
		return fmt.Sprintf("listen: %q\nadmin:\n  listen: %q\nstore:\n  bolt:\n    path: %q\nroutes:\n  - name: stripe\n    path: /webhooks/stripe\n    upstream: %q\n    provider: stripe\n",
			addr, admin, filepath.Join(dir, "p.db"), app.URL())
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
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
