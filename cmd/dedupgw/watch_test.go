package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest/observer"
)

// TestFileWatchPoll checks what two reads of the followed files report:
// a change of content, once, at the second read; not a rewrite with the same content; a file
// gone; nothing a reload already read (Saw); nothing outside the files
// followed; a file a reload read (Saw), until the next Follow.
func TestFileWatchPoll(t *testing.T) {
	dir := t.TempDir()
	a := writeFile(t, dir, "a", "one")
	b := writeFile(t, dir, "b", "two")
	w := &fileWatch{changed: make(chan struct{}, 1)}
	w.Follow(map[string]fileState{a: fileStateOf(a), b: fileStateOf(b)})
	signalled := func() bool {
		select {
		case <-w.changed:
			return true
		default:
			return false
		}
	}
	steps := []struct {
		name   string
		do     func()
		signal bool
		take   []string
	}{
		{"nothing changed", func() {}, false, nil},
		{"content changed", func() { writeFileAtomic(t, a, "uno") }, true, []string{a}},
		{"the same state again", func() {}, false, nil},
		{"rewritten with the same content and a new mtime", func() {
			writeFile(t, dir, "b", "two")
			future := time.Now().Add(time.Hour)
			if err := os.Chtimes(b, future, future); err != nil {
				t.Fatal(err)
			}
		}, false, nil},
		{"both changed", func() { writeFileAtomic(t, a, "one"); writeFileAtomic(t, b, "dos") }, true, []string{a, b}},
		{"removed", func() {
			if err := os.Remove(b); err != nil {
				t.Fatal(err)
			}
		}, true, []string{b}},
		{"back", func() { writeFile(t, dir, "b", "dos") }, true, []string{b}},
		{"a file not followed", func() { writeFile(t, dir, "c", "x") }, false, nil},
		{"a reload read the change already", func() {
			writeFileAtomic(t, a, "eins")
			w.Saw(map[string]fileState{a: fileStateOf(a), filepath.Join(dir, "c"): fileStateOf(filepath.Join(dir, "c"))})
		}, false, nil},
		{"a reload read the change reported", func() {
			writeFileAtomic(t, a, "un")
			w.poll()
			w.poll()
			w.Saw(map[string]fileState{a: fileStateOf(a)})
		}, true, nil}, // the signal stays, but names nothing
	}
	for _, st := range steps {
		st.do()
		w.poll()
		if got := w.Take(); len(got) != 0 {
			t.Errorf("%s: changed files after one read: got %q, want none until a second read agrees", st.name, got)
		}
		w.poll()
		if got := signalled(); got != st.signal {
			t.Errorf("%s: signalled: got %v, want %v", st.name, got, st.signal)
		}
		if got := w.Take(); !slices.Equal(got, st.take) {
			t.Errorf("%s: changed files: got %q, want %q", st.name, got, st.take)
		}
	}
	// A file a load read is followed until the next Follow, though no
	// configuration in force names it (a rejected one did).
	c := filepath.Join(dir, "c")
	writeFileAtomic(t, c, "y")
	w.poll()
	w.poll()
	if got := w.Take(); !slices.Equal(got, []string{c}) {
		t.Errorf("a file only a load read, changed: got %q, want %q", got, []string{c})
	}
	w.Follow(map[string]fileState{a: fileStateOf(a), b: fileStateOf(b)})
	if _, ok := w.seen[c]; ok {
		t.Errorf("Follow: got c still followed, want only the files Follow named")
	}
}

// TestFileWatchWaitsForAWriteToSettle: a file read while it is written in
// place (truncated, then written) is not reported half-written, and a
// change undone before the next read is not reported at all.
func TestFileWatchWaitsForAWriteToSettle(t *testing.T) {
	dir := t.TempDir()
	whole := "routes:\n  - path: /a\n  - path: /b\n"
	cfg := writeFile(t, dir, "config.yaml", "routes: []\n")
	w := &fileWatch{changed: make(chan struct{}, 1), config: cfg}
	w.Follow(map[string]fileState{cfg: configStateOf(cfg)})

	writeFile(t, dir, "config.yaml", whole[:len(whole)/2]) // the writer is half-way
	w.poll()
	writeFile(t, dir, "config.yaml", whole) // and done
	w.poll()
	if got := w.Take(); got != nil {
		t.Fatalf("a file read half-written, then whole: got changed %q after the whole file's first read, want nothing yet", got)
	}
	w.poll()
	if got := w.Take(); !slices.Equal(got, []string{cfg}) {
		t.Fatalf("the whole file read twice: got changed %q, want %q", got, []string{cfg})
	}
	if got, want := w.seen[cfg], configStateOf(cfg); got != want {
		t.Errorf("state reported: got %v, want the whole file's %v", got, want)
	}

	writeFile(t, dir, "config.yaml", "routes: [") // a change undone before the next read
	w.poll()
	writeFile(t, dir, "config.yaml", whole)
	w.poll()
	w.poll()
	if got := w.Take(); got != nil {
		t.Errorf("a change undone before the next read: got changed %q, want nothing", got)
	}
}

// TestFileWatchReadsTheConfigWhole: the config file is read whole, as Load
// reads it, not cut at a reference's 64 KiB: a long one is not taken for
// changed (unreadable) at every read, and a change past 64 KiB is seen.
func TestFileWatchReadsTheConfigWhole(t *testing.T) {
	dir := t.TempDir()
	long := "routes: []\n" + strings.Repeat("# a comment line of a long config file\n", 2*maxFileRef/40)
	cfg := writeFile(t, dir, "config.yaml", long)
	f := &File{source: cfg, sourceRead: stateOf([]byte(long), nil)}
	w := &fileWatch{changed: make(chan struct{}, 1), config: cfg}
	w.Follow(f.watchedFiles())
	w.poll()
	w.poll()
	if got := w.Take(); got != nil {
		t.Errorf("a long config file, unchanged: got changed %q, want nothing", got)
	}
	writeFileAtomic(t, cfg, long+"# one more line\n")
	w.poll()
	w.poll()
	if got := w.Take(); !slices.Equal(got, []string{cfg}) {
		t.Errorf("a long config file changed at its end: got changed %q, want %q", got, []string{cfg})
	}
}

// k8sSecretDir lays a Secret volume out as the kubelet does: each key a
// symlink into ..data, itself a symlink to a timestamped directory, which
// an update replaces by swapping ..data in one rename.
type k8sSecretDir struct {
	t   *testing.T
	dir string
	n   int
}

func newK8sSecretDir(t *testing.T, dir string, data map[string]string) *k8sSecretDir {
	k := &k8sSecretDir{t: t, dir: dir}
	k.update(data)
	for name := range data {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return k
}

func (k *k8sSecretDir) update(data map[string]string) {
	k.n++
	ts := filepath.Join(k.dir, fmt.Sprintf("..2025_01_01_00_00_%02d", k.n))
	if err := os.MkdirAll(ts, 0o755); err != nil {
		k.t.Fatal(err)
	}
	for name, v := range data {
		writeFile(k.t, ts, name, v)
	}
	tmp := filepath.Join(k.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		k.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(k.dir, "..data")); err != nil {
		k.t.Fatal(err)
	}
}

// githubSig is GitHub's X-Hub-Signature-256 of body under secret.
func githubSig(secret, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// fileSecretConfig writes dir/config.yaml: loopback listeners, bolt in
// dir, one github route "github" to upstream whose secret is
// ${file:secret} (relative: dir/secret), plus extra route keys.
func fileSecretConfig(t *testing.T, dir, upstream, extra string) string {
	t.Helper()
	path := filepath.Join(dir, "config.yaml")
	writeFileAtomic(t, path, fmt.Sprintf(`listen: 127.0.0.1:0
admin:
  listen: 127.0.0.1:0
store:
  bolt:
    path: %q
routes:
  - name: github
    path: /hooks/github
    upstream: %q
    provider: github
    secrets: ["${file:secret}"]
%s`, filepath.Join(dir, "x.db"), upstream, extra))
	return path
}

// deliver posts a GitHub delivery with a fresh id, signed with secret, and
// returns the status.
func (p *inProcess) deliverGitHub(id int, secret string) int {
	p.t.Helper()
	body := fmt.Sprintf(`{"n":%d}`, id)
	req, _ := http.NewRequest(http.MethodPost, "http://"+p.addr+"/hooks/github", strings.NewReader(body))
	req.Header.Set("X-GitHub-Delivery", fmt.Sprintf("d-%d", id))
	req.Header.Set("X-Hub-Signature-256", githubSig(secret, body))
	resp, err := p.client.Do(req)
	if err != nil {
		p.t.Fatalf("POST: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// metric returns the line of /metrics that starts with series, "" if none.
func (p *inProcess) metric(series string) string {
	p.t.Helper()
	resp, err := p.client.Get("http://" + p.admin + "/metrics")
	if err != nil {
		p.t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, series+" ") {
			return line
		}
	}
	return ""
}

// noSecretsLogged fails t when a log line holds any of secrets.
func noSecretsLogged(t *testing.T, logs *observer.ObservedLogs, secrets ...string) {
	t.Helper()
	for _, e := range logs.All() {
		line := fmt.Sprint(e.Message, e.ContextMap())
		for _, s := range secrets {
			if strings.Contains(line, s) {
				t.Errorf("log line %q: got a secret in it, want it never shown", e.Message)
			}
		}
	}
}

// TestFileChangeReloadsWithoutSIGHUP: a secret file replaced as Kubernetes
// replaces a Secret volume's (a symlink swap), or as an editor or a
// deploy tool does (a rename over it), is picked up without a SIGHUP: the
// route then verifies with the new secret only, with the reload's usual
// log lines and metrics.
func TestFileChangeReloadsWithoutSIGHUP(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const oldSecret, newSecret = "0ld-gh-s3cret", "n3w-gh-s3cret"
	tests := []struct {
		name   string
		layout func(t *testing.T, dir string) (update func(string))
	}{
		{"Kubernetes symlink swap", func(t *testing.T, dir string) func(string) {
			k := newK8sSecretDir(t, filepath.Join(dir, "vol"), map[string]string{"gh": oldSecret + "\n"})
			if err := os.Symlink(filepath.Join("vol", "gh"), filepath.Join(dir, "secret")); err != nil {
				t.Fatal(err)
			}
			return func(s string) { k.update(map[string]string{"gh": s + "\n"}) }
		}},
		{"rename over the file", func(t *testing.T, dir string) func(string) {
			writeFile(t, dir, "secret", oldSecret+"\n")
			return func(s string) { writeFileAtomic(t, filepath.Join(dir, "secret"), s+"\n") }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var forwarded atomic.Int64
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				forwarded.Add(1)
			}))
			defer up.Close()
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Join(dir, "vol"), 0o755); err != nil {
				t.Fatal(err)
			}
			update := tt.layout(t, dir)
			cfg := fileSecretConfig(t, dir, up.URL, "")
			p := startInProcessWith(t, cfg, func(s *server) { s.watchInterval = 5 * time.Millisecond })

			if got := p.deliverGitHub(1, oldSecret); got != http.StatusOK {
				t.Fatalf("delivery signed with the old secret: got %d, want 200", got)
			}
			update(newSecret)
			id := 1
			eventually(t, 10*time.Second, func() bool {
				id++
				return p.deliverGitHub(id, newSecret) == http.StatusOK
			}, func() string { return "a delivery signed with the new secret verified" })
			if got := p.deliverGitHub(id+1, oldSecret); got != http.StatusUnauthorized {
				t.Errorf("delivery signed with the old secret after the change: got %d, want 401", got)
			}

			changed := p.logs.FilterMessage("a file the config references changed: reloading").All()
			if len(changed) != 1 {
				t.Fatalf("log: got %d lines saying a file changed, want 1", len(changed))
			}
			if got, want := fmt.Sprint(changed[0].ContextMap()["files"]), fmt.Sprint([]string{filepath.Join(dir, "secret")}); got != want {
				t.Errorf("changed files: got %s, want %s", got, want)
			}
			reloaded := p.logs.FilterMessage("config reloaded").All()
			if len(reloaded) != 1 || fmt.Sprint(reloaded[0].ContextMap()["routes_changed"]) != "[github]" {
				t.Errorf("config reloaded: got %v, want one line with routes_changed [github]", reloaded)
			}
			if got, want := p.metric(`dedupgw_config_reloads_total{result="success"}`), `dedupgw_config_reloads_total{result="success"} 1`; got != want {
				t.Errorf("metrics: got %q, want %q", got, want)
			}
			if err := p.stop(); err != nil {
				t.Errorf("run: got %v, want nil", err)
			}
			noSecretsLogged(t, p.logs, oldSecret, newSecret)
		})
	}
}

// TestConfigFileChangeReloadsWithoutSIGHUP: the config file itself,
// replaced as Kubernetes updates a ConfigMap volume (a symlink swap) or as
// an editor or deploy tool does (a rename over it), is reloaded without a
// SIGHUP. An invalid edit is rejected once, as a SIGHUP's would be, and
// the running config keeps serving; the next valid edit applies.
func TestConfigFileChangeReloadsWithoutSIGHUP(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tests := []struct {
		name   string
		layout func(t *testing.T, dir, text string) (path string, update func(string))
	}{
		{"Kubernetes ConfigMap symlink swap", func(t *testing.T, dir, text string) (string, func(string)) {
			vol := filepath.Join(dir, "vol")
			if err := os.MkdirAll(vol, 0o755); err != nil {
				t.Fatal(err)
			}
			k := newK8sSecretDir(t, vol, map[string]string{"config.yaml": text})
			return filepath.Join(vol, "config.yaml"), func(s string) { k.update(map[string]string{"config.yaml": s}) }
		}},
		{"rename over the file", func(t *testing.T, dir, text string) (string, func(string)) {
			path := filepath.Join(dir, "config.yaml")
			writeFileAtomic(t, path, text)
			return path, func(s string) { writeFileAtomic(t, path, s) }
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
			}))
			defer up.Close()
			dir := t.TempDir()
			_, text := tokenConfig(t, dir, up.URL) // a route "orders", keyed by Idempotency-Key
			cfg, update := tt.layout(t, dir, text)
			p := startInProcessWith(t, cfg, func(s *server) { s.watchInterval = 5 * time.Millisecond })
			deliver := func(path, key string) int {
				t.Helper()
				req, _ := http.NewRequest(http.MethodPost, "http://"+p.addr+path, strings.NewReader(`{}`))
				req.Header.Set("Idempotency-Key", key)
				resp, err := p.client.Do(req)
				if err != nil {
					t.Fatalf("POST %s: %v", path, err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			if got := deliver("/hooks/refunds", "r-0"); got != http.StatusNotFound {
				t.Fatalf("a route the config does not have yet: got %d, want 404", got)
			}

			refunds := text + fmt.Sprintf(`  - name: refunds
    path: /hooks/refunds
    upstream: %q
    keys: ["header:Idempotency-Key"]
`, up.URL)
			update(refunds)
			p.waitLog("config reloaded", 1)
			if got := deliver("/hooks/refunds", "r-1"); got != http.StatusOK {
				t.Errorf("the route the edit added: got %d, want 200", got)
			}
			changed := p.logs.FilterMessage("the config file changed: reloading").All()
			if len(changed) != 1 {
				t.Fatalf("log: got %d lines saying the config file changed, want 1", len(changed))
			}
			abs, _ := filepath.Abs(cfg)
			if got, want := fmt.Sprint(changed[0].ContextMap()["files"]), fmt.Sprint([]string{abs}); got != want {
				t.Errorf("changed files: got %s, want %s", got, want)
			}
			if got := p.logs.FilterMessage("config reloaded").All()[0].ContextMap()["routes_added"]; fmt.Sprint(got) != "[refunds]" {
				t.Errorf("config reloaded: got routes_added %v, want [refunds]", got)
			}

			update("routes: []\n")
			p.waitLog("config reload rejected: keeping the running config", 1)
			if got := deliver("/hooks/refunds", "r-2"); got != http.StatusOK {
				t.Errorf("after a rejected edit: got %d, want 200 (the running config serving)", got)
			}
			update(text)
			p.waitLog("config reloaded", 2)
			if got := deliver("/hooks/refunds", "r-3"); got != http.StatusNotFound {
				t.Errorf("the route the last edit removed: got %d, want 404", got)
			}
			if got, want := p.metric(`dedupgw_config_reloads_total{result="failure"}`), `dedupgw_config_reloads_total{result="failure"} 1`; got != want {
				t.Errorf("metrics: got %q, want %q (the invalid edit tried once)", got, want)
			}
			if err := p.stop(); err != nil {
				t.Errorf("run: got %v, want nil", err)
			}
		})
	}
}

// TestFileChangeMakingConfigInvalidKeepsIt: a secret file emptied is a
// reload that fails as a SIGHUP's would: logged with the problem, counted,
// the old secret still verifying; it is tried once, not at every read. A
// valid content after it reloads.
func TestFileChangeMakingConfigInvalidKeepsIt(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const oldSecret, newSecret = "0ld-gh-s3cret", "n3w-gh-s3cret"
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer up.Close()
	dir := t.TempDir()
	secret := writeFile(t, dir, "secret", oldSecret+"\n")
	cfg := fileSecretConfig(t, dir, up.URL, "")
	p := startInProcessWith(t, cfg, func(s *server) { s.watchInterval = 5 * time.Millisecond })

	writeFileAtomic(t, secret, "\n")
	p.waitLog("config reload rejected: keeping the running config", 1)
	rejected := p.logs.FilterMessage("config reload rejected: keeping the running config").All()[0].ContextMap()
	want := fmt.Sprintf(`[routes[0].secrets[0]: must not be empty (file %s is empty) (route "github")]`, secret)
	if got := fmt.Sprint(rejected["problems"]); got != want {
		t.Errorf("rejected reload's problems: got %s, want %s", got, want)
	}
	if got := p.deliverGitHub(1, oldSecret); got != http.StatusOK {
		t.Errorf("delivery signed with the old secret after a rejected reload: got %d, want 200 (old config serving)", got)
	}
	// Removed: another state of the file, another attempt.
	if err := os.Remove(secret); err != nil {
		t.Fatal(err)
	}
	p.waitLog("config reload rejected: keeping the running config", 2)

	writeFileAtomic(t, secret, newSecret+"\n")
	p.waitLog("config reloaded", 1)
	if got := p.logs.FilterMessage("config reload rejected: keeping the running config").Len(); got != 2 {
		t.Errorf("rejected reloads: got %d, want 2 (each state of the file tried once)", got)
	}
	if got, want := p.metric(`dedupgw_config_reloads_total{result="failure"}`), `dedupgw_config_reloads_total{result="failure"} 2`; got != want {
		t.Errorf("metrics: got %q, want %q", got, want)
	}
	if got := p.deliverGitHub(2, newSecret); got != http.StatusOK {
		t.Errorf("delivery signed with the new secret: got %d, want 200", got)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
	noSecretsLogged(t, p.logs, oldSecret, newSecret)
}

// TestFileChangeWarnsAsAReloadDoes: a changed client_identity_secret file
// re-scopes every key and gets the reload's warning with the secrets' ids;
// a changed Redis password file (the store: block) needs a restart, and
// says so. Neither shows a secret.
func TestFileChangeWarnsAsAReloadDoes(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const oldCIS, newCIS = "pepper-s3cret-0123456789", "pepper-0ther-0123456789ab"
	const oldPW, newPW = "redis-pw-0ld", "redis-pw-n3w"
	dir := t.TempDir()
	writeFile(t, dir, "secret", "gh\n")
	cis := writeFile(t, dir, "cis", oldCIS+"\n")
	pw := writeFile(t, dir, "pw", oldPW+"\n")
	cfg := fileSecretConfig(t, dir, "http://127.0.0.1:1",
		"    client_identity: Authorization\n    client_identity_secret: ${file:cis}\n")
	text, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	writeFileAtomic(t, cfg, strings.Replace(string(text), "store:\n", "store:\n  redis:\n    password: ${file:pw}\n", 1))
	p := startInProcessWith(t, cfg, func(s *server) { s.watchInterval = 5 * time.Millisecond })

	writeFileAtomic(t, cis, newCIS+"\n")
	p.waitLog(keySourcesChanged, 1)
	w := p.logs.FilterMessage(keySourcesChanged).All()[0].ContextMap()
	if got := []any{w["client_identity_secret"], w["client_identity_secret_id"], w["previous_client_identity_secret_id"]}; !slices.Equal(got, []any{"changed", "016212a7", "6ee57d81"}) {
		t.Errorf("key sources warning: got secret %v, id %v, previous id %v; want changed, 016212a7, 6ee57d81", got...)
	}

	writeFileAtomic(t, pw, newPW+"\n")
	const restart = "store change needs a restart: keeping the running store, applying the rest"
	p.waitLog(restart, 1)
	if got := fmt.Sprint(p.logs.FilterMessage(restart).All()[0].ContextMap()["keys"]); got != "[store.redis.password]" {
		t.Errorf("store-change warning's keys: got %s, want [store.redis.password]", got)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
	noSecretsLogged(t, p.logs, oldCIS, newCIS, oldPW, newPW)
}

// secretFileSetup starts an upstream that reads and drops bodies, and
// writes in a new directory the file "secret" holding "first" and a GitHub
// route's config whose secret is ${file:secret}; it returns the upstream,
// which the caller closes (before a goleak check), the directory, and the
// config's path and text.
func secretFileSetup(t *testing.T) (up *httptest.Server, dir, cfg, text string) {
	t.Helper()
	up = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	dir = t.TempDir()
	writeFile(t, dir, "secret", "first\n")
	cfg = fileSecretConfig(t, dir, up.URL, "")
	b, err := os.ReadFile(cfg)
	if err != nil {
		up.Close()
		t.Fatal(err)
	}
	return up, dir, cfg, string(b)
}

// TestReloadFollowsNewlyReferencedFiles: a file that a reload's config
// references for the first time is followed from then on; one it no
// longer references is not.
func TestReloadFollowsNewlyReferencedFiles(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	up, dir, cfg, text := secretFileSetup(t)
	defer up.Close()
	writeFileAtomic(t, cfg, strings.Replace(text, "${file:secret}", "${file:other}", 1))
	writeFile(t, dir, "other", "other\n")
	p := startInProcessWith(t, cfg, func(s *server) { s.watchInterval = 5 * time.Millisecond })

	writeFileAtomic(t, cfg, text) // now ${file:secret}
	// The watch may reload the edit before the SIGHUP does: either way
	// it is in force once a delivery signed with its secret verifies.
	p.sigs <- syscall.SIGHUP
	id := 0
	eventually(t, 10*time.Second, func() bool {
		id++
		return p.deliverGitHub(id, "first") == http.StatusOK
	}, func() string { return "a delivery signed with the newly referenced file's secret verified" })
	writeFileAtomic(t, filepath.Join(dir, "other"), "changed\n") // no longer referenced
	writeFileAtomic(t, filepath.Join(dir, "secret"), "second\n")
	eventually(t, 10*time.Second, func() bool {
		id++
		return p.deliverGitHub(id, "second") == http.StatusOK
	}, func() string { return "a delivery signed with the changed file's secret verified" })
	for _, e := range p.logs.FilterMessage("a file the config references changed: reloading").All() {
		if got, want := fmt.Sprint(e.ContextMap()["files"]), fmt.Sprint([]string{filepath.Join(dir, "secret")}); got != want {
			t.Errorf("changed files: got %s, want %s", got, want)
		}
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// TestRejectedReloadFollowsTheFilesItNamed: a config that names a file not
// there yet (a Secret volume updated after the ConfigMap naming it) is
// rejected, and tried again, and applied, once the file arrives, without
// a SIGHUP.
func TestRejectedReloadFollowsTheFilesItNamed(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	up, dir, cfg, text := secretFileSetup(t)
	defer up.Close()
	p := startInProcessWith(t, cfg, func(s *server) { s.watchInterval = 5 * time.Millisecond })

	writeFileAtomic(t, cfg, strings.Replace(text, "${file:secret}", "${file:later}", 1))
	p.waitLog("config reload rejected: keeping the running config", 1)
	if got := p.deliverGitHub(1, "first"); got != http.StatusOK {
		t.Errorf("delivery signed with the running secret after the rejected reload: got %d, want 200", got)
	}
	writeFileAtomic(t, filepath.Join(dir, "later"), "second\n")
	p.waitLog("config reloaded", 1)
	if got := p.deliverGitHub(2, "second"); got != http.StatusOK {
		t.Errorf("delivery signed with the arrived file's secret: got %d, want 200", got)
	}
	if got := p.logs.FilterMessage("config reload rejected: keeping the running config").Len(); got != 1 {
		t.Errorf("rejected reloads: got %d, want 1", got)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
	noSecretsLogged(t, p.logs, "first", "second")
}

// TestFileWatchFollowDropsPending: changes reported but not yet taken when
// a configuration comes into force (Follow) were read by its load: Take
// names none of them, so they reload nothing twice.
func TestFileWatchFollowDropsPending(t *testing.T) {
	dir := t.TempDir()
	a := writeFile(t, dir, "a", "one")
	w := &fileWatch{changed: make(chan struct{}, 1)}
	w.Follow(map[string]fileState{a: fileStateOf(a)})
	writeFileAtomic(t, a, "two")
	w.poll()
	w.poll()
	w.Follow(map[string]fileState{a: fileStateOf(a)})
	if got := w.Take(); got != nil {
		t.Errorf("Take after Follow: got %q, want none", got)
	}
}

// TestRejectedSIGHUPReloadIsNotTriedAgain: a SIGHUP whose reload read a
// changed file and was rejected leaves the watcher knowing that state of
// the file, so the next read of it reloads nothing (the rejection would
// only repeat). The watcher does not tick here (an hour's interval): the
// test looks at what it knows.
func TestRejectedSIGHUPReloadIsNotTriedAgain(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	dir := t.TempDir()
	secret := writeFile(t, dir, "secret", "gh-s3cret\n")
	cfg := fileSecretConfig(t, dir, "http://127.0.0.1:1", "")
	p := startInProcessWith(t, cfg, func(s *server) { s.watchInterval = time.Hour })

	writeFileAtomic(t, secret, "\n")
	p.sigs <- syscall.SIGHUP
	p.waitLog("config reload rejected: keeping the running config", 1)
	w := p.srv.watch
	w.mu.Lock()
	got, want := w.seen[secret], fileStateOf(secret)
	w.mu.Unlock()
	if got != want {
		t.Errorf("watcher's state of %s after the rejected reload: got %+v, want the emptied file's %+v (it would reload again)", secret, got, want)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// TestConfigFromAPipeIsNotFollowed: a config read from a pipe (a named
// one, /dev/stdin, a shell's <(…)) has no next content to compare: read
// again it blocks until another writer comes, or reads empty. Such a file
// is not followed, and a read of one by the watcher never blocks, so the
// drain, which stops the watcher, cannot hang on it.
func TestConfigFromAPipeIsNotFollowed(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "config.yaml")
	if err := mkfifo(fifo); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	const text = "routes:\n  - name: a\n    path: /a\n    upstream: http://127.0.0.1:1\n    keys: [\"body\"]\n"
	wrote := make(chan error, 1)
	go func() { wrote <- os.WriteFile(fifo, []byte(text), 0o600) }()
	f, err := Load(fifo, nil)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if got := f.watchedFiles(); len(got) != 0 {
		t.Errorf("files followed: got %v, want none", slices.Collect(maps.Keys(got)))
	}

	read := make(chan fileState, 1)
	go func() { read <- configStateOf(fifo) }()
	t.Cleanup(func() {
		// Release a read that blocked: a writer that opens and closes.
		if fh, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			fh.Close()
		}
	})
	select {
	case st := <-read:
		if st.err == "" {
			t.Errorf("configStateOf(a FIFO): got a content, want an error state")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("configStateOf(a FIFO): still blocked after 5s")
	}
}

// TestSIGHUPReloadIsNotRepeatedByTheWatch: a config file a SIGHUP's reload
// read is not reported again by the watch, whether the reload applied it,
// rejected it (an invalid, unparsable or missing file), so a bad edit
// followed by a SIGHUP is one rejected reload, not one more at the next
// read.
func TestSIGHUPReloadIsNotRepeatedByTheWatch(t *testing.T) {
	tests := []struct {
		name string
		edit func(t *testing.T, cfg, text string)
		log  string
	}{
		{"valid", func(t *testing.T, cfg, text string) { writeFileAtomic(t, cfg, text+"# edited\n") }, "config reloaded"},
		{"invalid", func(t *testing.T, cfg, _ string) { writeFileAtomic(t, cfg, "routes: []\n") }, "config reload rejected: keeping the running config"},
		{"unparsable", func(t *testing.T, cfg, _ string) { writeFileAtomic(t, cfg, "routes: [\n") }, "config reload rejected: keeping the running config"},
		{"missing", func(t *testing.T, cfg, _ string) {
			if err := os.Remove(cfg); err != nil {
				t.Fatal(err)
			}
		}, "config reload rejected: keeping the running config"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg, text := tokenConfig(t, dir, "http://127.0.0.1:1")
			p := startInProcess(t, cfg) // the watcher does not tick by itself
			tt.edit(t, cfg, text)
			p.sigs <- syscall.SIGHUP
			p.waitLog(tt.log, 1)
			if err := p.stop(); err != nil {
				t.Errorf("run: got %v, want nil", err)
			}
			// The run loop is gone: this read is the watch's next one.
			p.srv.watch.poll()
			if got := p.srv.watch.Take(); len(got) != 0 {
				t.Errorf("the watch's next read: got changed %q, want nothing (the SIGHUP read it)", got)
			}
		})
	}
}
