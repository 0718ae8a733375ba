package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// inProcess runs server.run in the test process, so the race detector and
// goleak see the serve wiring itself (the e2e tests see it from outside).
type inProcess struct {
	t       *testing.T
	sigs    chan os.Signal
	logs    *observer.ObservedLogs
	done    chan error
	addr    string
	admin   string
	client  *http.Client
	cfgPath string
	level   zap.AtomicLevel
	srv     *server
}

func startInProcess(t *testing.T, cfgPath string) *inProcess {
	t.Helper()
	return startInProcessWith(t, cfgPath, func(*server) {})
}

// startInProcessWith is startInProcess with set changing the server
// before it runs.
func startInProcessWith(t *testing.T, cfgPath string, set func(*server)) *inProcess {
	t.Helper()
	f, err := loadConfig(cfgPath, nil)
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	p := &inProcess{
		t: t, sigs: make(chan os.Signal, 1), logs: logs, done: make(chan error, 1), cfgPath: cfgPath,
		client: &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second},
	}
	p.level = zap.NewAtomicLevelAt(zap.InfoLevel)
	// The watcher does not tick unless a test sets its interval: a config
	// file a test edits before a SIGHUP is then reloaded by the SIGHUP.
	s := &server{path: cfgPath, log: zap.New(core), level: p.level, file: f, watchInterval: time.Hour}
	set(s)
	p.srv = s
	go func() { p.done <- s.run(p.sigs) }()
	p.waitLog("dedupgw started", 1)
	started := logs.FilterMessage("dedupgw started").All()[0].ContextMap()
	p.addr, p.admin = started["listen"].(string), started["admin_listen"].(string)
	return p
}

func (p *inProcess) waitLog(msg string, n int) {
	p.t.Helper()
	eventually(p.t, 10*time.Second, func() bool { return p.logs.FilterMessage(msg).Len() >= n },
		func() string { return fmt.Sprintf("%d log entries %q", n, msg) })
}

func (p *inProcess) stop() error {
	p.t.Helper()
	p.sigs <- syscall.SIGTERM
	select {
	case err := <-p.done:
		p.client.CloseIdleConnections()
		return err
	case <-time.After(30 * time.Second):
		p.t.Fatal("server.run did not return within 30s of SIGTERM")
		return nil
	}
}

func (p *inProcess) get(url string) int {
	p.t.Helper()
	resp, err := p.client.Get(url)
	if err != nil {
		p.t.Fatalf("GET %s: %v", url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// tokenConfig writes dir/config.yaml: loopback listeners, admin token
// "one", bolt in dir/x.db, one route "orders" to upstreamURL. It returns the
// path and the text.
func tokenConfig(t *testing.T, dir, upstreamURL string) (path, text string) {
	t.Helper()
	path = filepath.Join(dir, "config.yaml")
	text = fmt.Sprintf(`listen: 127.0.0.1:0
admin:
  listen: 127.0.0.1:0
  token: one
store:
  bolt:
    path: %q
routes:
  - name: orders
    path: /hooks/orders
    upstream: %q
    keys: ["header:Idempotency-Key"]
`, filepath.Join(dir, "x.db"), upstreamURL)
	writeFileAtomic(t, path, text)
	return path, text
}

func TestServeLifecycleInProcess(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer up.Close()
	dir := t.TempDir()
	cfg, text := tokenConfig(t, dir, up.URL)

	p := startInProcess(t, cfg)
	if got, want := p.logs.FilterMessage("dedupgw started").All()[0].ContextMap()["store"], filepath.Join(dir, "x.db"); got != want {
		t.Errorf("start-up line: got store %v, want %s", got, want)
	}
	if got := p.get("http://" + p.admin + "/healthz"); got != 200 {
		t.Errorf("/healthz: got %d, want 200", got)
	}
	keyURL := "http://" + p.admin + "/v1/keys/orders/k"
	authGet := func(token string) int {
		req, _ := http.NewRequest(http.MethodGet, keyURL, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := p.client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", keyURL, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := authGet("one"); got != 404 {
		t.Errorf("keys API with token one: got %d, want 404 (authorized, absent)", got)
	}

	// Reload: a new token and level apply; a store change is refused with a warning.
	writeFileAtomic(t, cfg, strings.Replace(strings.Replace(text, "token: one", "token: two", 1), "x.db", "y.db", 1)+"log:\n  level: debug\n")
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reloaded", 1)
	if got := p.logs.FilterMessage("SIGHUP received: reloading").Len(); got != 1 {
		t.Errorf("log: got %d lines saying SIGHUP was received, want 1", got)
	}
	if w := p.logs.FilterMessage("store change needs a restart: keeping the running store, applying the rest").All(); len(w) != 1 {
		t.Error("log: got no store-change warning, want one")
	} else if got := fmt.Sprint(w[0].ContextMap()["keys"]); got != "[store.bolt.path]" {
		t.Errorf("store-change warning's keys: got %s, want [store.bolt.path]", got)
	}
	if got := p.level.Level(); got != zap.DebugLevel {
		t.Errorf("log level after reload: got %v, want debug", got)
	}
	if line := p.logs.FilterMessage("config reloaded").All()[0].ContextMap(); line["routes_changed"] != nil || line["defaults_changed"] != nil {
		t.Errorf("config reloaded: got %v, want no routes or defaults named (neither changed)", line)
	}
	if got := p.logs.FilterMessage("configuration likely wrong").Len(); got != 0 {
		t.Errorf("configuration warnings after a reload to a sound file: got %d, want 0", got)
	}
	tests := []struct {
		token string
		want  int
	}{{"one", 401}, {"two", 404}}
	for _, tt := range tests {
		if got := authGet(tt.token); got != tt.want {
			t.Errorf("keys API with token %s after reload: got %d, want %d", tt.token, got, tt.want)
		}
	}

	// An invalid file is rejected and counted.
	writeFileAtomic(t, cfg, "routes: []\n")
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reload rejected: keeping the running config", 1)
	if got := authGet("two"); got != 404 {
		t.Errorf("keys API after a rejected reload: got %d, want 404 (old config serving)", got)
	}

	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "y.db")); !os.IsNotExist(err) {
		t.Errorf("y.db: got %v, want it never created (store changes need a restart)", err)
	}
}

// TestReloadNamesRestartKeys: a reload that changes keys only a restart
// applies names them in "keys" as a list, as the store-change warning
// does, so one log query (keys contains "listen") finds both.
func TestReloadNamesRestartKeys(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const msg = "changes that need a restart are ignored until then"
	tests := []struct {
		name string
		edit func(text string) string
		want []any
	}{
		{"listen", func(s string) string { return strings.Replace(s, "listen: 127.0.0.1:0\n", "listen: 127.0.0.1:1\n", 1) }, []any{"listen"}},
		{"admin.listen and log.format", func(s string) string {
			return strings.Replace(s, "  listen: 127.0.0.1:0\n", "  listen: 127.0.0.1:1\n", 1) + "log:\n  format: console\n"
		}, []any{"admin.listen", "log.format"}},
		{"server", func(s string) string { return s + "server:\n  idle_timeout: 60s\n" }, []any{"server"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, text := tokenConfig(t, t.TempDir(), "http://127.0.0.1:1")
			p := startInProcess(t, cfg)
			writeFileAtomic(t, cfg, tt.edit(text))
			p.sigs <- syscall.SIGHUP
			p.waitLog("config reloaded", 1)
			if w := p.logs.FilterMessage(msg).All(); len(w) != 1 {
				t.Errorf("log: got %d lines %q, want 1", len(w), msg)
			} else if got, ok := w[0].ContextMap()["keys"].([]any); !ok || !slices.Equal(got, tt.want) {
				t.Errorf("%q keys: got %#v, want the list %v", msg, w[0].ContextMap()["keys"], tt.want)
			}
			if err := p.stop(); err != nil {
				t.Errorf("run: got %v, want nil", err)
			}
		})
	}
}

// TestReloadLogsConfigWarnings: a file a reload brings in gets the warnings
// validate and serve's start give, naming the key and never the secret.
func TestReloadLogsConfigWarnings(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg, text := tokenConfig(t, t.TempDir(), "http://127.0.0.1:1")
	p := startInProcess(t, cfg)
	writeFileAtomic(t, cfg, text+"    client_identity: Authorization\n    client_identity_secret: \"pepper-s3cret-0123456789\\n\"\n")
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reloaded", 1)
	var keys []string
	for _, e := range p.logs.FilterMessage("configuration likely wrong").All() {
		keys = append(keys, fmt.Sprint(e.ContextMap()["key"]))
	}
	if want := []string{"routes[0].client_identity_secret"}; !slices.Equal(keys, want) {
		t.Errorf("configuration warnings after the reload: got keys %q, want %q", keys, want)
	}
	for _, e := range p.logs.All() {
		if strings.Contains(fmt.Sprint(e.Message, e.ContextMap()), "s3cret") {
			t.Errorf("log line %q: got the secret in it, want it never shown", e.Message)
		}
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// TestStartLogsSecretIDs: a restart with another client_identity_secret
// re-scopes every key and warns about nothing (it cannot see the last run's
// secret), so the start-up names each route's secret by an id (openssl dgst
// -sha256 -hmac SECRET of a fixed label) that operators compare across
// replicas and runs; the secret itself is never logged.
func TestStartLogsSecretIDs(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tests := []struct{ secret, wantID string }{
		{"pepper-s3cret-0123456789", "6ee57d81"},
		{"pepper-0ther-0123456789ab", "016212a7"},
	}
	for _, tt := range tests {
		cfg, text := tokenConfig(t, t.TempDir(), "http://127.0.0.1:1")
		writeFileAtomic(t, cfg, text+fmt.Sprintf("    client_identity: Authorization\n    client_identity_secret: %q\n", tt.secret))
		p := startInProcess(t, cfg)
		var ids []any
		for _, e := range p.logs.FilterFieldKey("client_identity_secret_id").All() {
			if e.ContextMap()["route"] != "orders" {
				t.Errorf("secret id line: got route %v, want orders", e.ContextMap()["route"])
			}
			ids = append(ids, e.ContextMap()["client_identity_secret_id"])
		}
		if len(ids) != 1 || ids[0] != tt.wantID {
			t.Errorf("start-up secret ids with %q: got %v, want [%s]", tt.secret, ids, tt.wantID)
		}
		if err := p.stop(); err != nil {
			t.Errorf("run: got %v, want nil", err)
		}
		for _, e := range p.logs.All() {
			if strings.Contains(fmt.Sprint(e.Message, e.ContextMap()), tt.secret) {
				t.Errorf("log line %q: got the secret in it, want it never shown", e.Message)
			}
		}
	}
}

// TestReloadKeepsAdminGuarded: admin.listen needs a restart, so a reload
// that moves it to loopback and drops the token must not drop the token of
// the non-loopback listener still running.
func TestReloadKeepsAdminGuarded(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg, text := tokenConfig(t, t.TempDir(), "http://127.0.0.1:1")
	p := startInProcess(t, cfg)
	// Tests bind only to loopback: pretend the process was started on a
	// public admin address. The SIGHUP below orders this write before the
	// reload reads it.
	p.srv.file.Admin.Listen = "0.0.0.0:9097"

	writeFileAtomic(t, cfg, strings.Replace(text, "  token: one\n", "", 1))
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reload rejected: keeping the running config", 1)
	problems := fmt.Sprint(p.logs.FilterMessage("config reload rejected: keeping the running config").All()[0].ContextMap()["problems"])
	if !strings.Contains(problems, "admin.token") {
		t.Errorf("reload problems: got %s, want admin.token named", problems)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+p.admin+"/v1/keys/orders/k", nil)
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("keys API without a token after the reload: got %d, want 401", resp.StatusCode)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// TestUnreachableStoreIsReportedAtStartUp: the gateway starts without its
// Redis (it fails open or closed per route meanwhile), but says so at once.
func TestUnreachableStoreIsReportedAtStartUp(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	closed := httptest.NewServer(http.NotFoundHandler())
	addr := closed.Listener.Addr().String()
	closed.Close() // nothing listens there now
	p := startInProcess(t, redisConfig(t, "http://127.0.0.1:1", redisStore{addrs: []string{addr}}))
	warn := p.logs.FilterMessage("store unreachable at start-up: deliveries meet their routes' on_store_error policy until it answers").All()
	if len(warn) != 1 || !strings.Contains(fmt.Sprint(warn[0].ContextMap()["error"]), "connection refused") {
		t.Errorf("got start-up warnings %v, want one naming the connection error", warn)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// TestRedisRefusingWritesIsReportedAtStartUp: a Redis that answers but
// refuses writes (here at maxmemory) is not taken for an unreachable one:
// the start-up says so, and still says what Redis's settings mean (here:
// no persistence), which cannot wait until it takes writes again.
func TestRedisRefusingWritesIsReportedAtStartUp(t *testing.T) {
	srv := redistest.Start(t) // its process's waiter ends after the check below
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	if err := srv.Client().ConfigSet(context.Background(), "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	p := startInProcess(t, redisConfig(t, "http://127.0.0.1:1", redisStore{addrs: []string{srv.Addr()}}))
	refused := p.logs.FilterMessageSnippet("Redis answers but refuses writes at start-up").All()
	if len(refused) != 1 || !strings.Contains(fmt.Sprint(refused[0].ContextMap()["error"]), "OOM") {
		t.Errorf("got start-up warnings %v, want one naming OOM", refused)
	}
	if got := p.logs.FilterMessageSnippet("store unreachable at start-up").Len(); got != 0 {
		t.Errorf("unreachable warnings: got %d, want 0", got)
	}
	if got := p.logs.FilterMessageSnippet("Redis keeps the dedup keys in memory only").Len(); got != 1 {
		t.Errorf("persistence warnings at start-up: got %d, want 1", got)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// TestRefusedRedisCredentialsFailStartUp: a wrong or missing password, or
// an ACL user that may not run what the store needs, is a configuration
// error: serve stops at start-up naming the keys to check, where it would
// otherwise fail every delivery open (on_store_error: forward) for as long
// as it ran.
func TestRefusedRedisCredentialsFailStartUp(t *testing.T) {
	srv := redistest.Start(t)
	if err := srv.Client().ConfigSet(context.Background(), "requirepass", "good-pw").Err(); err != nil {
		t.Fatalf("CONFIG SET requirepass: got %v, want nil", err)
	}
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr(), Password: "good-pw"})
	defer admin.Close()
	// ACL users that may not do all the store needs: no PING; PING but
	// only GET; every command but on other keys; every command but scripts.
	for _, user := range [][]any{
		{"noping", "~dedupgw:*", "-@all", "+evalsha", "+eval", "+get", "+set", "+del"},
		{"pingonly", "~*", "-@all", "+ping", "+get"},
		{"otherkeys", "~app:*", "-@all", "+evalsha", "+eval", "+get", "+set", "+del", "+ping"},
		{"noscripts", "~*", "+@all", "-@scripting"},
	} {
		args := append([]any{"ACL", "SETUSER", user[0], "on", ">u-pw", "resetchannels"}, user[1:]...)
		if err := admin.Do(context.Background(), args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %s: got %v, want nil", user[0], err)
		}
	}
	tests := []struct {
		name     string
		st       redisStore
		wantErrs []string // nil: starts
	}{
		{"right password", redisStore{password: "good-pw"}, nil},
		{"wrong password", redisStore{password: "bad-pw"},
			[]string{"store.redis: Redis refused the gateway's credentials or what they allow (check store.redis.username and store.redis.password)", "WRONGPASS"}},
		{"no password", redisStore{},
			[]string{"(check store.redis.username and store.redis.password)", "NOAUTH"}},
		{"ACL user without a command", redisStore{username: "noping", password: "u-pw"},
			[]string{"(the ACL user may not run a command the store needs: grant it the ones the README lists under Redis)", "NOPERM"}},
		// PING passes: the start-up probe of the store's own commands finds
		// these out.
		{"ACL user with PING and GET only", redisStore{username: "pingonly", password: "u-pw"},
			[]string{"(the ACL user may not run a command the store needs", "start-up probe: claim", "NOPERM"}},
		{"ACL user on other keys", redisStore{username: "otherkeys", password: "u-pw"},
			[]string{"(the ACL user may not run a command the store needs", "start-up probe: claim", "NOPERM"}},
		{"ACL user without scripts", redisStore{username: "noscripts", password: "u-pw"},
			[]string{"(the ACL user may not run a command the store needs", "start-up probe: release", "NOPERM"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.st.addrs = []string{srv.Addr()}
			logs, err := startUp(t, redisConfig(t, "http://127.0.0.1:1", tt.st))
			if tt.wantErrs == nil {
				if err != nil || logs.FilterMessage("dedupgw started").Len() != 1 {
					t.Errorf("run: got %v, want a start and a clean stop", err)
				}
				if left, err := admin.Keys(context.Background(), "*probe*").Result(); err != nil || len(left) != 0 {
					t.Errorf("keys the start-up probe left: got %q (%v), want none", left, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("run: got nil, want an error holding %q", tt.wantErrs)
			}
			for _, want := range tt.wantErrs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("run: got %q, want it to hold %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "-pw") {
				t.Errorf("run: got %q, want no password in it", err)
			}
			if n := logs.FilterMessage("dedupgw started").Len(); n != 0 {
				t.Errorf("got %d start lines, want none", n)
			}
		})
	}
	t.Run("sentinel refuses", func(t *testing.T) {
		st := redistest.StartSentinelWithUser(t, "gw", "s3ntinel-pw")
		_, err := startUp(t, redisConfig(t, "http://127.0.0.1:1", redisStore{addrs: []string{st.Sentinel.Addr()}, masterName: st.MasterName,
			sentinelUsername: "gw", sentinelPassword: "wrong-pw"}))
		if want := "check store.redis.username and store.redis.password, and the sentinels' sentinel_username and sentinel_password"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run: got %v, want an error holding %q", err, want)
		}
	})
}

// A Redis that may evict the store's keys is named at start-up: each
// evicted processed key lets a copy through, and nothing else would say so.
func TestRedisEvictionPolicyIsWarnedAtStartUp(t *testing.T) {
	const warning = "Redis may evict dedup keys under memory pressure, and an evicted processed key lets its next copy through: set maxmemory-policy noeviction"
	for _, tt := range []struct {
		policy string
		warns  int
	}{{"noeviction", 0}, {"volatile-ttl", 0}, {"allkeys-lru", 1}} {
		t.Run(tt.policy, func(t *testing.T) {
			srv := redistest.StartWith(t, "--maxmemory-policy", tt.policy)
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the server's goroutines stop later, in Cleanup
			p := startInProcess(t, redisConfig(t, "http://127.0.0.1:1", redisStore{addrs: []string{srv.Addr()}}))
			warn := p.logs.FilterMessage(warning).All()
			if len(warn) != tt.warns || tt.warns > 0 && warn[0].ContextMap()["maxmemory_policy"] != tt.policy {
				t.Errorf("got start-up warnings %v, want %d naming %s", warn, tt.warns, tt.policy)
			}
			if err := p.stop(); err != nil {
				t.Errorf("run: got %v, want nil", err)
			}
		})
	}
}

// The log lines of serve's Redis checks that several tests wait for.
const (
	logRedisInMemoryOnly = "Redis keeps the dedup keys in memory only (neither appendonly nor save): a restart of Redis forgets every key, and the next copy of each processed event is forwarded again; set appendonly yes"
	logRedisRestarted    = "Redis restarted: a master has a new run_id and started since the gateway last asked; it holds only the keys its persistence kept, and the next copy of each event it forgot is forwarded again"
)

// watchRedis starts serve in-process on the Redis store at rs, reading
// the masters every 50 ms; the channel receives after each read.
func watchRedis(t *testing.T, rs redisStore) (*inProcess, chan struct{}) {
	t.Helper()
	read := make(chan struct{}, 1)
	p := startInProcessWith(t, redisConfig(t, "http://127.0.0.1:1", rs), func(s *server) {
		s.restartCheckInterval = 50 * time.Millisecond
		s.runsRead = notify(read)
	})
	return p, read
}

// A Redis that keeps the keys in memory only forgets them all when it
// restarts: named at start-up, and snapshots without appendonly noted.
func TestRedisWithoutPersistenceIsWarnedAtStartUp(t *testing.T) {
	const warning = logRedisInMemoryOnly
	const note = "Redis saves snapshots only (appendonly no): a Redis crash forgets the keys written since the last snapshot, and their events' next copies are forwarded again; appendonly yes avoids it"
	const kept = "Redis persists the dedup keys with appendonly: a restart of Redis keeps them (a crash, all but those written in the last fsync interval: a second with appendfsync everysec)"
	for _, tt := range []struct {
		name               string
		args               []string
		warns, notes, aofs int
	}{
		{"neither", nil, 1, 0, 0},
		{"snapshots", []string{"--save", "3600 1"}, 0, 1, 0},
		{"appendonly", []string{"--appendonly", "yes"}, 0, 0, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.StartWith(t, tt.args...)
			p := startInProcess(t, redisConfig(t, "http://127.0.0.1:1", redisStore{addrs: []string{srv.Addr()}}))
			if got := p.logs.FilterMessage(warning).FilterLevelExact(zapcore.WarnLevel).Len(); got != tt.warns {
				t.Errorf("start-up warnings: got %d, want %d", got, tt.warns)
			}
			if got := p.logs.FilterMessage(note).Len(); got != tt.notes {
				t.Errorf("start-up notes: got %d, want %d", got, tt.notes)
			}
			if got := p.logs.FilterMessage(kept).Len(); got != tt.aofs {
				t.Errorf("start-up lines saying the keys survive a restart: got %d, want %d", got, tt.aofs)
			}
			if err := p.stop(); err != nil {
				t.Errorf("run: got %v, want nil", err)
			}
		})
	}
}

// A Redis unreachable at start-up (the gateway started before it) is
// checked once it answers, as it would have been at start-up: here its
// lack of persistence is warned about then. (Found by an on-call trial:
// such a Redis was never checked.)
func TestRedisUnreachableAtStartUpIsCheckedOnceItAnswers(t *testing.T) {
	const warning = logRedisInMemoryOnly
	srv := redistest.Start(t)
	srv.Stop()
	read := make(chan struct{}, 1)
	p := startInProcessWith(t, redisConfig(t, "http://127.0.0.1:1", redisStore{addrs: []string{srv.Addr()}}), func(s *server) {
		s.storeCheckInterval = 50 * time.Millisecond
		s.restartCheckInterval = 50 * time.Millisecond
		s.runsRead = notify(read)
	})
	if got := p.logs.FilterMessage("store unreachable at start-up: deliveries meet their routes' on_store_error policy until it answers").Len(); got != 1 {
		t.Fatalf("start-up: got %d \"store unreachable\" lines, want 1", got)
	}
	if got := p.logs.FilterMessage(warning).Len(); got != 0 {
		t.Fatalf("before Redis answers: got %d persistence warnings, want 0", got)
	}
	srv.Start()
	p.waitLog("Redis answers now: running the start-up checks", 1)
	p.waitLog(warning, 1)
	// From then on a restart is watched for, as when Redis answered at once.
	recvWithin(t, read, "the masters' runs read before the restart")
	srv.Restart()
	p.waitLog(logRedisRestarted, 1)
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// A Redis that restarts while the gateway serves is named in the log,
// with the start-up's checks of what it runs again: how it kept its keys
// (without persistence it forgot every one; an on-call trial saw only
// "ready again"), and whether it may evict them (a restarted Redis runs
// the configuration it started with).
func TestRedisRestartIsWarnedAbout(t *testing.T) {
	tests := []struct {
		name  string
		args  []string // redis-server's
		check string   // the start-up check's line, logged again after the restart
	}{
		{"in memory only", nil, logRedisInMemoryOnly},
		{"may evict", []string{"--maxmemory-policy", "allkeys-lru"},
			"Redis may evict dedup keys under memory pressure, and an evicted processed key lets its next copy through: set maxmemory-policy noeviction"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.StartWith(t, tt.args...)
			p, read := watchRedis(t, redisStore{addrs: []string{srv.Addr()}})
			p.waitLog(tt.check, 1) // the start-up check
			recvWithin(t, read, "the masters' runs read before the restart")
			if got := p.logs.FilterMessage(logRedisRestarted).Len(); got != 0 {
				t.Fatalf("before a restart: got %d restart warnings, want 0", got)
			}
			srv.Restart()
			p.waitLog(logRedisRestarted, 1)
			p.waitLog(tt.check, 2)
			if err := p.stop(); err != nil {
				t.Errorf("run: got %v, want nil", err)
			}
		})
	}
}

// A persistence changed on a running Redis (CONFIG SET) is noticed by the
// same watch: turned off, the start-up warning comes again; turned on, an
// info line says so. An unchanged one logs nothing on later reads.
func TestRedisPersistenceChangeIsNoticed(t *testing.T) {
	const changed, forgot = "Redis persists the dedup keys differently now (CONFIG SET, or a master configured otherwise)", logRedisInMemoryOnly
	srv := redistest.Start(t)
	p, read := watchRedis(t, redisStore{addrs: []string{srv.Addr()}})
	p.waitLog(forgot, 1) // the start-up check
	recvWithin(t, read, "the first read")
	recvWithin(t, read, "a read with nothing changed")
	if got := p.logs.FilterMessage(changed).Len() + p.logs.FilterMessage(forgot).Len(); got != 1 {
		t.Fatalf("before a change: got %d persistence lines, want only the start-up's", got)
	}
	set := func(appendonly string) {
		t.Helper()
		if err := srv.Client().ConfigSet(context.Background(), "appendonly", appendonly).Err(); err != nil {
			t.Fatal(err)
		}
	}
	set("yes")
	p.waitLog(changed, 1)
	set("no")
	p.waitLog(changed, 2)
	p.waitLog(forgot, 2)
	lines := p.logs.FilterMessage(changed).All()
	for i, want := range []map[string]any{{"was": "none", "now": "aof"}, {"was": "aof", "now": "none"}} {
		if got := lines[i].ContextMap(); got["was"] != want["was"] || got["now"] != want["now"] {
			t.Errorf("change %d: got %v, want %v", i+1, got, want)
		}
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// A restart the watch sees only well after it (at the next read, 30 s
// apart in production) is a restart all the same: the uptime is weighed
// against the time since the last answer, not against the slack alone. And
// the first read, at once, is the baseline: it names no master.
func TestRedisRestartSeenLateIsWarnedAbout(t *testing.T) {
	const (
		restarted = logRedisRestarted
		unseen    = "a Redis master the gateway had not seen: a replica promoted by a failover, or a new Cluster master"
		// Past the slack plus INFO's whole seconds, with room for the
		// restart itself.
		interval = restartSlack + 3*time.Second
	)
	srv := redistest.Start(t)
	read := make(chan struct{}, 1)
	p := startInProcessWith(t, redisConfig(t, "http://127.0.0.1:1", redisStore{addrs: []string{srv.Addr()}}), func(s *server) {
		s.restartCheckInterval = interval
		s.runsRead = notify(read)
	})
	// The first read comes at once, not an interval later: a restart in
	// the gateway's first 30 s would otherwise be the baseline.
	select {
	case <-read:
	case <-time.After(interval / 2):
		t.Fatalf("the first read of the masters' runs: nothing within %v of the start", interval/2)
	}
	srv.Restart()
	recvWithin(t, read, "the read after the restart")
	if got := p.logs.FilterMessage(restarted).All(); len(got) != 1 {
		t.Errorf("got %d restart warnings, want 1 (%v)", len(got), got)
	} else if up, ok := got[0].ContextMap()["uptime"].(time.Duration); !ok || up <= restartSlack {
		t.Errorf("the restart was seen with an uptime of %v, want over the slack %v (the test's premise)", got[0].ContextMap()["uptime"], restartSlack)
	}
	if got := p.logs.FilterMessage(unseen).Len(); got != 0 {
		t.Errorf("got %d \"master the gateway had not seen\" lines, want 0", got)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// A Sentinel failover gives the store a master the gateway had not seen:
// a replica that held the keys all along, which is no restart, even when
// the replica itself restarted just before (a rolling update restarts
// replicas first, then fails over to one).
func TestRedisFailoverIsNoRestart(t *testing.T) {
	st := redistest.StartSentinel(t)
	p, read := watchRedis(t, redisStore{addrs: []string{st.Sentinel.Addr()}, masterName: st.MasterName})
	recvWithin(t, read, "the masters' runs read before the failover")
	st.Replica.Restart()
	ctx := context.Background()
	eventually(t, 30*time.Second, func() bool {
		info, err := st.Replica.Client().Info(ctx, "replication").Result()
		if err != nil || !strings.Contains(info, "master_link_status:up") {
			return false
		}
		// The sentinel promotes only a replica it sees healthy again.
		replicas, err := st.Sentinel.Client().Do(ctx, "sentinel", "replicas", st.MasterName).Slice()
		if err != nil || len(replicas) != 1 {
			return false
		}
		switch r := replicas[0].(type) {
		case map[any]any: // RESP3
			return r["flags"] == "slave"
		case []any: // RESP2: name, value, …
			for i := 0; i+1 < len(r); i += 2 {
				if r[i] == "flags" {
					return r[i+1] == "slave"
				}
			}
		}
		return false
	}, func() string { return "the restarted replica synced again, and seen healthy by the sentinel" })
	st.Failover()
	p.waitLog("a Redis master the gateway had not seen: a replica promoted by a failover, or a new Cluster master", 1)
	if got := p.logs.FilterMessage(logRedisRestarted).Len(); got != 0 {
		t.Errorf("after a failover: got %d restart warnings, want 0", got)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// notify returns a func that sends on ch without blocking.
func notify(ch chan<- struct{}) func() {
	return func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// recvWithin receives from ch, failing t after 10 seconds.
func recvWithin(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("waiting for %s: nothing after 10s", what)
	}
}

// One address of a Redis Cluster node, without store.redis.cluster, runs
// the store in single-node mode, where keys on other nodes' slots fail
// with MOVED: it is named at start-up.
func TestClusterNodeAloneIsWarnedAtStartUp(t *testing.T) {
	const warning = "store.redis.addrs names one node of a Redis Cluster, taken for a single node: keys on other nodes' slots fail with MOVED and meet their routes' on_store_error; set store.redis.cluster: true (or list several nodes)"
	cl := redistest.StartCluster(t, 3)
	plain := redistest.Start(t)
	for _, tt := range []struct {
		name  string
		st    redisStore
		warns int
	}{
		{"a cluster node alone", redisStore{addrs: cl.Addrs()[:1]}, 1},
		{"with cluster: true", redisStore{addrs: cl.Addrs()[:1], cluster: true}, 0},
		{"several nodes", redisStore{addrs: cl.Addrs()}, 0},
		{"a single node", redisStore{addrs: []string{plain.Addr()}}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := startInProcess(t, redisConfig(t, "http://127.0.0.1:1", tt.st))
			if got := len(p.logs.FilterMessage(warning).All()); got != tt.warns {
				t.Errorf("start-up warnings: got %d, want %d", got, tt.warns)
			}
			if err := p.stop(); err != nil {
				t.Errorf("run: got %v, want nil", err)
			}
		})
	}
}

// With wait_replicas, a Redis without enough replicas fails every claim:
// it is named at start-up. /readyz stays 200: the replicas are shared, so
// every pod would go unready at once, and duplicates are still answered.
// An ACL user refused WAIT is a configuration error: it ends the start-up.
func TestMissingReplicasAreWarnedAtStartUp(t *testing.T) {
	const warning = "Redis answers, but claims fail at start-up: fewer replicas acknowledge writes than store.redis.wait_replicas asks for, or WAIT is refused (an ACL user needs +wait); deliveries meet their routes' on_store_error policy until enough do"
	master, _ := redistest.StartReplicated(t)
	ctx := context.Background()
	if err := master.Client().Do(ctx, "acl", "setuser", "nowait", "on", ">pw", "~*", "+@all", "-wait").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		wait  int
		user  string
		cause string // in the warning's error; "" for no warning
	}{
		{"enough", 1, "", ""},
		{"too few", 2, "", "1 of 2 acknowledged"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			st := redisStore{addrs: []string{master.Addr()}, waitReplicas: tt.wait}
			if tt.user != "" {
				st.username, st.password = tt.user, "pw"
			}
			p := startInProcess(t, redisConfig(t, "http://127.0.0.1:1", st))
			got := p.logs.FilterMessage(warning).All()
			switch {
			case tt.cause == "" && len(got) != 0:
				t.Errorf("start-up warnings: got %v, want none", got)
			case tt.cause != "" && (len(got) != 1 || !strings.Contains(fmt.Sprint(got[0].ContextMap()["error"]), tt.cause)):
				t.Errorf("start-up warnings: got %v, want one whose error says %q", got, tt.cause)
			}
			if got := p.get("http://" + p.admin + "/readyz"); got != http.StatusOK {
				t.Errorf("/readyz: got %d, want 200", got)
			}
			if err := p.stop(); err != nil {
				t.Errorf("run: got %v, want nil", err)
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		_, err := startUp(t, redisConfig(t, "http://127.0.0.1:1", redisStore{addrs: []string{master.Addr()}, waitReplicas: 1, username: "nowait", password: "pw"}))
		if want := "the ACL user may not run a command the store needs"; err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("run: got %v, want an error holding %q and NOPERM", err, want)
		}
	})
}

// startUp runs the server on the configuration file cfg with SIGTERM
// already queued, so a gateway that starts stops at once, and returns the
// log and run's error.
func startUp(t *testing.T, cfg string) (*observer.ObservedLogs, error) {
	t.Helper()
	f, err := loadConfig(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.DebugLevel)
	s := &server{path: cfg, file: f, log: zap.New(core), level: zap.NewAtomicLevel()}
	sigs := make(chan os.Signal, 1)
	sigs <- syscall.SIGTERM
	err = s.run(sigs)
	return logs, err
}

// runStopped runs s (its log and open set by the caller) on tokenConfig's
// file in dir, with SIGTERM already queued, so it stops as soon as it has
// started, and returns run's error.
func runStopped(t *testing.T, dir string, s *server) error {
	t.Helper()
	cfg, _ := tokenConfig(t, dir, "http://127.0.0.1:1")
	f, err := loadConfig(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.path, s.file, s.level = cfg, f, zap.NewAtomicLevel()
	sigs := make(chan os.Signal, 1)
	sigs <- syscall.SIGTERM
	return s.run(sigs)
}

// "dedupgw stopped" is the last line, and means the store is closed: when it
// is logged, another process may open the bbolt file (a rolling restart on
// the same volume, say).
func TestStoppedIsLoggedOnceTheStoreIsClosed(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	opened := make(chan error, 1)
	onStopped := zap.Hooks(func(e zapcore.Entry) error {
		if e.Message == "dedupgw stopped" {
			// bbolt locks the file with flock: a second open fails
			// while the store still holds it.
			db, err := bolt.Open(filepath.Join(dir, "x.db"), 0o600, &bolt.Options{Timeout: 200 * time.Millisecond})
			if err == nil {
				err = db.Close()
			}
			opened <- err
		}
		return nil
	})
	core := zapcore.NewCore(zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()), zapcore.AddSync(io.Discard), zap.InfoLevel)
	if err := runStopped(t, dir, &server{log: zap.New(core, onStopped)}); err != nil {
		t.Fatalf("run: %v", err)
	}
	select {
	case err := <-opened:
		if err != nil {
			t.Errorf("opening the bbolt file when \"dedupgw stopped\" is logged: got %v, want it free", err)
		}
	default:
		t.Error(`got no "dedupgw stopped" line`)
	}
}

// closeFailingStore is a store whose Close reports err after closing it.
type closeFailingStore struct {
	dedup.Store
	err error
}

func (s closeFailingStore) Close() error { return errors.Join(s.Store.Close(), s.err) }

// TestStoreCloseFailureFailsTheExit: a store that did not close cleanly
// (bolt's last checkpoint failing on a full disk) makes run return an error,
// which exits 1, so a supervisor sees the stop was not clean.
func TestStoreCloseFailureFailsTheExit(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	closeErr := errors.New("boltstore: checkpoint: no space left on device")
	err := runStopped(t, t.TempDir(), &server{log: zap.NewNop(),
		open: func(cfg Store, log *zap.Logger) (dedup.Store, error) {
			st, err := openStore(cfg, log)
			return closeFailingStore{st, closeErr}, err
		}})
	if !errors.Is(err, closeErr) || !strings.Contains(err.Error(), "closing the store") {
		t.Errorf("run with a store whose Close fails: got %v, want %q wrapped as closing the store", err, closeErr)
	}
}

func TestServeListenFailure(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	busy := httptest.NewServer(http.NotFoundHandler())
	defer busy.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	writeFileAtomic(t, cfg, fmt.Sprintf(`listen: %q
store:
  backend: memory
routes:
  - name: a
    path: /a
    upstream: http://127.0.0.1:1
    keys: [body]
`, busy.Listener.Addr().String()))
	f, err := loadConfig(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{path: cfg, log: zap.NewNop(), level: zap.NewAtomicLevel(), file: f}
	err = s.run(make(chan os.Signal))
	if err == nil || !strings.Contains(err.Error(), "listen") || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("run on a busy port: got %v, want a listen error", err)
	}
}

func TestNewLogger(t *testing.T) {
	tests := []struct {
		cfg     Log
		want    string
		wantErr bool
	}{
		{Log{Level: "info", Format: "json"}, `"msg":"hello"`, false},
		{Log{Level: "info", Format: "console"}, "INFO\thello", false},
		{Log{Level: "warn", Format: "json"}, "", false}, // info is below warn
		{Log{Level: "loud", Format: "json"}, "", true},
		{Log{Level: "info", Format: "xml"}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.cfg.Level+"/"+tt.cfg.Format, func(t *testing.T) {
			var buf strings.Builder
			log, _, err := newLogger(tt.cfg, zapcore.AddSync(&buf))
			if (err != nil) != tt.wantErr {
				t.Fatalf("got error %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			log.Info("hello")
			if got := buf.String(); tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want it to contain %q", got, tt.want)
			}
		})
	}
}

// TestLoggedDurationsNameTheirUnit: a duration field (the drain's, the
// sweeper's) reads "1.5s", not zap's bare 1.5.
func TestLoggedDurationsNameTheirUnit(t *testing.T) {
	for format, want := range map[string]string{"json": `"drained_in":"1.5s"`, "console": `"drained_in": "1.5s"`} {
		var buf strings.Builder
		log, _, err := newLogger(Log{Level: "info", Format: format}, zapcore.AddSync(&buf))
		if err != nil {
			t.Fatal(err)
		}
		log.Info("dedupgw stopped", zap.Duration("drained_in", 1500*time.Millisecond))
		if got := buf.String(); !strings.Contains(got, want) {
			t.Errorf("%s: got %q, want it to contain %q", format, got, want)
		}
	}
}

func TestReadTimeout(t *testing.T) {
	tests := []struct {
		maxBody int64
		want    time.Duration
	}{
		{1 << 10, minReadTimeout},
		{1 << 20, minReadTimeout},
		{64 << 20, readHeaderTimeout + 1024*time.Second},
	}
	for _, tt := range tests {
		f := &File{Routes: []Route{{Policy: Policy{MaxBodyBytes: ptr(tt.maxBody)}}}}
		if got := readTimeout(f); got != tt.want {
			t.Errorf("max body %d: got read timeout %v, want %v", tt.maxBody, got, tt.want)
		}
		// The gateway's body deadline replaces the server's: the same bound.
		if got := bodyTimeout(f); got != tt.want {
			t.Errorf("max body %d: got body timeout %v, want %v", tt.maxBody, got, tt.want)
		}
	}
}

// TestStoreLocation: the start-up line says where the keys are; a relative
// bolt path is made absolute, since another working directory is another,
// empty, store.
func TestStoreLocation(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		store Store
		want  string
	}{
		{Store{Backend: "bolt", Bolt: Bolt{Path: "dedupgw.db"}}, filepath.Join(wd, "dedupgw.db")},
		{Store{Backend: "bolt", Bolt: Bolt{Path: "/var/lib/dedupgw/x.db"}}, "/var/lib/dedupgw/x.db"},
		{Store{Backend: "redis", Redis: Redis{Addrs: []string{"a:6379", "b:6379"}, Password: "secret"}}, "a:6379,b:6379"},
		{Store{Backend: "redis", Redis: Redis{Addrs: []string{"s:26379"}, MasterName: "mymaster"}}, "sentinel mymaster@s:26379"},
		{Store{Backend: "memory"}, "process memory (lost at exit)"},
	}
	for _, tt := range tests {
		if got := storeLocation(tt.store); got != tt.want {
			t.Errorf("storeLocation(%s): got %q, want %q", tt.store.Backend, got, tt.want)
		}
	}
}

// TestChangedKeys: a reload names the store keys that changed, by their
// config names, nested ones too, and never their values.
func TestChangedKeys(t *testing.T) {
	base := Store{Backend: "redis", Redis: Redis{Addrs: []string{"a:1"}, Password: "old-secret"}}
	tests := []struct {
		name   string
		change func(*Store)
		want   string
	}{
		{"nothing", func(*Store) {}, "[]"},
		{"backend", func(s *Store) { s.Backend = "bolt" }, "[store.backend]"},
		{"nested", func(s *Store) { s.Redis.Addrs = []string{"b:2"}; s.Redis.Password = "new-secret" }, "[store.redis.addrs store.redis.password]"},
		{"bolt path", func(s *Store) { s.Bolt.Path = "x.db" }, "[store.bolt.path]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			changed := base
			tt.change(&changed)
			if got := fmt.Sprint(changedKeys("store", reflect.ValueOf(base), reflect.ValueOf(changed))); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

// server.trusted_proxies reaches the gateway: with a list that leaves
// loopback out, a sender on loopback is no longer trusted with
// X-Forwarded-Proto.
func TestTrustedProxiesReachTheGateway(t *testing.T) {
	for _, tt := range []struct {
		name, server, want string
	}{
		{"default", "", "https"},
		{"loopback left out", "server:\n  trusted_proxies: [\"35.191.0.0/16\"]\n", "http"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			seen := make(chan string, 1)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seen <- r.Header.Get("X-Forwarded-Proto")
			}))
			defer up.Close()
			cfg := filepath.Join(t.TempDir(), "config.yaml")
			text := fmt.Sprintf("listen: \"127.0.0.1:0\"\nadmin:\n  listen: \"127.0.0.1:0\"\nstore:\n  backend: memory\n%sroutes:\n  - name: a\n    path: /a\n    upstream: %q\n    keys: [body]\n", tt.server, up.URL)
			if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			p := startInProcess(t, cfg)
			req, _ := http.NewRequest(http.MethodPost, "http://"+p.addr+"/a", strings.NewReader(`{"id":1}`))
			req.Header.Set("X-Forwarded-Proto", "https")
			resp, err := p.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			select {
			case got := <-seen:
				if got != tt.want {
					t.Errorf("upstream X-Forwarded-Proto: got %q, want %q", got, tt.want)
				}
			default:
				t.Fatalf("the upstream got nothing (status %d)", resp.StatusCode)
			}
			if err := p.stop(); err != nil {
				t.Errorf("run: %v", err)
			}
		})
	}
}

// TestDevVersion: an unstamped build is named by the commit go build
// recorded, so two of them can be told apart.
func TestDevVersion(t *testing.T) {
	info := func(settings ...debug.BuildSetting) *debug.BuildInfo { return &debug.BuildInfo{Settings: settings} }
	rev := debug.BuildSetting{Key: "vcs.revision", Value: "496e36b0123456789abcdef0123456789abcdef0"}
	tests := []struct {
		name string
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{"no build info", nil, false, "dev"},
		{"no VCS", info(), true, "dev"},
		{"a commit", info(rev, debug.BuildSetting{Key: "vcs.modified", Value: "false"}), true, "dev-496e36b01234"},
		{"a modified tree", info(rev, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), true, "dev-496e36b01234-dirty"},
	}
	for _, tt := range tests {
		if got := devVersion(tt.info, tt.ok); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestReloadAppliesAdminInsecure: admin.insecure decides whether /v1/*
// answers a request addressed by a name (DNS rebinding guard). A reload that
// changes it must apply it, both ways, like admin.token.
func TestReloadAppliesAdminInsecure(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg, text := tokenConfig(t, t.TempDir(), "http://127.0.0.1:1")
	noToken := strings.Replace(text, "  token: one\n", "", 1)
	writeFileAtomic(t, cfg, noToken)
	p := startInProcess(t, cfg)
	byName := func() int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+p.admin+"/v1/keys/orders/k", nil)
		req.Host = "some.name"
		resp, err := p.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := byName(); got != http.StatusForbidden {
		t.Fatalf("keys API by name before any reload: got %d, want 403", got)
	}

	writeFileAtomic(t, cfg, strings.Replace(noToken, "  listen: 127.0.0.1:0\n", "  listen: 127.0.0.1:0\n  insecure: true\n", 1))
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reloaded", 1)
	if got := byName(); got != http.StatusNotFound {
		t.Errorf("keys API by name after a reload set admin.insecure: got %d, want 404 (answered, key absent)", got)
	}

	writeFileAtomic(t, cfg, noToken)
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reloaded", 2)
	if got := byName(); got != http.StatusForbidden {
		t.Errorf("keys API by name after a reload dropped admin.insecure: got %d, want 403 (guard back on)", got)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// TestStopSignalNotLostBehindReload: a SIGTERM that arrives while a SIGHUP
// is still waiting to be read (the store opening at start-up, a reload
// running) must still reach the server; with one signal channel of
// capacity 1 signal.Notify dropped it and the gateway kept serving.
func TestStopSignalNotLostBehindReload(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	sigs, stop := notifySignals()
	defer stop()
	// probe sees each signal once os/signal has handed it to every channel
	// notified of it, sigs's included: nothing reads sigs meanwhile, as
	// while serve opens its store.
	probe := make(chan os.Signal, 2)
	signal.Notify(probe, syscall.SIGHUP, syscall.SIGTERM)
	defer signal.Stop(probe)
	deadline := time.After(5 * time.Second)
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGTERM} {
		if err := syscall.Kill(os.Getpid(), sig); err != nil {
			t.Fatal(err)
		}
		select {
		case <-probe:
		case <-deadline:
			t.Fatalf("%v not delivered within 5s", sig)
		}
	}
	got := map[os.Signal]bool{}
	// Read both before stop: a SIGHUP arriving once nothing is notified of
	// it would end the test process.
	for !got[syscall.SIGTERM] || !got[syscall.SIGHUP] {
		select {
		case s := <-sigs:
			got[s] = true
		case <-deadline:
			t.Fatalf("got signals %v within 5s, want SIGHUP and SIGTERM", got)
		}
	}
}

// TestDrainOutlastsTimeoutsReloadedAway: a reload that shortens
// upstream_timeout leaves deliveries already running on the old routes, with
// the old timeout; the drain on SIGTERM must still wait for them, or they are
// cancelled and released while the application may finish them, and the
// provider's retry is processed a second time.
func TestDrainOutlastsTimeoutsReloadedAway(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg, text := tokenConfig(t, t.TempDir(), "http://127.0.0.1:1")
	long := text + "defaults:\n  upstream_timeout: 40s\n  lease: 50s\n"
	writeFileAtomic(t, cfg, long)
	p := startInProcess(t, cfg)
	if got, want := p.srv.drainTimeout(), 40*time.Second+drainMargin; got != want {
		t.Fatalf("drain before any reload: got %v, want %v", got, want)
	}
	writeFileAtomic(t, cfg, text+"defaults:\n  upstream_timeout: 2s\n  lease: 4s\n")
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reloaded", 1)
	if got, want := p.srv.drainTimeout(), 40*time.Second+drainMargin; got != want {
		t.Errorf("drain after a reload shortened upstream_timeout: got %v, want %v (a delivery started before it may run 40s)", got, want)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// TestReloadWarnsWhenARouteChangesNamespace: renaming a route (its namespace
// defaults to its name) makes it forget every key it recorded; the reload
// must say so rather than only "config reloaded".
func TestReloadWarnsWhenARouteChangesNamespace(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cfg, text := tokenConfig(t, t.TempDir(), "http://127.0.0.1:1")
	p := startInProcess(t, cfg)
	const warning = "route's key namespace changed: keys recorded before the reload are not consulted, so copies of events already forwarded are forwarded again (set namespace: to the old one to keep them)"

	// Renamed, namespace kept: nothing to warn about.
	writeFileAtomic(t, cfg, strings.Replace(text, "  - name: orders\n", "  - name: orders2\n    namespace: orders\n", 1))
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reloaded", 1)
	if n := p.logs.FilterMessage(warning).Len(); n != 0 {
		t.Errorf("rename keeping the namespace: got %d warnings, want none", n)
	}

	// Renamed without namespace: its keys are now in orders3.
	writeFileAtomic(t, cfg, strings.Replace(text, "  - name: orders\n", "  - name: orders3\n", 1))
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reloaded", 2)
	if w := p.logs.FilterMessage(warning).All(); len(w) != 1 {
		t.Errorf("rename dropping the namespace: got %d warnings, want 1", len(w))
	} else if m := w[0].ContextMap(); m["route"] != "orders3" || m["path"] != "/hooks/orders" || m["namespace"] != "orders3" || m["previous_namespace"] != "orders" {
		t.Errorf("warning fields: got %v", m)
	}

	// The key sources: one added after the old ones keeps every old key;
	// another first source does not.
	const keysWarning = "route's key sources changed: events get other keys than those recorded before the reload, so copies of events already forwarded may be forwarded again (add new sources after the old ones to keep their keys); a change of client_identity or client_identity_secret re-scopes every key, so every retry of a request made before the reload is forwarded again"
	renamed := strings.Replace(text, "  - name: orders\n", "  - name: orders3\n", 1)
	for i, step := range []struct {
		keys string
		want int
	}{
		{`["header:Idempotency-Key", "body"]`, 0},
		{`["body", "header:Idempotency-Key"]`, 1},
	} {
		writeFileAtomic(t, cfg, strings.Replace(renamed, `keys: ["header:Idempotency-Key"]`, "keys: "+step.keys, 1))
		p.sigs <- syscall.SIGHUP
		p.waitLog("config reloaded", 3+i)
		if n := p.logs.FilterMessage(keysWarning).Len(); n != step.want {
			t.Errorf("keys %s: got %d key-source warnings in all, want %d", step.keys, n, step.want)
		}
	}
	if n := p.logs.FilterMessage(warning).Len(); n != 1 {
		t.Errorf("namespace warnings after the key changes: got %d, want still 1", n)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

func TestRouteChanges(t *testing.T) {
	route := func(name, path string) Route { return Route{Name: name, Path: path, Upstream: "http://127.0.0.1:3000"} }
	old := &File{Routes: []Route{route("a", "/a"), route("b", "/b"), route("c", "/c")}}
	f := &File{Routes: []Route{route("a", "/a"), route("c", "/c2"), route("d", "/d")}}
	added, removed, changed := routeChanges(old, f)
	for _, tt := range []struct {
		name      string
		got, want []string
	}{
		{"added", added, []string{"d"}},
		{"removed", removed, []string{"b"}},
		{"changed", changed, []string{"c"}},
	} {
		if !slices.Equal(tt.got, tt.want) {
			t.Errorf("%s: got %q, want %q", tt.name, tt.got, tt.want)
		}
	}
	if a, r, c := routeChanges(old, old); len(a)+len(r)+len(c) != 0 {
		t.Errorf("same file: got added %q, removed %q, changed %q; want none", a, r, c)
	}
}

// TestWarnKeyChangesComparesEffectiveKeys: a route without keys: keys on
// its provider's preset, so the key sources a reload compares are the
// preset's there. Explicit keys replacing a preset give other keys (warned,
// however short the old list looked); explicit keys equal to the preset,
// or the same explicit keys under another provider, give the same keys
// (not warned). client_identity and client_identity_secret scope every
// key, so changing either warns too; the secret is logged only as added,
// removed, changed or unchanged.
func TestWarnKeyChangesComparesEffectiveKeys(t *testing.T) {
	const keysWarning = "route's key sources changed: events get other keys than those recorded before the reload, so copies of events already forwarded may be forwarded again (add new sources after the old ones to keep their keys); a change of client_identity or client_identity_secret re-scopes every key, so every retry of a request made before the reload is forwarded again"
	route := func(provider string, keys ...string) Route {
		return Route{Name: "r", Path: "/r", Upstream: "http://127.0.0.1:3000", Provider: provider, Keys: keys}
	}
	const secretA, secretB = "secret-A-0123456789", "secret-B-0123456789"
	scoped := func(r Route, header string) Route { r.ClientIdentity = header; return r }
	keyed := func(r Route, s string) Route { r.ClientIdentitySecret = ptr(secret(s)); return r }
	api := scoped(route("generic", "header:Idempotency-Key"), "Authorization")
	tests := []struct {
		name       string
		old, new   Route
		want       int
		wantSecret string // the warning's client_identity_secret field, if set
	}{
		{"preset replaced by explicit keys", route("stripe"), route("stripe", "json:data.object.id"), 1, ""},
		{"preset replaced by body", route("stripe"), route("stripe", "body"), 1, ""},
		{"preset extended at the end", route("github"), route("github", "header:X-GitHub-Delivery", "body"), 0, ""},
		{"explicit keys equal to the preset dropped", route("stripe", "json:id"), route("stripe"), 0, ""},
		{"same explicit keys, other provider", route("generic", "json:id"), route("stripe", "json:id"), 0, ""},
		{"preset of another provider", route("stripe"), route("slack"), 1, ""},
		{"client_identity added", route("generic", "header:Idempotency-Key"), scoped(route("generic", "header:Idempotency-Key"), "Authorization"), 1, ""},
		{"client_identity recased", scoped(route("generic", "header:Idempotency-Key"), "authorization"), scoped(route("generic", "header:Idempotency-Key"), "Authorization"), 0, ""},
		{"client_identity_secret added", api, keyed(api, secretA), 1, "added"},
		{"client_identity_secret removed", keyed(api, secretA), api, 1, "removed"},
		{"client_identity_secret rotated", keyed(api, secretA), keyed(api, secretB), 1, "changed"},
		{"client_identity_secret kept", keyed(api, secretA), keyed(api, secretA), 0, ""},
		{"client_identity changed, secret kept", keyed(api, secretA), keyed(scoped(api, "X-Api-Key"), secretA), 1, "unchanged"},
		{"unchanged", route("stripe"), route("stripe"), 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.WarnLevel)
			warnKeyChanges(zap.New(core), &File{Routes: []Route{tt.old}}, &File{Routes: []Route{tt.new}})
			warnings := logs.FilterMessage(keysWarning).All()
			if got := len(warnings); got != tt.want {
				t.Errorf("got %d key-source warnings, want %d", got, tt.want)
			}
			for _, e := range warnings {
				if got := e.ContextMap()["client_identity_secret"]; tt.wantSecret != "" && got != tt.wantSecret {
					t.Errorf("client_identity_secret field: got %v, want %q", got, tt.wantSecret)
				}
				// The ids name which secret each side ran with.
				fields := e.ContextMap()
				if got, want := fields["client_identity_secret_id"], secretID(identitySecretOf(tt.new)); got != want {
					t.Errorf("client_identity_secret_id: got %v, want %q (the new secret's)", got, want)
				}
				if got, want := fields["previous_client_identity_secret_id"], secretID(identitySecretOf(tt.old)); got != want {
					t.Errorf("previous_client_identity_secret_id: got %v, want %q (the old secret's)", got, want)
				}
			}
			for _, e := range logs.All() {
				if line := fmt.Sprint(e.Message, e.ContextMap()); strings.Contains(line, secretA) || strings.Contains(line, secretB) {
					t.Errorf("warning shows the secret: %s", line)
				}
			}
		})
	}
}

// go-redis's lines are sampled: the same failure from every pooled
// connection during an outage is written a few times a second, not once
// per connection, while a different line still gets through.
func TestGoRedisLinesAreSampled(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := redisstore.GoRedisLogger{Logger: goRedisLog(zap.New(core))}
	for range 50 {
		l.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %v", 5, "dial tcp 127.0.0.1:6379: connect: connection refused")
	}
	l.Printf(context.Background(), "redis: %s", "another line")
	// A second's tick between the lines would allow as many again.
	if got := logs.FilterMessageSnippet("failed to dial").Len(); got < 1 || got > 2*goRedisLinesPerSecond {
		t.Errorf("50 identical dial failures: got %d lines, want 1 to %d", got, 2*goRedisLinesPerSecond)
	}
	if got := logs.FilterMessage("redis: another line").Len(); got != 1 {
		t.Errorf("a different line after them: got %d, want 1", got)
	}
	if got := logs.All()[0].LoggerName; got != "go-redis" {
		t.Errorf("logger name: got %q, want go-redis", got)
	}
}
