package chaos

import (
	"bufio"
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// redisCmd sends one inline command and returns the first reply line(s).
func redisCmd(t *testing.T, addr, cmd string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("dial redis: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(line, "$") && !strings.HasPrefix(line, "$-1") {
		v, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(v)
	}
	return strings.TrimSpace(line)
}

func TestRedisKeepsDataAcrossStopStart(t *testing.T) {
	needRedis(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := StartRedis(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := redisCmd(t, r.Addr, "SET dedupgw:k v1"); got != "+OK" {
		t.Fatalf("got %q from SET, want +OK", got)
	}
	addr := r.Addr
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Errorf("got a connection to a stopped redis, want refused")
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if r.Addr != addr {
		t.Errorf("got address %s after restart, want %s", r.Addr, addr)
	}
	if got := redisCmd(t, r.Addr, "GET dedupgw:k"); got != "v1" {
		t.Errorf("got %q for a key written before the restart, want %q", got, "v1")
	}
}

// TestRedisStartThatGivesUpStopsTheServer: a Start that ends before the
// server answered (its context done) stops the server, so that a later
// Start starts one afresh instead of taking the first for a running one.
func TestRedisStartThatGivesUpStopsTheServer(t *testing.T) {
	needRedis(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(err)
	}
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r := &Redis{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), bin: bin, dir: dir, logPath: filepath.Join(dir, "redis.log")}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Start(ctx); err == nil {
		t.Fatal("Start with its context done: got nil, want an error")
	}
	r.mu.Lock()
	running := r.cmd != nil
	r.mu.Unlock()
	if running {
		t.Error("after the failed Start: got a server process, want it stopped")
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatalf("a later Start: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if got := redisCmd(t, r.Addr, "PING"); got != "+PONG" {
		t.Errorf("PING after the later Start: got %q, want +PONG", got)
	}
}
