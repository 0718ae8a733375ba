package main

// End-to-end tests: the real dedupgw binary, built once in TestMain (with
// -race when the tests run with -race), serving a temporary configuration on
// a bbolt file in t.TempDir(), in front of an httptest upstream that counts
// what reaches it. Listeners bind 127.0.0.1:0; the tests read the bound
// addresses from the "dedupgw started" log line.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// testVersion is stamped into the test binary to check -X main.version.
const testVersion = "v0.0.0-e2e"

// binPath is the dedupgw binary built by TestMain.
var binPath string

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dedupgw-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "dedupgw")
	args := []string{"build", "-o", binPath, "-ldflags", "-X main.version=" + testVersion}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, ".")...)
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// testEnv is the environment for dedupgw processes: the test's own, less
// any DEDUPGW_* variable that would override the test's configuration.
func testEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, EnvPrefix) {
			env = append(env, kv)
		}
	}
	return env
}

// upstream is an httptest application that counts deliveries by Dedup-Key.
// handle, when set, answers instead of the default 200 {"ok":true}.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	hits   map[string]int
	total  atomic.Int64
	handle func(w http.ResponseWriter, r *http.Request, n int) // n: this key's hit number, from 1
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{hits: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Dedup-Key")
		u.mu.Lock()
		u.hits[key]++
		n := u.hits[key]
		h := u.handle
		u.mu.Unlock()
		u.total.Add(1)
		if h != nil {
			h(w, r, n)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(u.Close)
	return u
}

// setHandler replaces the upstream's answer.
func (u *upstream) setHandler(h func(w http.ResponseWriter, r *http.Request, n int)) {
	u.mu.Lock()
	u.handle = h
	u.mu.Unlock()
}

// count returns how many deliveries with Dedup-Key key reached the upstream.
func (u *upstream) count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[key]
}

// gwConfig writes a configuration with one generic route "orders" on
// /hooks/orders keyed by Idempotency-Key, a bolt file in dir, and extra
// appended to the route.
func gwConfig(t *testing.T, dir, upstreamURL, top, route string) string {
	t.Helper()
	return gatewayConfig(t, dir, top, fmt.Sprintf(`  - name: orders
    path: /hooks/orders
    upstream: %q
    provider: generic
    keys: ["header:Idempotency-Key"]
%s`, upstreamURL, route))
}

// gatewayConfig writes dir/config.yaml and returns its path: both listeners
// on free loopback ports, debug logs, the bolt file dir/dedupgw.db, the
// top-level keys top, and routes, the list under routes:.
func gatewayConfig(t *testing.T, dir, top, routes string) string {
	t.Helper()
	text := fmt.Sprintf(`listen: "127.0.0.1:0"
admin:
  listen: "127.0.0.1:0"
log:
  level: debug
store:
  backend: bolt
  bolt:
    path: %q
%s
routes:
%s`, filepath.Join(dir, "dedupgw.db"), top, routes)
	path := filepath.Join(dir, "config.yaml")
	writeFileAtomic(t, path, text)
	return path
}

// writeFileAtomic replaces path with text in one rename, so a reload never
// reads half a file.
func writeFileAtomic(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// gateway is one running dedupgw serve process.
type gateway struct {
	t          *testing.T
	cmd        *exec.Cmd
	addr       string // gateway host:port
	admin      string // admin host:port
	done       chan struct{}
	exitCode   int
	logMu      sync.Mutex
	log        bytes.Buffer
	started    chan struct{}
	startedErr error
}

// startGateway runs "dedupgw serve --config path" with env added to the
// process environment and waits until it logged its listen addresses.
func startGateway(t *testing.T, path string, env ...string) *gateway {
	t.Helper()
	return startGatewayIn(t, "", path, env...)
}

// startGatewayIn is startGateway with the working directory dir ("" means
// the test's).
func startGatewayIn(t *testing.T, dir, path string, env ...string) *gateway {
	t.Helper()
	g := &gateway{t: t, done: make(chan struct{}), started: make(chan struct{})}
	g.cmd = exec.Command(binPath, "serve", "--config", path)
	g.cmd.Dir = dir
	g.cmd.Env = append(testEnv(), env...)
	stderr, err := g.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go g.readLog(stderr)
	t.Cleanup(func() {
		g.kill()
		if log := g.logs(); t.Failed() || strings.Contains(log, "DATA RACE") {
			t.Logf("dedupgw log:\n%s", log)
		}
		if strings.Contains(g.logs(), "DATA RACE") {
			t.Error("got a data race in dedupgw, want none")
		}
	})
	select {
	case <-g.started:
		if g.startedErr != nil {
			t.Fatalf("dedupgw start: %v\n%s", g.startedErr, g.logs())
		}
	case <-g.done:
		t.Fatalf("dedupgw exited with %d before it started:\n%s", g.exitCode, g.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("dedupgw did not log its addresses within 30s:\n%s", g.logs())
	}
	return g
}

// readLog copies the process's stderr into g.log, reports the start-up
// line, and records the exit.
func (g *gateway) readLog(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	startSeen := false
	for sc.Scan() {
		line := sc.Text()
		g.logMu.Lock()
		g.log.WriteString(line + "\n")
		g.logMu.Unlock()
		if startSeen {
			continue
		}
		var entry struct {
			Msg         string `json:"msg"`
			Listen      string `json:"listen"`
			AdminListen string `json:"admin_listen"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "dedupgw started" {
			startSeen = true
			g.addr, g.admin = entry.Listen, entry.AdminListen
			if g.addr == "" || g.admin == "" {
				g.startedErr = fmt.Errorf("start line without addresses: %s", line)
			}
			close(g.started)
		}
	}
	err := g.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		g.exitCode = ee.ExitCode()
	default:
		g.exitCode = -1
	}
	close(g.done)
}

func (g *gateway) logs() string {
	g.logMu.Lock()
	defer g.logMu.Unlock()
	return g.log.String()
}

// url returns the gateway URL of path.
func (g *gateway) url(path string) string { return "http://" + g.addr + path }

// adminURL returns the admin URL of path.
func (g *gateway) adminURL(path string) string { return "http://" + g.admin + path }

func (g *gateway) signal(sig os.Signal) {
	g.t.Helper()
	if err := g.cmd.Process.Signal(sig); err != nil {
		g.t.Fatalf("signal %v: %v", sig, err)
	}
}

// kill sends SIGKILL (if still running) and waits for the exit.
func (g *gateway) kill() {
	select {
	case <-g.done:
		return
	default:
	}
	_ = g.cmd.Process.Kill()
	<-g.done
}

// wait waits for the process to exit and returns its exit code.
func (g *gateway) wait(timeout time.Duration) int {
	g.t.Helper()
	select {
	case <-g.done:
		return g.exitCode
	case <-time.After(timeout):
		g.t.Fatalf("dedupgw still running after %v", timeout)
		return -1
	}
}

// waitLog polls the log until it contains s, or fails the test.
func (g *gateway) waitLog(s string, count int) {
	g.t.Helper()
	eventually(g.t, 15*time.Second, func() bool { return strings.Count(g.logs(), s) >= count },
		func() string { return fmt.Sprintf("log line %q %d times; log:\n%s", s, count, g.logs()) })
}

// eventually polls cond every 20ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, cond func() bool, what func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what())
		}
		<-tick.C
	}
}

// answer is what a delivery got.
type answer struct {
	status int
	dedup  string // Dedup-Status
	body   string
}

var client = &http.Client{Timeout: 30 * time.Second}

// deliver POSTs body to url with Idempotency-Key key.
func deliver(t *testing.T, url, key, body string) answer {
	t.Helper()
	a, err := tryDeliver(url, key, body)
	if err != nil {
		t.Fatalf("deliver %s: %v", key, err)
	}
	return a
}

func tryDeliver(url, key, body string) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{status: resp.StatusCode, dedup: resp.Header.Get("Dedup-Status"), body: string(b)}, nil
}

func wantAnswer(t *testing.T, what string, got answer, status int, dedup string) {
	t.Helper()
	if got.status != status || got.dedup != dedup {
		t.Errorf("%s: got %d Dedup-Status %q (%s), want %d %q", what, got.status, got.dedup, got.body, status, dedup)
	}
}

func wantHits(t *testing.T, u *upstream, key string, want int) {
	t.Helper()
	if got := u.count("orders:" + key); got != want {
		t.Errorf("upstream deliveries of %s: got %d, want %d", key, got, want)
	}
}

func TestE2EDuplicateNotForwarded(t *testing.T) {
	u := newUpstream(t)
	g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", ""))
	url := g.url("/hooks/orders")

	first := deliver(t, url, "evt_1", `{"id":"evt_1"}`)
	wantAnswer(t, "first delivery", first, 200, "forwarded")
	if first.body != `{"ok":true}` {
		t.Errorf("first delivery body: got %q, want the upstream's %q", first.body, `{"ok":true}`)
	}
	dup := deliver(t, url, "evt_1", `{"id":"evt_1"}`)
	wantAnswer(t, "duplicate", dup, 200, "duplicate")
	var ack struct{ Status, Route, Key string }
	if err := json.Unmarshal([]byte(dup.body), &ack); err != nil || ack.Status != "duplicate" || ack.Key != "evt_1" || ack.Route != "orders" {
		t.Errorf("duplicate body: got %s (%v), want status duplicate, route orders, key evt_1", dup.body, err)
	}
	wantHits(t, u, "evt_1", 1)
}

func TestE2EFailureThenRetry(t *testing.T) {
	u := newUpstream(t)
	u.setHandler(func(w http.ResponseWriter, _ *http.Request, n int) {
		if n == 1 {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "done")
	})
	g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", ""))
	url := g.url("/hooks/orders")

	wantAnswer(t, "first delivery (upstream 500)", deliver(t, url, "evt_r", "{}"), 500, "forwarded")
	wantAnswer(t, "retry", deliver(t, url, "evt_r", "{}"), 200, "forwarded")
	wantAnswer(t, "after success", deliver(t, url, "evt_r", "{}"), 200, "duplicate")
	wantHits(t, u, "evt_r", 2)
}

func TestE2EConcurrentCopiesForwardedOnce(t *testing.T) {
	u := newUpstream(t)
	g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", ""))
	url := g.url("/hooks/orders")

	const copies = 40
	answers := make([]answer, copies)
	errs := make([]error, copies)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range copies {
		wg.Go(func() {
			<-start
			answers[i], errs[i] = tryDeliver(url, "evt_c", `{"id":"evt_c"}`)
		})
	}
	close(start)
	wg.Wait()

	forwarded := 0
	for i, a := range answers {
		if errs[i] != nil {
			t.Errorf("copy %d: %v", i, errs[i])
			continue
		}
		switch {
		case a.status == 200 && a.dedup == "forwarded":
			forwarded++
		case a.status == 200 && a.dedup == "duplicate", a.status == 409 && a.dedup == "in-flight":
		default:
			t.Errorf("copy %d: got %d %q, want 200 forwarded/duplicate or 409 in-flight", i, a.status, a.dedup)
		}
	}
	if forwarded != 1 {
		t.Errorf("forwarded answers: got %d, want 1", forwarded)
	}
	wantHits(t, u, "evt_c", 1)
}

func TestE2EProcessedKeySurvivesKill9(t *testing.T) {
	u := newUpstream(t)
	cfg := gwConfig(t, t.TempDir(), u.URL, "", "")
	g := startGateway(t, cfg)
	wantAnswer(t, "first delivery", deliver(t, g.url("/hooks/orders"), "evt_k", "{}"), 200, "forwarded")
	g.kill() // SIGKILL: no shutdown code runs
	if got := g.exitCode; got != -1 {
		t.Errorf("exit code after kill -9: got %d, want -1 (killed by a signal)", got)
	}

	g2 := startGateway(t, cfg)
	wantAnswer(t, "after restart", deliver(t, g2.url("/hooks/orders"), "evt_k", "{}"), 200, "duplicate")
	wantHits(t, u, "evt_k", 1)
}

func TestE2EWindowExpires(t *testing.T) {
	const window = 400 * time.Millisecond
	u := newUpstream(t)
	g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", fmt.Sprintf("    window: %v\n", window)))
	url := g.url("/hooks/orders")

	sent := time.Now()
	wantAnswer(t, "first delivery", deliver(t, url, "evt_w", "{}"), 200, "forwarded")
	if a := deliver(t, url, "evt_w", "{}"); time.Since(sent) < window {
		wantAnswer(t, "inside the window", a, 200, "duplicate")
	}
	var last answer
	eventually(t, 10*time.Second, func() bool {
		last = deliver(t, url, "evt_w", "{}")
		return last.dedup == "forwarded"
	}, func() string { return fmt.Sprintf("a forwarded delivery after the window; last %+v", last) })
	if elapsed := time.Since(sent); elapsed < window {
		t.Errorf("forwarded again after %v, want not before the %v window", elapsed, window)
	}
	wantHits(t, u, "evt_w", 2)
}

func TestE2ERejections(t *testing.T) {
	u := newUpstream(t)
	g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", "    max_body_bytes: 16\n"))

	tests := []struct {
		name   string
		path   string
		body   string
		status int
		dedup  string
	}{
		{"body too large", "/hooks/orders", strings.Repeat("x", 17), 413, "rejected"},
		{"body at the limit", "/hooks/orders", strings.Repeat("x", 16), 200, "forwarded"},
		{"no route", "/hooks/nope", "{}", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := u.total.Load()
			a := deliver(t, g.url(tt.path), "evt_"+strings.ReplaceAll(tt.name, " ", "_"), tt.body)
			wantAnswer(t, tt.name, a, tt.status, tt.dedup)
			wantUp := int64(0)
			if tt.status == 200 {
				wantUp = 1
			}
			if got := u.total.Load() - before; got != wantUp {
				t.Errorf("upstream deliveries: got %d, want %d", got, wantUp)
			}
		})
	}
}

// A serve that fails before it serves says it could not start, not that
// it stopped: an operator reading the log looks for a start-up problem.
func TestServeThatCannotStartSaysSo(t *testing.T) {
	dir := t.TempDir()
	cfg := gwConfig(t, dir, "http://127.0.0.1:3000", "", "")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	code, _, stderr := runCLI(t, []string{"DEDUPGW_LISTEN=" + taken.Addr().String()}, "serve", "--config", cfg)
	if code != 1 {
		t.Errorf("exit code: got %d, want 1", code)
	}
	for _, want := range []string{`"msg":"dedupgw could not start"`, "listen: listen tcp " + taken.Addr().String()} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr: got %s, want it to contain %q", stderr, want)
		}
	}
	if strings.Contains(stderr, "stopped with an error") {
		t.Errorf("stderr: got %s, want no \"stopped with an error\"", stderr)
	}
}

// runCLI runs the dedupgw binary with args and env added to the environment.
func runCLI(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(testEnv(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("run %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

func TestE2EValidateAndVersion(t *testing.T) {
	dir := t.TempDir()
	good := gwConfig(t, dir, "http://127.0.0.1:3000", "", "")
	replay := gwConfig(t, t.TempDir(), "http://127.0.0.1:3000", "", "    duplicate_response: replay\n")
	scoped := gwConfig(t, t.TempDir(), "http://127.0.0.1:3000", "", "    duplicate_response: replay\n    client_identity: Authorization\n")
	longFailed := gwConfig(t, t.TempDir(), "http://127.0.0.1:3000", "", "    failed_retention: 48h\n")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(`
listen: "127.0.0.1:0"
defaults:
  lease: 10s
  upstream_timeout: 30s
routes:
  - name: a
    path: /a
    upstream: http://127.0.0.1:3000
    provider: paypal
    windw: 1h
  - name: a
    path: b
    upstream: http://127.0.0.1:3000
    provider: stripe
    secrets: ["${E2E_UNSET_SECRET}"]
`), 0o600); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     []string
		stderr     []string
		stderrNone []string
	}{
		{"valid", []string{"validate", "--config", good}, 0, []string{"ok (store bolt; 1 route: orders)"}, nil, []string{"warning"}},
		{"replay shared across clients", []string{"validate", "--config", replay}, 0, []string{"ok"},
			[]string{`warning: routes[0].client_identity: route "orders" replays stored answers without client_identity`}, nil},
		{"replay scoped per client", []string{"validate", "--config", scoped}, 0, []string{"ok"}, nil, []string{"warning"}},
		{"failed kept longer than processed", []string{"validate", "--config", longFailed}, 0, []string{"ok"},
			[]string{`warning: routes[0].failed_retention: route "orders" keeps failed keys (48h0m0s) longer than processed ones (window 24h0m0s)`}, nil},
		{"invalid lists every problem", []string{"validate", "--config", bad}, 1, nil, []string{
			"6 problems:",
			"routes[0].windw: unknown key",
			"defaults.lease: 10s must be longer than upstream_timeout 30s",
			`routes[0].provider: unknown provider "paypal"`,
			`routes[1].name: duplicate route name "a" (also routes[0])`,
			`routes[1].path: must start with "/", got "b"`,
			"routes[1].secrets[0]: must not be empty (environment variable E2E_UNSET_SECRET is not set)",
			"more checks (warnings about likely mistakes) run once these problems are fixed",
		}, nil},
		{"missing file", []string{"validate", "--config", filepath.Join(dir, "nope.yaml")}, 1, nil, []string{"read config"}, []string{"more checks"}},
		{"missing --config", []string{"validate"}, 2, nil, []string{"missing --config FILE"}, nil},
		{"file without --config", []string{"validate", good}, 2, nil, []string{`unexpected argument "` + good + `" (did you mean --config ` + good + `?)`}, nil},
		{"file besides --config", []string{"serve", "--config", good, "extra.yaml"}, 2, nil, []string{`unexpected argument "extra.yaml"`}, []string{"did you mean"}},
		{"a word without --config", []string{"validate", "help"}, 2, nil, []string{`unexpected argument "help"`}, []string{"did you mean"}},
		{"a YAML path with a space", []string{"validate", "my config.yaml"}, 2, nil, []string{`(did you mean --config 'my config.yaml'?)`}, nil},
		{"unknown flag", []string{"validate", "--confg", good}, 2, nil, []string{"flag provided but not defined"}, nil},
		{"serve invalid", []string{"serve", "--config", bad}, 1, nil, []string{"routes[0].windw: unknown key"}, []string{"dedupgw started"}},
		{"version", []string{"version"}, 0, []string{"dedupgw " + testVersion + " go1."}, nil, nil},
		{"no command", nil, 2, nil, []string{"Usage:"}, nil},
		{"unknown command", []string{"frobnicate"}, 2, nil, []string{`unknown command "frobnicate"`}, nil},
		{"help", []string{"help"}, 0, []string{"dedupgw serve --config FILE"}, nil, nil},
		// Asking for help is no command-line error: exit 0.
		{"serve --help", []string{"serve", "--help"}, 0, nil, []string{"-config"}, nil},
		{"validate -h", []string{"validate", "-h"}, 0, nil, []string{"-config"}, nil},
		{"keys --help", []string{"keys", "--help"}, 0, []string{"dedupgw keys get"}, nil, []string{"unknown subcommand"}},
		{"keys forget --help", []string{"keys", "forget", "--help"}, 0, nil, []string{"-force"}, nil},
		{"keys without args", []string{"keys", "get"}, 2, nil, []string{"dedupgw keys get: missing ROUTE and KEY", "Usage:"}, nil},
		{"keys without a key", []string{"keys", "get", "slow"}, 2, nil, []string{`dedupgw keys get: missing KEY after ROUTE "slow"`}, nil},
		{"keys without a subcommand", []string{"keys"}, 2, nil, []string{"dedupgw keys: missing subcommand (get, list or forget)"}, nil},
		{"keys list without a route", []string{"keys", "list"}, 2, nil, []string{"dedupgw keys list: missing ROUTE"}, nil},
		{"keys list with a key", []string{"keys", "list", "orders", "evt_1"}, 2, nil, []string{"dedupgw keys list: want ROUTE alone, got 2"}, nil},
		{"keys list flag after the route", []string{"keys", "list", "orders", "--state", "failed"}, 2, nil, []string{"flags go before ROUTE"}, nil},
		{"keys list with an unknown state", []string{"keys", "list", "--state", "done", "orders"}, 2, nil, []string{"--state done: want processing, processed or failed"}, nil},
		{"keys list --help", []string{"keys", "list", "--help"}, 0, nil, []string{"-since", "-limit"}, nil},
		{"keys forget with a key and filters", []string{"keys", "forget", "--state", "failed", "orders", "evt_1"}, 2, nil, []string{"give either KEY or filters"}, nil},
		{"keys forget without a key or filters", []string{"keys", "forget", "orders"}, 2, nil, []string{"to forget by state or time, give --state"}, nil},
		{"keys unknown subcommand", []string{"keys", "drop"}, 2, nil, []string{`dedupgw keys: unknown subcommand "drop" (want get, list or forget)`}, nil},
		{"keys flag after the key", []string{"keys", "get", "orders", "evt_1", "--admin", "http://127.0.0.1:1"}, 2, nil, []string{"flags go before ROUTE and KEY"}, nil},
		// Not a key named --yes (an on-call trial forgot "stripe/--yes").
		{"keys forget --yes after the route", []string{"keys", "forget", "orders", "--yes"}, 2, nil, []string{"flags go before ROUTE and KEY"}, []string{"--yes: not found"}},
		{"keys forget filters after the route", []string{"keys", "forget", "orders", "--state", "failed"}, 2, nil, []string{"flags go before ROUTE"}, []string{"want ROUTE and KEY"}},
		{"keys forget -force=true after the route", []string{"keys", "forget", "orders", "-force=true"}, 2, nil, []string{"flags go before ROUTE"}, nil},
		{"keys forget of one key with --include-maybe-processed", []string{"keys", "forget", "--include-maybe-processed", "orders", "evt_1"}, 2, nil, []string{"--include-maybe-processed applies to a forget by filters"}, nil},
		// After --, a key that looks like a flag is a key.
		{"keys forget -- a key named --yes", []string{"keys", "forget", "--admin", "http://127.0.0.1:1", "--", "orders", "--yes"}, 1, nil, []string{"/v1/keys/orders/--yes"}, []string{"flags go before"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, nil, tt.args...)
			if code != tt.code {
				t.Errorf("exit code: got %d, want %d\nstdout: %s\nstderr: %s", code, tt.code, stdout, stderr)
			}
			for _, s := range tt.stdout {
				if !strings.Contains(stdout, s) {
					t.Errorf("stdout: got %q, want it to contain %q", stdout, s)
				}
			}
			for _, s := range tt.stderr {
				if !strings.Contains(stderr, s) {
					t.Errorf("stderr: got %q, want it to contain %q", stderr, s)
				}
			}
			for _, s := range tt.stderrNone {
				if strings.Contains(stderr, s) {
					t.Errorf("stderr: got %q, want no %q", stderr, s)
				}
			}
		})
	}
}

// validate warns about the environment even when the file has problems: a
// misspelt or empty variable may be their cause. (Found by an operator
// trial: the warnings showed only once the file was valid.)
func TestE2EValidateWarnsAboutTheEnvironmentOfAnInvalidFile(t *testing.T) {
	bad := gwConfig(t, t.TempDir(), "http://127.0.0.1:3000", "", "    windw: 1h\n")
	code, _, stderr := runCLI(t, []string{"DEDUPGW_LOG_LEVLE=debug", "DEDUPGW_ADMIN_TOKEN="}, "validate", "--config", bad)
	if code != 1 {
		t.Errorf("exit code: got %d, want 1", code)
	}
	for _, want := range []string{
		"routes[0].windw: unknown key",
		"warning: DEDUPGW_LOG_LEVLE overrides no configuration key and is ignored (did you mean DEDUPGW_LOG_LEVEL?)",
		"warning: admin.token: DEDUPGW_ADMIN_TOKEN is set but empty",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr: got %q, want it to contain %q", stderr, want)
		}
	}
}

func TestE2EKeysCLI(t *testing.T) {
	const token = "e2e-admin-token"
	u := newUpstream(t)
	g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", ""), "DEDUPGW_ADMIN_TOKEN="+token)
	url := g.url("/hooks/orders")
	wantAnswer(t, "first delivery", deliver(t, url, "evt/1", "{}"), 200, "forwarded")
	wantAnswer(t, "key ..", deliver(t, url, "..", "{}"), 200, "forwarded")

	admin := "--admin=" + g.adminURL("")
	withToken := []string{"DEDUPGW_ADMIN_TOKEN=" + token}
	noToken := []string{"DEDUPGW_ADMIN_TOKEN="}
	wrongToken := []string{"DEDUPGW_ADMIN_TOKEN=nope"}

	steps := []struct {
		name   string
		env    []string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"get without token", noToken, []string{"keys", "get", admin, "orders", "evt/1"}, 1, "", "unauthorized: set DEDUPGW_ADMIN_TOKEN"},
		{"get with wrong token", wrongToken, []string{"keys", "get", admin, "orders", "evt/1"}, 1, "", "unauthorized: the gateway refused the token in DEDUPGW_ADMIN_TOKEN"},
		{"forget without token", noToken, []string{"keys", "forget", admin, "orders", "evt/1"}, 1, "", "unauthorized"},
		{"get", withToken, []string{"keys", "get", admin, "orders", "evt/1"}, 0, `"state": "processed"`, ""},
		{"get unknown key", withToken, []string{"keys", "get", admin, "orders", "evt/none"}, 1, "", "not found"},
		{"get unknown route", withToken, []string{"keys", "get", admin, "nope", "evt/1"}, 1, "", "not found"},
		{"forget", withToken, []string{"keys", "forget", admin, "orders", "evt/1"}, 0, "forgot orders/evt/1", ""},
		{"get after forget", withToken, []string{"keys", "get", admin, "orders", "evt/1"}, 1, "", "not found"},
		{"forget again", withToken, []string{"keys", "forget", admin, "orders", "evt/1"}, 1, "", "not found"},
		{"get a key that is a dot segment", withToken, []string{"keys", "get", admin, "orders", ".."}, 0, `"key": ".."`, ""},
		{"unreachable admin", withToken, []string{"keys", "get", "--admin=http://127.0.0.1:1", "orders", "evt/1"}, 1, "", "connection refused"},
		// --admin at the webhook listener says so, not "no route".
		{"get from the webhook listener", withToken, []string{"keys", "get", "--admin=" + g.url(""), "orders", "evt_1"}, 1, "", "answered as the gateway's webhook listener, not its admin API"},
		{"list from the webhook listener", withToken, []string{"keys", "list", "--admin=" + g.url(""), "orders"}, 1, "", "answered as the gateway's webhook listener, not its admin API"},
	}
	for _, s := range steps {
		code, stdout, stderr := runCLI(t, s.env, s.args...)
		if code != s.code {
			t.Errorf("%s: exit code: got %d, want %d\nstdout: %s\nstderr: %s", s.name, code, s.code, stdout, stderr)
		}
		if !strings.Contains(stdout, s.stdout) {
			t.Errorf("%s: stdout: got %q, want it to contain %q", s.name, stdout, s.stdout)
		}
		if !strings.Contains(stderr, s.stderr) {
			t.Errorf("%s: stderr: got %q, want it to contain %q", s.name, stderr, s.stderr)
		}
	}
	wantAnswer(t, "delivery after forget", deliver(t, url, "evt/1", "{}"), 200, "forwarded")
	wantHits(t, u, "evt/1", 2)

	// A key whose delivery is in flight is forgotten only with --force.
	release := make(chan struct{})
	u.setHandler(func(w http.ResponseWriter, _ *http.Request, _ int) { <-release })
	done := make(chan error, 1)
	go func() { _, err := tryDeliver(url, "evt/busy", "{}"); done <- err }()
	eventually(t, 10*time.Second, func() bool { return u.count("orders:evt/busy") == 1 }, func() string { return "the delivery at the upstream" })
	code, _, stderr := runCLI(t, withToken, "keys", "forget", admin, "orders", "evt/busy")
	if code != 1 || !strings.Contains(stderr, "in flight") || !strings.Contains(stderr, "--force") {
		t.Errorf("forget in flight: got exit %d, stderr %q; want 1 saying in flight and --force", code, stderr)
	}
	if code, stdout, stderr := runCLI(t, withToken, "keys", "forget", admin, "--force", "orders", "evt/busy"); code != 0 || !strings.Contains(stdout, "will not be recorded") {
		t.Errorf("forget --force: got exit %d\nstdout: %s\nstderr: %s\nwant 0 and a warning that the delivery in flight will not be recorded", code, stdout, stderr)
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("the held delivery: %v", err)
	}
}

// metricValue returns the value of the sample line starting with series
// ("name{labels}") on the admin /metrics page, or "" if absent.
func metricValue(t *testing.T, g *gateway, series string) string {
	t.Helper()
	resp, err := client.Get(g.adminURL("/metrics"))
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}

func TestE2EReloadOnSIGHUP(t *testing.T) {
	u := newUpstream(t)
	dir := t.TempDir()
	cfg := gwConfig(t, dir, u.URL, "", "    window: 1h\n")
	g := startGateway(t, cfg)
	url := g.url("/hooks/orders")

	// Deliveries flow the whole time; every one must succeed.
	stop := make(chan struct{})
	var sent, failed atomic.Int64
	var failures sync.Map
	var flow sync.WaitGroup
	for w := range 4 {
		flow.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a, err := tryDeliver(url, fmt.Sprintf("flow-%d-%d", w, i), "{}")
				sent.Add(1)
				if err != nil || a.status != 200 || a.dedup != "forwarded" {
					failed.Add(1)
					failures.Store(fmt.Sprintf("flow-%d-%d", w, i), fmt.Sprintf("%+v %v", a, err))
				}
			}
		})
	}

	wantAnswer(t, "first delivery", deliver(t, url, "evt_h1", "{}"), 200, "forwarded")

	// A shorter window by SIGHUP: new keys expire after it.
	gwConfig(t, dir, u.URL, "", "    window: 300ms\n")
	g.signal(syscall.SIGHUP)
	g.waitLog(`"msg":"config reloaded"`, 1)
	sent2 := time.Now()
	wantAnswer(t, "new key after reload", deliver(t, url, "evt_h2", "{}"), 200, "forwarded")
	eventually(t, 10*time.Second, func() bool {
		return deliver(t, url, "evt_h2", "{}").dedup == "forwarded"
	}, func() string { return "evt_h2 forwarded again after the reloaded 300ms window" })
	if time.Since(sent2) < 300*time.Millisecond {
		t.Errorf("evt_h2 forwarded again after %v, want after the 300ms window", time.Since(sent2))
	}
	// The key committed before the reload keeps the window it was committed with.
	wantAnswer(t, "key committed before the reload", deliver(t, url, "evt_h1", "{}"), 200, "duplicate")

	// A broken file is rejected and the running config keeps serving.
	writeFileAtomic(t, cfg, "routes:\n  - name: [broken\n")
	g.signal(syscall.SIGHUP)
	g.waitLog("config reload rejected", 1)
	writeFileAtomic(t, cfg, "listen: \"127.0.0.1:0\"\nroutes:\n  - name: orders\n    path: /x\n    upstream: http://127.0.0.1:1\n    keys: [body]\n    windw: 1s\n")
	g.signal(syscall.SIGHUP)
	g.waitLog("config reload rejected", 2)
	if !strings.Contains(g.logs(), "routes[0].windw: unknown key") {
		t.Errorf("log: got no %q in the rejection", "routes[0].windw: unknown key")
	}
	wantAnswer(t, "after rejected reloads", deliver(t, url, "evt_h3", "{}"), 200, "forwarded")
	wantAnswer(t, "duplicate after rejected reloads", deliver(t, url, "evt_h3", "{}"), 200, "duplicate")

	close(stop)
	flow.Wait()
	if sent.Load() == 0 {
		t.Error("flowing deliveries: got none sent, want some")
	}
	if n := failed.Load(); n > 0 {
		failures.Range(func(k, v any) bool { t.Logf("failed %v: %v", k, v); return true })
		t.Errorf("flowing deliveries: got %d of %d failed, want none", n, sent.Load())
	}
	for series, want := range map[string]string{
		`dedupgw_config_reloads_total{result="success"}`: "1",
		`dedupgw_config_reloads_total{result="failure"}`: "2",
		// bolt's own series (the file is bolt), not rebuilt by reloads
		`dedupgw_bolt_checkpoint_failures_total`:   "0",
		`dedupgw_bolt_swept_records_total`:         "0",
		`dedupgw_bolt_journal_backlog_limit_bytes`: "6.7108864e+07",
		// pinged at start, and every 10 s, with nothing probing /readyz
		`dedupgw_store_up{backend="bolt"}`: "1",
	} {
		if got := metricValue(t, g, series); got != want {
			t.Errorf("%s: got %q, want %q", series, got, want)
		}
	}
	if got := metricValue(t, g, "dedupgw_bolt_journal_backlog_bytes"); got == "" {
		t.Error("dedupgw_bolt_journal_backlog_bytes: got no sample, want one")
	}
	if got, err := strconv.ParseFloat(metricValue(t, g, "dedupgw_bolt_file_bytes"), 64); err != nil || got < 32<<10 {
		t.Errorf("dedupgw_bolt_file_bytes: got %v (%v), want the file's size, at least bbolt's first 32 KiB", got, err)
	}
}

func TestE2ESIGTERMDrainsInFlight(t *testing.T) {
	u := newUpstream(t)
	arrived := make(chan struct{})
	release := make(chan struct{})
	u.setHandler(func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Dedup-Key") == "orders:evt_t" && n == 1 {
			close(arrived)
			select {
			case <-release:
			case <-r.Context().Done(): // the test failed and killed the gateway
			}
		}
		_, _ = io.WriteString(w, "processed")
	})
	cfg := gwConfig(t, t.TempDir(), u.URL, "", "")
	g := startGateway(t, cfg)
	url := g.url("/hooks/orders")

	type result struct {
		a   answer
		err error
	}
	inflight := make(chan result, 1)
	go func() {
		a, err := tryDeliver(url, "evt_t", "{}")
		inflight <- result{a, err}
	}()
	select {
	case <-arrived:
	case <-time.After(15 * time.Second):
		t.Fatal("delivery did not reach the upstream within 15s")
	}
	g.signal(syscall.SIGTERM)
	g.waitLog("signal received: draining", 1)
	// Shutdown closes the listener: new connections are refused while the
	// in-flight delivery is still running.
	eventually(t, 10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", g.addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	}, func() string { return "the listener to close during the drain" })
	// The admin listener still answers, and says the replica is not ready.
	resp, err := http.Get(g.adminURL("/readyz"))
	if err != nil {
		t.Fatalf("GET /readyz during the drain: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), "draining") {
		t.Errorf("GET /readyz during the drain: got %d %s, want 503 draining", resp.StatusCode, body)
	}
	select {
	case <-g.done:
		t.Fatal("dedupgw exited before the in-flight delivery finished")
	default:
	}
	close(release)

	var r result
	select {
	case r = <-inflight:
	case <-time.After(30 * time.Second):
		t.Fatal("in-flight delivery: no answer within 30s of its release")
	}
	if r.err != nil {
		t.Fatalf("in-flight delivery: %v", r.err)
	}
	wantAnswer(t, "in-flight delivery", r.a, 200, "forwarded")
	if code := g.wait(30 * time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM: got %d, want 0", code)
	}

	g2 := startGateway(t, cfg)
	wantAnswer(t, "after restart", deliver(t, g2.url("/hooks/orders"), "evt_t", "{}"), 200, "duplicate")
	wantHits(t, u, "evt_t", 1)
}

// TestE2EDashboardRuntimeSeries checks that every Go runtime and process
// series (go_*, process_*) the shipped Grafana dashboard queries, and the
// dedupgw_build_info it joins them on, is on a running gateway's /metrics.
// (proxy's TestDashboardQueriesKnownMetrics checks the dedupgw_* ones.)
func TestE2EDashboardRuntimeSeries(t *testing.T) {
	raw, err := os.ReadFile("../../helm/dedupgw/dashboards/dedupgw.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	series := regexp.MustCompile(`\b(?:go|process)_[a-z_]+|\bdedupgw_build_info\b`)
	want := map[string]bool{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, name := range series.FindAllString(tg.Expr, -1) {
				want[name] = true
			}
		}
	}
	if len(want) == 0 {
		t.Fatal("got no go_* or process_* series in the dashboard, want the memory panel's")
	}

	u := newUpstream(t)
	g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", ""))
	resp, err := client.Get(g.adminURL("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for name := range want {
		if !regexp.MustCompile(`(?m)^` + name + `[ {]`).Match(b) {
			t.Errorf("dashboard queries %s: got no such series on /metrics", name)
		}
	}
}

// TestE2EServeNamesTheOverrideAMisspeltVariableMeant: serve's start-up
// warning about a DEDUPGW_* variable that overrides nothing carries the
// override it is closest to as did_you_mean, as validate's does; a name
// close to none gets no guess.
func TestE2EServeNamesTheOverrideAMisspeltVariableMeant(t *testing.T) {
	const msg = "environment variable overrides no configuration key; ignored (misspelt?)"
	g := startGateway(t, gwConfig(t, t.TempDir(), "http://127.0.0.1:3000", "", ""),
		"DEDUPGW_LOG_LEVLE=debug", "DEDUPGW_SOMETHING_ELSE=1")
	got := map[string]string{}
	for line := range strings.Lines(g.logs()) {
		var e struct {
			Msg        string `json:"msg"`
			Variable   string `json:"variable"`
			DidYouMean string `json:"did_you_mean"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && e.Msg == msg {
			got[e.Variable] = e.DidYouMean
		}
	}
	want := map[string]string{"DEDUPGW_LOG_LEVLE": "DEDUPGW_LOG_LEVEL", "DEDUPGW_SOMETHING_ELSE": ""}
	if !maps.Equal(got, want) {
		t.Errorf("warnings (variable: did_you_mean): got %v, want %v", got, want)
	}
}
