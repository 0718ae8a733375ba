package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// stopGrace is how long a child gets to exit after SIGTERM before it is killed.
const stopGrace = 5 * time.Second

// child is a process the runner started: a target, the upstream or
// redis-server. Its output goes to a log file in the run's directory.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	err     error         // Wait's result, valid after done
}

// startChild starts bin with args, logging its stdout and stderr to
// dir/name.log. extraEnv is added to the runner's environment, less
// runtimeEnv. The child gets SIGTERM when ctx ends or Stop is called.
func startChild(ctx context.Context, dir, name string, extraEnv []string, bin string, args ...string) (*child, error) {
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log of %s: %w", name, err)
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Dir = dir
	cmd.Env = append(withoutRuntimeEnv(os.Environ()), extraEnv...)
	cmd.SysProcAttr = childAttr()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = stopGrace
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	return c, nil
}

// runtimeEnv are the Go runtime's settings a target must not inherit from
// the runner's environment: dedupgw paces its collector unless GOGC is set
// (and by GOMEMLIMIT), so a GOGC meant for the runner would silently measure
// another gateway. -bare-gogc sets the bare proxy's.
var runtimeEnv = []string{"GOGC", "GOMEMLIMIT"}

// withoutRuntimeEnv returns env less the runtimeEnv variables.
func withoutRuntimeEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(runtimeEnv, name) {
			out = append(out, kv)
		}
	}
	return out
}

// Stop sends SIGTERM, waits up to stopGrace for the child to exit, then kills
// it. It returns once the child has exited.
func (c *child) Stop() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(stopGrace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// exited reports whether the child has exited.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// tail returns the last lines of the child's log, for error messages.
func (c *child) tail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// waitReady polls ready every 20ms until it returns nil, the child exits or
// timeout passes.
func waitReady(ctx context.Context, c *child, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = ready(ctx); last == nil {
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s exited before it was ready (%v); its log ends:\n%s", c.name, c.err, c.tail())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %w; its log ends:\n%s", c.name, timeout, last, c.tail())
		case <-tick.C:
		}
	}
}

// freeAddr returns a 127.0.0.1 address with a port that was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// httpReady returns a check that GETs url and wants status want.
func httpReady(url string, want int) func(context.Context) error {
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			return fmt.Errorf("GET %s: got status %d, want %d", url, resp.StatusCode, want)
		}
		return nil
	}
}

// tcpReady returns a check that connects to addr.
func tcpReady(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
}

// redisReady returns a check that sends PING to the Redis server at addr.
func redisReady(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(conn).ReadBytes('\n')
		if err != nil {
			return err
		}
		if !bytes.HasPrefix(line, []byte("+PONG")) {
			return errors.New("redis answered " + strings.TrimSpace(string(line)) + " to PING")
		}
		return nil
	}
}
