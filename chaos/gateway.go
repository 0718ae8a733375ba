package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Build compiles ./cmd/dedupgw of the module rooted at modRoot into dir and
// returns the binary's path. With race set the binary is built with -race, so
// data races in the gateway show up in its log as "WARNING: DATA RACE".
func Build(ctx context.Context, modRoot, dir string, race bool) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("find the go command: %w", err)
	}
	bin := filepath.Join(dir, "dedupgw")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/dedupgw")
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = modRoot
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/dedupgw: %w\n%s", err, out)
	}
	return bin, nil
}

// ModuleRoot walks up from dir to the directory holding go.mod.
func ModuleRoot(dir string) (string, error) {
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Gateway is one dedupgw replica run from a config file on fixed 127.0.0.1
// ports, so it comes back at the same address after Kill or Term. Its output
// (stdout and stderr, JSON log lines) is appended to LogPath across restarts.
// Methods are safe for concurrent use.
type Gateway struct {
	// Name labels the replica in reports ("r0").
	Name string
	// Addr and AdminAddr are the delivery and admin listeners' host:port.
	Addr, AdminAddr string
	// ConfigPath and LogPath are the replica's config file and log.
	ConfigPath, LogPath string

	bin    string
	config func(addr, adminAddr string) string
	text   string // the config as config wrote it, placeholder included

	mu sync.Mutex
	// started is set once the replica started: its addresses are then
	// known to the caller and stay.
	started bool
	// incarnation counts the processes started (see Incarnation).
	incarnation int
	cmd         *exec.Cmd
	done        chan struct{}
	exitErr     error
	// expected is set while an exit was asked for (Kill, Term, Close).
	expected bool
	// unexpected lists exits nobody asked for.
	unexpected []string
}

// NewGateway prepares a replica named name with two free ports and a config
// written by config(addr, adminAddr) into dir. It does not start it.
func NewGateway(bin, dir, name string, config func(addr, adminAddr string) string) (*Gateway, error) {
	g := &Gateway{
		Name:       name,
		ConfigPath: filepath.Join(dir, name+".yaml"),
		LogPath:    filepath.Join(dir, name+".log"),
		bin:        bin,
		config:     config,
	}
	if err := g.choosePorts(); err != nil {
		return nil, err
	}
	return g, nil
}

// choosePorts picks two free ports and writes the config with them.
func (g *Gateway) choosePorts() error {
	p1, err := FreePort()
	if err != nil {
		return err
	}
	p2, err := FreePort()
	if err != nil {
		return err
	}
	g.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p1))
	g.AdminAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(p2))
	g.text = g.config(g.Addr, g.AdminAddr)
	return g.writeConfig(g.incarnation)
}

// IncarnationPlaceholder, in a replica's config, is replaced by the number
// of the process about to start (1 for the first, 2 after a restart…).
// Put in a route's upstream path, it tells the application which process
// forwarded a request, so that a kill explains only what the killed process
// forwarded, however late a loaded machine let the application process it.
const IncarnationPlaceholder = "{incarnation}"

// writeConfig writes the config for process n.
func (g *Gateway) writeConfig(n int) error {
	text := strings.ReplaceAll(g.text, IncarnationPlaceholder, strconv.Itoa(n))
	if err := os.WriteFile(g.ConfigPath, []byte(text), 0o600); err != nil {
		return fmt.Errorf("write gateway config: %w", err)
	}
	return nil
}

// Incarnation is the number of the replica's current (or last) process: 0
// before the first start, then 1, 2… See IncarnationPlaceholder.
func (g *Gateway) Incarnation() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.incarnation
}

// URL is the base URL of the delivery listener.
func (g *Gateway) URL() string { return "http://" + g.Addr }

// AdminURL is the base URL of the admin listener.
func (g *Gateway) AdminURL() string { return "http://" + g.AdminAddr }

// Start starts the replica if it is not running and waits until /healthz
// answers 200 (at most 15s). A first start whose port another process took
// between FreePort and the replica's listen (go test runs packages side by
// side) is retried on fresh ports; later starts keep the replica's
// addresses.
func (g *Gateway) Start(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := g.start(ctx)
		g.mu.Lock()
		first := !g.started
		g.started = g.started || err == nil
		g.mu.Unlock()
		if err == nil || !first || attempt == 3 || !lostPortRace(err, g.LogPath) {
			return err
		}
		g.mu.Lock()
		g.unexpected, g.exitErr = nil, nil // that exit was the lost race, nothing else
		g.mu.Unlock()
		if err := g.choosePorts(); err != nil {
			return err
		}
	}
}

func (g *Gateway) start(ctx context.Context) error {
	g.mu.Lock()
	if g.cmd != nil {
		g.mu.Unlock()
		return nil
	}
	logf, err := os.OpenFile(g.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		g.mu.Unlock()
		return fmt.Errorf("open gateway log: %w", err)
	}
	if err := g.writeConfig(g.incarnation + 1); err != nil {
		_ = logf.Close()
		g.mu.Unlock()
		return err
	}
	g.incarnation++
	fmt.Fprintf(logf, "{\"chaos\":\"start\",\"ts\":%q}\n", time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(g.bin, "serve", "--config", g.ConfigPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "GORACE=halt_on_error=0")
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		g.mu.Unlock()
		return fmt.Errorf("start dedupgw: %w", err)
	}
	done := make(chan struct{})
	g.cmd, g.done, g.expected = cmd, done, false
	go g.wait(cmd, logf, done)
	g.mu.Unlock()

	err = g.waitHealthy(ctx, done)
	if err != nil && !errors.Is(err, errExitedAtStart) {
		// Running but never healthy: stop it, so that a later Start starts
		// it afresh instead of taking it for a running replica.
		g.mu.Lock()
		g.expected = true
		g.mu.Unlock()
		_ = cmd.Process.Kill()
		<-done
	}
	return err
}

func (g *Gateway) wait(cmd *exec.Cmd, logf *os.File, done chan struct{}) {
	err := cmd.Wait()
	_ = logf.Close()
	g.mu.Lock()
	g.exitErr = err
	if !g.expected {
		g.unexpected = append(g.unexpected, fmt.Sprintf("%s exited unasked at %s: %v (see %s)",
			g.Name, time.Now().Format("15:04:05.000"), err, g.LogPath))
	}
	if g.cmd == cmd {
		g.cmd = nil
	}
	g.mu.Unlock()
	close(done)
}

func (g *Gateway) waitHealthy(ctx context.Context, done <-chan struct{}) error {
	c := &http.Client{Timeout: 500 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := c.Get(g.AdminURL() + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: /healthz not 200 within 15s (see %s)", g.Name, g.LogPath)
		}
		select {
		case <-done:
			return fmt.Errorf("%s %w (see %s)", g.Name, errExitedAtStart, g.LogPath)
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", g.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Running reports whether the replica's process is running.
func (g *Gateway) Running() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cmd != nil
}

// signal sends sig to a running replica, marks the exit as expected and
// returns the channel closed when it has exited.
func (g *Gateway) signal(sig os.Signal) (<-chan struct{}, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return nil, fmt.Errorf("%s is not running", g.Name)
	}
	g.expected = true
	if err := g.cmd.Process.Signal(sig); err != nil {
		return nil, fmt.Errorf("signal %s: %w", g.Name, err)
	}
	return g.done, nil
}

// Kill sends SIGKILL and waits until the process is gone.
func (g *Gateway) Kill() error {
	done, err := g.signal(syscall.SIGKILL)
	if err != nil {
		return err
	}
	<-done
	return nil
}

// Term sends SIGTERM and waits up to timeout for a clean exit (status 0). It
// returns how long the drain took. On timeout the process is killed and an
// error returned.
func (g *Gateway) Term(timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	done, err := g.signal(syscall.SIGTERM)
	if err != nil {
		return 0, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		_ = g.Kill()
		return time.Since(start), fmt.Errorf("%s did not exit within %s of SIGTERM", g.Name, timeout)
	}
	took := time.Since(start)
	g.mu.Lock()
	exitErr := g.exitErr
	g.mu.Unlock()
	if exitErr != nil {
		return took, fmt.Errorf("%s exited after SIGTERM with %w", g.Name, exitErr)
	}
	return took, nil
}

// Unexpected lists the exits nobody asked for (crashes).
func (g *Gateway) Unexpected() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.unexpected...)
}

// Close kills the replica if it runs and waits for it.
func (g *Gateway) Close() error {
	if !g.Running() {
		return nil
	}
	if err := g.Kill(); err != nil && g.Running() {
		return err
	}
	return nil
}
