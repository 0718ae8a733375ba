package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// writeFile writes text to dir/name and returns the path.
func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFileRefExpansion(t *testing.T) {
	dir := t.TempDir()
	abs := writeFile(t, dir, "abs", "from-abs\n")
	writeFile(t, dir, "lf", "s3cret\n")
	writeFile(t, dir, "crlf", "s3cret\r\n")
	writeFile(t, dir, "two-lf", "s3cret\n\n")
	writeFile(t, dir, "cr", "s3cret\r")
	writeFile(t, dir, "none", "s3cret")
	writeFile(t, dir, "spaces", " s3cret \n")
	writeFile(t, dir, "empty", "")
	writeFile(t, dir, "only-lf", "\n")
	writeFile(t, dir, "ref", "${HOME}${file:lf}\n")
	writeFile(t, dir, "dollar", "a$b$\n")
	writeFile(t, dir, "max", strings.Repeat("m", maxFileRef))
	writeFile(t, dir, "too-large", strings.Repeat("L", maxFileRef+1))
	if err := os.MkdirAll(filepath.Join(dir, "sub", "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "sub"), "key", "in-sub\n")

	tests := []struct {
		name    string
		in      string
		want    string
		empty   []string // files read as empty
		wantErr []string // each error must hold these
	}{
		{"trailing newline removed", "${file:lf}", "s3cret", nil, nil},
		{"trailing CRLF removed", "${file:crlf}", "s3cret", nil, nil},
		{"only one newline removed", "${file:two-lf}", "s3cret\n", nil, nil},
		{"a lone CR kept", "${file:cr}", "s3cret\r", nil, nil},
		{"no newline", "${file:none}", "s3cret", nil, nil},
		{"spaces kept", "${file:spaces}", " s3cret ", nil, nil},
		{"absolute path", "${file:" + abs + "}", "from-abs", nil, nil},
		{"relative to the config's directory", "${file:sub/key}", "in-sub", nil, nil},
		{"relative with dot-dot", "${file:sub/../lf}", "s3cret", nil, nil},
		{"embedded with a variable", "whsec_${file:none}-${A}", "whsec_s3cret-x", nil, nil},
		{"literal dollars kept", "a$b$$c${file:dollar}$", "a$b$$ca$b$$", nil, nil},
		{"content not expanded again", "${file:ref}", "${HOME}${file:lf}", nil, nil},
		{"unterminated kept", "x${file:lf", "x${file:lf", nil, nil},
		{"not a reference: wrong case", "${FILE:lf}", "${FILE:lf}", nil, nil},
		{"64 KiB is allowed", "${file:max}", strings.Repeat("m", maxFileRef), nil, nil},
		{"empty file", "${file:empty}", "", []string{filepath.Join(dir, "empty")}, nil},
		{"file of one newline is empty", "${file:only-lf}", "", []string{filepath.Join(dir, "only-lf")}, nil},
		{"missing file", "${file:nope}", "", nil, []string{"${file:nope}", filepath.Join(dir, "nope"), "no such file or directory"}},
		{"missing absolute file", "${file:/nonexistent/x}", "", nil, []string{"/nonexistent/x", "no such file or directory"}},
		{"directory", "${file:sub}", "", nil, []string{filepath.Join(dir, "sub"), "is a directory"}},
		{"over the size cap", "${file:too-large}", "", nil, []string{filepath.Join(dir, "too-large"), "larger than 64 KiB"}},
		{"no path", "${file:}", "", nil, []string{"names no file"}},
		{"a variable in the path", "${file:${A}/x}", "/x}", nil, []string{"cannot hold a ${…} reference"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := &expander{env: envMap(map[string]string{"A": "x"}), dir: dir, files: map[string]fileState{}}
			got, e := x.expand(tt.in)
			if got != tt.want {
				t.Errorf("value: got %q, want %q", got, tt.want)
			}
			if !slices.Equal(e.empty, tt.empty) {
				t.Errorf("empty files: got %q, want %q", e.empty, tt.empty)
			}
			if len(e.errs) != min(len(tt.wantErr), 1) {
				t.Fatalf("errors: got %q, want %d", e.errs, min(len(tt.wantErr), 1))
			}
			for _, msg := range e.errs {
				for _, w := range tt.wantErr {
					if !strings.Contains(msg, w) {
						t.Errorf("error: got %q, want it to contain %q", msg, w)
					}
				}
				for _, content := range []string{"LLLL", "s3cret"} {
					if strings.Contains(msg, content) {
						t.Errorf("error: got %q, which shows the file's content", msg)
					}
				}
			}
		})
	}
}

func TestFileRefIsNotAFIFO(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "fifo")
	if err := mkfifo(p); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	x := &expander{env: envMap(nil), dir: dir, files: map[string]fileState{}}
	_, e := x.expand("${file:fifo}") // must not block
	if len(e.errs) != 1 || !strings.Contains(e.errs[0], "not a regular file") {
		t.Errorf("errors: got %q, want one saying it is not a regular file", e.errs)
	}
}

// A file swapped for a FIFO between readRefFile's Stat and its Open (by
// whoever can write the secret's directory) is refused, not waited on.
func TestFileRefSwappedForAFIFO(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	afterRefStat = func(path string) {
		if err := os.Remove(path); err != nil {
			t.Error(err)
		}
		if err := mkfifo(path); err != nil {
			t.Errorf("mkfifo: %v", err)
		}
	}
	t.Cleanup(func() { afterRefStat = func(string) {} })
	done := make(chan error, 1)
	go func() {
		_, err := readRefFile(p)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, errRefIrregular) {
			t.Errorf("readRefFile: got %v, want %v", err, errRefIrregular)
		}
	case <-time.After(10 * time.Second):
		// Unblock the read so the goroutine ends with the test.
		if w, err := os.OpenFile(p, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		t.Fatal("readRefFile blocked on a FIFO swapped in after its Stat")
	}
}

// TestFileRefLoad checks ${file:PATH} through Load and Validate: each
// problem names the key and the file, never the content, and an empty
// file is what an unset variable is.
func TestFileRefLoad(t *testing.T) {
	const content = "c0ntent-n0t-sh0wn"
	route := func(extra string) string {
		return "routes:\n  - name: stripe\n    path: /s\n    upstream: http://127.0.0.1:3000\n    provider: stripe\n" + extra
	}
	api := func(secret string) string {
		return "routes:\n  - name: api\n    path: /a\n    upstream: http://127.0.0.1:3000\n    keys: [\"header:Idempotency-Key\"]\n    client_identity: Authorization\n    client_identity_secret: " + secret + "\n"
	}
	tests := []struct {
		name     string
		text     string
		env      map[string]string
		files    map[string]string // name (in the config's directory) → content
		problems []string          // "$DIR" is the config's directory
	}{
		{"secret from a file", route("    secrets: [\"${file:stripe}\"]\n"), nil, map[string]string{"stripe": content + "\n"}, nil},
		{"missing file names the key and the path, once", route("    secrets: [\"${file:stripe}\"]\n"), nil, nil, []string{
			`routes[0].secrets[0]: ${file:stripe}: cannot read $DIR/stripe (stripe): no such file or directory (route "stripe")`,
		}},
		{"missing file in a one-string secret, once", route("    secrets: \"${file:/nonexistent/stripe}\"\n"), nil, nil, []string{
			`routes[0].secrets: ${file:/nonexistent/stripe}: cannot read /nonexistent/stripe: no such file or directory (route "stripe")`,
		}},
		{"empty file where a secret is required", route("    secrets: [\"${file:stripe}\"]\n"), nil, map[string]string{"stripe": "\n"}, []string{
			`routes[0].secrets[0]: must not be empty (file $DIR/stripe is empty) (route "stripe")`,
		}},
		{"empty file in a one-string secret", route("    secrets: \"${file:stripe}\"\n"), nil, map[string]string{"stripe": ""}, []string{
			`routes[0].secrets[0]: must not be empty (file $DIR/stripe is empty) (route "stripe")`,
		}},
		{"empty file in part of a secret", route("    secrets: [\"whsec_${file:stripe}\"]\n"), nil, map[string]string{"stripe": ""}, []string{
			`routes[0].secrets[0]: file $DIR/stripe is empty (the secret would be only the rest of its text) (route "stripe")`,
		}},
		{"empty file and an unset variable", route("    secrets: [\"${file:stripe}${PART}\"]\n"), nil, map[string]string{"stripe": ""}, []string{
			`routes[0].secrets[0]: must not be empty (environment variable PART is not set; file $DIR/stripe is empty) (route "stripe")`,
		}},
		{"client_identity_secret from an empty file", api(`"${file:cis}"`), nil, map[string]string{"cis": ""}, []string{
			`routes[0].client_identity_secret: must not be empty (file $DIR/cis is empty) (set it; removing the key instead hashes client identities without a secret and re-scopes every key) (route "api")`,
		}},
		{"client_identity_secret from a file", api(`"${file:cis}"`), nil, map[string]string{"cis": strings.Repeat("k", 32) + "\n"}, nil},
		{"client_identity_secret too short, not shown", api(`"${file:cis}"`), nil, map[string]string{"cis": content[:8]}, []string{
			`routes[0].client_identity_secret: is shorter than 16 bytes (the value is not shown); use a random one, e.g. from openssl rand -hex 32 (route "api")`,
		}},
		{"a duration from a file", route("    secrets: [\"${file:stripe}\"]\n    window: ${file:window}\n"), nil, map[string]string{"stripe": "x", "window": "72h\n"}, nil},
		{"a duration from a missing file, once", route("    secrets: [\"${file:stripe}\"]\n    window: ${file:window}\n"), nil, map[string]string{"stripe": "x"}, []string{
			`routes[0].window: ${file:window}: cannot read $DIR/window (window): no such file or directory (route "stripe")`,
		}},
		{"a duration from an empty file", route("    secrets: [\"x\"]\n    window: ${file:window}\n"), nil, map[string]string{"window": ""}, []string{
			`routes[0].window: invalid duration "" (want e.g. "300ms", "30s", "24h") (file $DIR/window is empty) (route "stripe")`,
		}},
		// A secret under the wrong key: its problem does not show it.
		{"a secret file where a duration goes", route("    secrets: [\"x\"]\n    window: ${file:window}\n"), nil, map[string]string{"window": content + "\n"}, []string{
			`routes[0].window: invalid duration "<read from a ${file:} reference, not shown>" (want e.g. "300ms", "30s", "24h") (route "stripe")`,
		}},
		// Quoted, a secret's quote or backslash is escaped: hidden too.
		{"a secret file with a quote where a duration goes", route("    secrets: [\"x\"]\n    window: ${file:window}\n"), nil, map[string]string{"window": `c0n"tent\n0t-sh0wn`}, []string{
			`routes[0].window: invalid duration "<read from a ${file:} reference, not shown>" (want e.g. "300ms", "30s", "24h") (route "stripe")`,
		}},
		{"a secret file in part of a value", route("    secrets: [\"x\"]\n    on_store_error: \"x${file:mode}\"\n"), nil, map[string]string{"mode": content}, []string{
			`routes[0].on_store_error: invalid value "x<read from a ${file:} reference, not shown>" (want forward or reject) (route "stripe")`,
		}},
		{"admin token from a directory", "admin:\n  token: ${file:sub}\n" + minimal, nil, map[string]string{"sub/x": ""}, []string{
			`admin.token: ${file:sub}: cannot read $DIR/sub (sub): it is a directory (name the file in it that holds the value, e.g. a Secret's key)`,
		}},
		{"an overridden key's file is not read", "admin:\n  token: ${file:missing}\n" + minimal, map[string]string{"DEDUPGW_ADMIN_TOKEN": "t"}, nil, nil},
		{"redis password from a file", "store:\n  backend: redis\n  redis:\n    password: ${file:pw}\n" + minimal, nil, map[string]string{"pw": content}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.text)
			dir := filepath.Dir(path)
			for name, text := range tt.files {
				if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
					t.Fatal(err)
				}
				writeFile(t, dir, name, text)
			}
			_, err := loadConfig(path, envMap(tt.env))
			got := problemStrings(t, err)
			want := make([]string, len(tt.problems))
			for i, p := range tt.problems {
				want[i] = strings.ReplaceAll(p, "$DIR", dir)
			}
			if !slices.Equal(got, want) {
				t.Errorf("problems:\ngot  %q\nwant %q", got, want)
			}
			for _, p := range got {
				if strings.Contains(p, content) {
					t.Errorf("problem %q shows the file's content", p)
				}
			}
		})
	}
}

// TestFileRefRelativeToTheConfig: a relative ${file:PATH} is read from the
// config file's directory, not the working directory.
func TestFileRefRelativeToTheConfig(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "stripe", "from-config-dir\n")
	path := writeFile(t, dir, "config.yaml", "routes:\n  - name: stripe\n    path: /s\n    upstream: http://127.0.0.1:3000\n    provider: stripe\n    secrets: [\"${file:stripe}\"]\n")
	t.Chdir(t.TempDir()) // no file "stripe" here
	f, err := loadConfig(path, nil)
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	if got, want := []string(f.Routes[0].Secrets), []string{"from-config-dir"}; !slices.Equal(got, want) {
		t.Errorf("secrets: got %q, want %q", got, want)
	}
	abs := filepath.Join(dir, "stripe")
	if _, ok := f.referencedFiles()[abs]; !ok || len(f.referencedFiles()) != 1 {
		t.Errorf("referenced files: got %v, want only %s", f.referencedFiles(), abs)
	}
}

// TestFileRefWarnings: an empty file where empty is allowed is warned
// about as an unset variable is, and a secret file with white space other
// than the one trailing newline gets the white-space warning.
func TestFileRefWarnings(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "pw", "")
	writeFile(t, dir, "stripe", "whsec_x\n\n")
	path := writeFile(t, dir, "config.yaml", "store:\n  backend: redis\n  redis:\n    password: ${file:pw}\n"+
		"routes:\n  - name: stripe\n    path: /s\n    upstream: http://127.0.0.1:3000\n    provider: stripe\n    window: 72h\n    secrets: [\"${file:stripe}\"]\n")
	f, err := loadConfig(path, nil)
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	var got []string
	for _, w := range f.Warnings() {
		got = append(got, w.Key)
		if w.Key == "store.redis.password" {
			if want := "built from the file " + filepath.Join(dir, "pw") + ", which is empty"; !strings.HasPrefix(w.Msg, want) {
				t.Errorf("warning: got %q, want it to start with %q", w.Msg, want)
			}
		}
	}
	if want := []string{"store.redis.password", "routes[0].secrets[0]"}; !slices.Equal(got, want) {
		t.Errorf("warnings: got keys %q, want %q", got, want)
	}
}

// TestValidateNeverShowsFileContent runs validate on files whose secrets
// come from files, valid and not: neither its output nor its warnings show
// a file's content.
func TestValidateNeverShowsFileContent(t *testing.T) {
	const content = "s3cret-fr0m-a-f1le"
	route := func(name, provider, secret string) string {
		return "  - name: " + name + "\n    path: /" + name + "\n    upstream: http://127.0.0.1:3000\n    provider: " + provider + "\n    window: 72h\n    secrets: [\"" + secret + "\"]\n"
	}
	tests := []struct {
		name  string
		files map[string]string
		text  string
		code  int
	}{
		{"valid", map[string]string{"s": content + "\n"}, "routes:\n" + route("stripe", "stripe", "${file:s}"), exitOK},
		{"white space warned", map[string]string{"s": " " + content + "\n"}, "routes:\n" + route("stripe", "stripe", "${file:s}"), exitOK},
		{"standard-webhooks format refused", map[string]string{"s": content}, "routes:\n" + route("svix", "standard-webhooks", "${file:s}"), exitFail},
		{"invalid for another reason", map[string]string{"s": content, "t": content}, "admin:\n  token: ${file:t}\n  listen: 0.0.0.0:1\nroutes:\n" + route("stripe", "stripe", "${file:s}") + route("stripe", "stripe", "${file:s}"), exitFail},
		{"client_identity_secret", map[string]string{"s": content}, "routes:\n  - name: api\n    path: /a\n    upstream: http://127.0.0.1:3000\n    keys: [\"header:K\"]\n    client_identity: Authorization\n    client_identity_secret: ${file:s}\n", exitOK},
		{"too short client_identity_secret", map[string]string{"s": content[:12]}, "routes:\n  - name: api\n    path: /a\n    upstream: http://127.0.0.1:3000\n    keys: [\"header:K\"]\n    client_identity: Authorization\n    client_identity_secret: ${file:s}\n", exitFail},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeConfig(t, tt.text)
			for name, text := range tt.files {
				writeFile(t, filepath.Dir(path), name, text)
			}
			var stdout, stderr bytes.Buffer
			if got := run([]string{"validate", "--config", path}, &stdout, &stderr); got != tt.code {
				t.Errorf("exit code: got %d, want %d\nstderr:\n%s", got, tt.code, stderr.String())
			}
			if out := stdout.String() + stderr.String(); strings.Contains(out, content[:8]) {
				t.Errorf("validate output shows the file's content:\n%s", out)
			}
		})
	}
}

// mkfifo makes a named pipe at path.
func mkfifo(path string) error { return syscall.Mkfifo(path, 0o600) }

// TestVariableValueNotShown: the value of a ${VAR} is hidden in problems as
// a ${file:PATH}'s content is. Secrets come from the environment as often
// as from files ("${STRIPE_WEBHOOK_SECRET}"), and one put under the wrong
// key must not reach the log that serve's start-up error or validate
// writes.
func TestVariableValueNotShown(t *testing.T) {
	const content = "whsec_v4lue-n0t-sh0wn"
	route := func(extra string) string {
		return "routes:\n  - name: stripe\n    path: /s\n    upstream: http://127.0.0.1:3000\n    provider: stripe\n    secrets: [\"x\"]\n" + extra
	}
	tests := []struct {
		name     string
		text     string
		env      map[string]string
		problems []string
	}{
		{"a secret variable where a duration goes", route("    window: \"${STRIPE_SECRET}\"\n"), map[string]string{"STRIPE_SECRET": content}, []string{
			`routes[0].window: invalid duration "<${STRIPE_SECRET}, not shown>" (want e.g. "300ms", "30s", "24h") (route "stripe")`,
		}},
		{"in part of a value", route("    on_store_error: \"x${MODE}\"\n"), map[string]string{"MODE": content}, []string{
			`routes[0].on_store_error: invalid value "x<${MODE}, not shown>" (want forward or reject) (route "stripe")`,
		}},
		{"a quote in it", route("    window: \"${W}\"\n"), map[string]string{"W": `c0n"tent\n0t-sh0wn`}, []string{
			`routes[0].window: invalid duration "<${W}, not shown>" (want e.g. "300ms", "30s", "24h") (route "stripe")`,
		}},
		{"found by Validate", "listen: \"${LISTEN}\"\n" + route(""), map[string]string{"LISTEN": content}, []string{
			`listen: invalid address "<${LISTEN}, not shown>" (want host:port, e.g. ":8080")`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadConfig(writeConfig(t, tt.text), envMap(tt.env))
			got := problemStrings(t, err)
			if !slices.Equal(got, tt.problems) {
				t.Errorf("problems:\ngot  %q\nwant %q", got, tt.problems)
			}
			for _, p := range got {
				for _, v := range tt.env {
					if strings.Contains(p, v) {
						t.Errorf("problem %q shows the variable's value", p)
					}
				}
			}
		})
	}
}

// problemStrings returns the problems loadConfig's err lists, as written;
// none for a nil err, and it fails t for an error that lists none.
func problemStrings(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	ps, ok := err.(Problems)
	if !ok {
		t.Fatalf("loadConfig: got %v, want Problems", err)
	}
	got := make([]string, len(ps))
	for i, p := range ps {
		got[i] = p.String()
	}
	return got
}
