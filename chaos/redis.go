package chaos

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Redis runs a real redis-server bound to 127.0.0.1 on a port chosen once, so
// Stop and Start bring the same server back at the same address. Data is
// persisted with an append-only file fsynced on every write, so a restart keeps
// every key: a restarted store that had forgotten processed keys would let
// duplicates through for reasons no gateway can prevent.
//
// Redis exists because the chaos suite needs a server it can stop with SIGTERM
// (a graceful stop that flushes the AOF) and restart with its data; the shared
// helper in dedup/redisstore/redistest starts throwaway servers.
type Redis struct {
	// Addr is host:port of the server, fixed for the life of the value.
	Addr string

	bin, dir, logPath string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// StartRedis finds redis-server on PATH, picks a free port and starts the
// server with its data in dir. It returns an error wrapping exec.ErrNotFound
// when redis-server is not installed.
func StartRedis(ctx context.Context, dir string) (*Redis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("find redis-server: %w", err)
	}
	r := &Redis{bin: bin, dir: dir, logPath: filepath.Join(dir, "redis.log")}
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		r.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		err = r.Start(ctx)
		if err == nil {
			return r, nil
		}
		if attempt == 3 || !lostPortRace(err, r.logPath) {
			return nil, err
		}
	}
}

// Start starts the server if it is stopped and waits until it answers PING
// (not LOADING) as its own process. A start that fails leaves it stopped.
func (r *Redis) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return nil
	}
	_, port, _ := net.SplitHostPort(r.Addr)
	cmd := exec.Command(r.bin,
		"--bind", "127.0.0.1",
		"--port", port,
		"--dir", r.dir,
		"--save", "",
		"--appendonly", "yes",
		"--appendfsync", "always",
		"--maxmemory-policy", "noeviction",
		"--logfile", r.logPath,
	)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	r.cmd, r.done = cmd, done
	fail := func(err error) error { // a server that did not come up is stopped
		_ = cmd.Process.Kill()
		<-done
		r.cmd = nil
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := redisPing(r.Addr, cmd.Process.Pid); err == nil {
			return nil
		}
		select {
		case <-done:
			r.cmd = nil
			return fmt.Errorf("redis-server %w (see %s)", errExitedAtStart, r.logPath)
		case <-ctx.Done():
			return fail(fmt.Errorf("wait for redis-server: %w", ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fail(errors.New("redis-server did not answer PING within 10s"))
		}
	}
}

// Stop stops the server gracefully (SIGTERM: the AOF is flushed) and waits
// for it to exit. Stopping a stopped server does nothing.
func (r *Redis) Stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return nil
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	r.cmd = nil
	return nil
}

// Close stops the server. The data directory belongs to the caller.
func (r *Redis) Close() error { return r.Stop() }

// redisPing checks that the server on addr answers PING with PONG (not
// LOADING: it has read its append-only file back) and is the process pid
// (INFO server's process_id), not another test's server that held the port
// when this one failed to bind it.
func redisPing(addr string, pid int) error {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\nINFO server\r\n")); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("redis answered %q to PING", strings.TrimSpace(line))
	}
	line, err = br.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "$")))
	if !strings.HasPrefix(line, "$") || err != nil {
		return fmt.Errorf("redis answered %q to INFO", strings.TrimSpace(line))
	}
	info := make([]byte, n)
	if _, err := io.ReadFull(br, info); err != nil {
		return err
	}
	if !bytes.Contains(info, []byte(fmt.Sprintf("process_id:%d\r\n", pid))) {
		return fmt.Errorf("the redis-server on %s is not process %d", addr, pid)
	}
	return nil
}
