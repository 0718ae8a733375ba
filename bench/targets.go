package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Target names accepted by -targets, in the order the table lists them.
const (
	TargetUpstream = "upstream" // the upstream app directly: the physical limit
	TargetBare     = "bare"     // a bare httputil.ReverseProxy: the baseline
	TargetNginx    = "nginx"    // nginx as a keep-alive reverse proxy, when installed
	TargetMemory   = "memory"   // dedupgw, store.backend: memory
	TargetBolt     = "bolt"     // dedupgw, store.backend: bolt
	TargetRedis    = "redis"    // dedupgw, store.backend: redis
)

// allTargets lists every target in table order.
var allTargets = []string{TargetUpstream, TargetBare, TargetNginx, TargetMemory, TargetBolt, TargetRedis}

// webhookPath is where every target receives events: the route of the dedupgw
// config and a path the upstream and plain proxies pass through.
const webhookPath = "/webhooks/stripe"

// readyTimeout bounds how long a process may take to start listening.
const readyTimeout = 15 * time.Second

// target is one system under test, running in its own process(es).
type target struct {
	name    string   // as in -targets
	label   string   // as in the table
	url     string   // where events are posted
	gateway bool     // dedupgw: duplicates are answered without the upstream
	procs   []*child // stopped in reverse order by stop
	// cpuProcs are the processes whose CPU time is the target's: its own, or
	// the upstream's for the upstream itself.
	cpuProcs []*child
	// storeProc is the redis-server a dedupgw redis target started, whose
	// CPU time is part of the target's: reported on its own too, to tell
	// the gateway's cost from the co-located Redis's. Nil for other targets.
	storeProc *child
	// metrics is dedupgw's admin /metrics URL, empty for other targets.
	metrics string
	// pprof is the address of the target's net/http/pprof listener, empty
	// unless the run profiles (-cpuprofile) and the target supports it.
	pprof string
}

// pprofEnvVar names the variable that asks the bare proxy, and a dedupgw
// built by the runner for profiling, to serve net/http/pprof on its value.
const pprofEnvVar = "DEDUPGW_BENCH_PPROF"

// pprofEnv returns the environment that makes the target serve pprof, and
// records the address, when the run profiles; else nil.
func (t *target) pprofEnv(e *env, supported bool) ([]string, error) {
	if !e.profile || !supported {
		return nil, nil
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	t.pprof = addr
	return []string{pprofEnvVar + "=" + addr}, nil
}

// stop stops the target's processes, last started first.
func (t *target) stop() {
	for i := len(t.procs) - 1; i >= 0; i-- {
		t.procs[i].Stop()
	}
}

// altSuffix marks a target that runs the -dedupgw-alt binary ("bolt@alt"), for
// A/B comparisons of two dedupgw builds in one interleaved run.
const altSuffix = "@alt"

// backendOf returns the target name without altSuffix.
func backendOf(name string) string { return strings.TrimSuffix(name, altSuffix) }

// isAlt reports whether the named target runs the -dedupgw-alt binary.
func isAlt(name string) bool { return strings.HasSuffix(name, altSuffix) }

// isGateway reports whether the named target is dedupgw.
func isGateway(name string) bool {
	b := backendOf(name)
	return b == TargetMemory || b == TargetBolt || b == TargetRedis
}

// labelOf returns the table label of a target name.
func labelOf(name string) string {
	switch name {
	case TargetUpstream:
		return "upstream (direct)"
	case TargetBare:
		return "bare ReverseProxy"
	case TargetNginx:
		return "nginx"
	}
	if isAlt(name) {
		return "dedupgw " + backendOf(name) + " (alt)"
	}
	return "dedupgw " + name
}

// env is what starting a target needs.
type env struct {
	dir     string // the run's temporary directory: configs, logs, databases
	self    string // the runner's own executable, re-run as upstream and bare proxy
	dedupgw string // the dedupgw binary, empty when it could not be built
	// dedupgwPprof is set when dedupgw was built with the pprof overlay.
	dedupgwPprof bool
	dedupgwAlt   string // the -dedupgw-alt binary, for targets named with altSuffix
	nginx        string // the nginx binary, empty when not installed
	upstreamURL  string // base URL of the upstream app
	concurrency  int
	logLevel     string // dedupgw's log.level
	bareGOGC     string // GOGC for the bare proxy, "" for none
	profile      bool   // targets serve pprof (see pprofEnv)
}

// startUpstream starts the upstream app in its own process and returns it with
// its base URL.
func startUpstream(ctx context.Context, e *env) (*child, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	c, err := startChild(ctx, e.dir, "upstream", nil, e.self, roleUpstream, "-listen", addr)
	if err != nil {
		return nil, "", err
	}
	base := "http://" + addr
	if err := waitReady(ctx, c, readyTimeout, httpReady(base+countPath, 200)); err != nil {
		c.Stop()
		return nil, "", err
	}
	return c, base, nil
}

// startTarget starts the named target and waits until it answers.
func startTarget(ctx context.Context, e *env, name string, up *child) (*target, error) {
	t := &target{name: name, label: labelOf(name), gateway: isGateway(name)}
	var err error
	switch backendOf(name) {
	case TargetUpstream:
		t.url = e.upstreamURL + webhookPath
	case TargetBare:
		err = startBare(ctx, e, t)
	case TargetNginx:
		err = startNginx(ctx, e, t)
	case TargetMemory, TargetBolt, TargetRedis:
		err = startDedupgw(ctx, e, t)
	default:
		err = fmt.Errorf("unknown target %q (want one of %s)", name, strings.Join(allTargets, ", "))
	}
	if err != nil {
		t.stop()
		return nil, err
	}
	t.cpuProcs = t.procs
	if backendOf(name) == TargetUpstream {
		t.cpuProcs = []*child{up}
	}
	return t, nil
}

// cpu returns the CPU time the target's processes have used so far, and
// false when it cannot be measured.
func (t *target) cpu() (time.Duration, bool) {
	return cpuOf(t.cpuProcs)
}

// storeCPU returns the CPU time the target's redis-server has used so far,
// and false when there is none or it cannot be measured.
func (t *target) storeCPU() (time.Duration, bool) {
	if t.storeProc == nil {
		return 0, false
	}
	return cpuOf([]*child{t.storeProc})
}

// cpuOf returns the CPU time procs have used so far, and false when there
// are none or one cannot be measured.
func cpuOf(procs []*child) (time.Duration, bool) {
	var sum time.Duration
	for _, c := range procs {
		d, err := cpuTime(c.cmd.Process.Pid)
		if err != nil {
			return 0, false
		}
		sum += d
	}
	return sum, len(procs) > 0
}

func startBare(ctx context.Context, e *env, t *target) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	env, err := t.pprofEnv(e, true)
	if err != nil {
		return err
	}
	if e.bareGOGC != "" {
		env = append(env, "GOGC="+e.bareGOGC)
	}
	c, err := startChild(ctx, e.dir, "bare", env, e.self, roleBareProxy,
		"-listen", addr, "-upstream", e.upstreamURL, "-max-idle", strconv.Itoa(e.concurrency*2))
	if err != nil {
		return err
	}
	t.procs = append(t.procs, c)
	t.url = "http://" + addr + webhookPath
	return waitReady(ctx, c, readyTimeout, tcpReady(addr))
}

// dedupgwConfig is the config the runner gives dedupgw: one Stripe route with
// the preset's key (json:id), no signing secret, and the log level of
// -log-level (warn by default, so no target pays for per-request logging, as
// no other target logs each request).
const dedupgwConfig = `# written by go run ./bench
listen: "{{listen}}"
admin:
  listen: "{{admin}}"
log:
  level: {{loglevel}}
  format: json
store:
  backend: {{backend}}
  bolt:
    path: "{{bolt}}"
  redis:
    addrs: ["{{redis}}"]
routes:
  - name: stripe
    path: ` + webhookPath + `
    upstream: "{{upstream}}"
    provider: stripe
`

func startDedupgw(ctx context.Context, e *env, t *target) error {
	bin, pprof := e.dedupgw, e.dedupgwPprof
	if isAlt(t.name) {
		bin, pprof = e.dedupgwAlt, false
	}
	if bin == "" {
		return fmt.Errorf("no dedupgw binary")
	}
	file := "dedupgw-" + strings.ReplaceAll(t.name, altSuffix, "-alt")
	listen, err := freeAddr()
	if err != nil {
		return err
	}
	admin, err := freeAddr()
	if err != nil {
		return err
	}
	redisAddr := "127.0.0.1:6379"
	if backendOf(t.name) == TargetRedis {
		r, addr, err := startRedis(ctx, e)
		if err != nil {
			return err
		}
		t.procs = append(t.procs, r)
		t.storeProc = r
		redisAddr = addr
	}
	cfg := strings.NewReplacer(
		"{{listen}}", listen,
		"{{admin}}", admin,
		"{{backend}}", backendOf(t.name),
		"{{bolt}}", filepath.Join(e.dir, file+".db"),
		"{{redis}}", redisAddr,
		"{{upstream}}", e.upstreamURL,
		"{{loglevel}}", e.logLevel,
	).Replace(dedupgwConfig)
	cfgPath := filepath.Join(e.dir, file+".yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("write dedupgw config: %w", err)
	}
	env, err := t.pprofEnv(e, pprof)
	if err != nil {
		return err
	}
	c, err := startChild(ctx, e.dir, file, env, bin, "serve", "--config", cfgPath)
	if err != nil {
		return err
	}
	t.procs = append(t.procs, c)
	t.url = "http://" + listen + webhookPath
	t.metrics = "http://" + admin + "/metrics"
	if err := waitReady(ctx, c, readyTimeout, httpReady("http://"+admin+"/readyz", 200)); err != nil {
		return err
	}
	return waitReady(ctx, c, readyTimeout, tcpReady(listen))
}

// startRedis starts a redis-server without persistence on a free port.
func startRedis(ctx context.Context, e *env) (*child, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", fmt.Errorf("redis target needs redis-server on PATH: %w", err)
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	_, port, _ := strings.Cut(addr, ":")
	c, err := startChild(ctx, e.dir, "redis", nil, bin,
		"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", e.dir, "--loglevel", "warning")
	if err != nil {
		return nil, "", err
	}
	if err := waitReady(ctx, c, readyTimeout, redisReady(addr)); err != nil {
		c.Stop()
		return nil, "", err
	}
	return c, addr, nil
}

// nginxConfig is a reverse proxy with keep-alive to the upstream, the way
// nginx is deployed in front of an app; no access log, like the other targets.
const nginxConfig = `# written by go run ./bench
worker_processes auto;
daemon off;
pid {{dir}}/nginx.pid;
error_log {{dir}}/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path {{dir}}/nginx-body;
  proxy_temp_path {{dir}}/nginx-proxy;
  fastcgi_temp_path {{dir}}/nginx-fastcgi;
  uwsgi_temp_path {{dir}}/nginx-uwsgi;
  scgi_temp_path {{dir}}/nginx-scgi;
  keepalive_requests 1000000;
  upstream app {
    server {{upstream}};
    keepalive {{keepalive}};
    keepalive_requests 1000000;
  }
  server {
    listen {{listen}};
    location / {
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
    }
  }
}
`

func startNginx(ctx context.Context, e *env, t *target) error {
	if e.nginx == "" {
		return fmt.Errorf("nginx is not on PATH")
	}
	listen, err := freeAddr()
	if err != nil {
		return err
	}
	cfg := strings.NewReplacer(
		"{{dir}}", e.dir,
		"{{upstream}}", strings.TrimPrefix(e.upstreamURL, "http://"),
		"{{keepalive}}", strconv.Itoa(e.concurrency*2),
		"{{listen}}", listen,
	).Replace(nginxConfig)
	cfgPath := filepath.Join(e.dir, "nginx.conf")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("write nginx config: %w", err)
	}
	c, err := startChild(ctx, e.dir, "nginx", nil, e.nginx, "-e", "stderr", "-p", e.dir, "-c", cfgPath)
	if err != nil {
		return err
	}
	t.procs = append(t.procs, c)
	t.url = "http://" + listen + webhookPath
	return waitReady(ctx, c, readyTimeout, tcpReady(listen))
}
