package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// pagedAdmin is an admin API that lists keys over two pages and records
// every request it gets, for what the keys commands send.
type pagedAdmin struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*http.Request
}

func newPagedAdmin(t *testing.T, pages ...[]map[string]string) *pagedAdmin {
	t.Helper()
	a := &pagedAdmin{}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.reqs = append(a.reqs, r)
		a.mu.Unlock()
		if r.Method == http.MethodDelete {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		i := 0
		if c := r.URL.Query().Get("cursor"); c != "" {
			i = int(c[0] - '0')
		}
		next := ""
		if i+1 < len(pages) {
			next = string(rune('0' + i + 1))
		}
		keys := []map[string]any{}
		for _, k := range pages[i] {
			key := map[string]any{"route": "orders", "namespace": "orders", "key": k["key"], "state": k["state"]}
			if k["maybe_processed"] == "true" {
				key["maybe_processed"] = true
			}
			keys = append(keys, key)
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": keys, "next": next})
	}))
	t.Cleanup(a.Close)
	return a
}

// deleted returns the keys a DELETE was sent for, in order.
func (a *pagedAdmin) deleted() []string {
	var keys []string
	for _, r := range a.requests() {
		if r.Method == http.MethodDelete {
			keys = append(keys, strings.TrimPrefix(r.URL.Path, "/v1/keys/orders/"))
		}
	}
	return keys
}

func (a *pagedAdmin) requests() []*http.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*http.Request(nil), a.reqs...)
}

// A --since or --until given as a duration is resolved once, before the
// first page: every page of a listing (and so a bulk forget) asks for the
// same instants. Resolved by the gateway page by page, an --until 24h
// would move later while a long listing runs, and take in keys newer than
// the operator asked for.
func TestKeysListResolvesDurationsOnce(t *testing.T) {
	a := newPagedAdmin(t,
		[]map[string]string{{"key": "k1", "state": "processed"}},
		[]map[string]string{{"key": "k2", "state": "processed"}},
	)
	before := time.Now()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"keys", "list", "--admin", a.URL, "--since", "2h", "--until", "1h", "orders"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("keys list: got exit %d, want 0\nstderr: %s", code, stderr.String())
	}
	after := time.Now()
	reqs := a.requests()
	if len(reqs) != 2 {
		t.Fatalf("got %d requests, want 2 pages", len(reqs))
	}
	tests := []struct {
		param string
		ago   time.Duration
	}{
		{"since", 2 * time.Hour},
		{"until", time.Hour},
	}
	for _, tt := range tests {
		first := reqs[0].URL.Query().Get(tt.param)
		at, err := time.Parse(time.RFC3339Nano, first)
		if err != nil {
			t.Errorf("%s: got %q on the first page, want an RFC 3339 time", tt.param, first)
			continue
		}
		if at.Before(before.Add(-tt.ago).Truncate(time.Second)) || at.After(after.Add(-tt.ago)) {
			t.Errorf("%s: got %v, want %v ago (between %v and %v)", tt.param, at, tt.ago, before.Add(-tt.ago), after.Add(-tt.ago))
		}
		if got := reqs[1].URL.Query().Get(tt.param); got != first {
			t.Errorf("%s: got %q on the second page, want %q as on the first", tt.param, got, first)
		}
	}
	if got := strings.Count(stdout.String(), "\n"); got != 2 {
		t.Errorf("got %d keys printed, want 2", got)
	}
}

// A bulk forget sends ?force=true only when given --force, and then only
// for the keys it listed in flight: any other key that went in flight
// after the listing is refused by the gateway (409) and skipped, never
// forgotten beside its delivery.
func TestKeysForgetManySendsForceOnlyWithForce(t *testing.T) {
	tests := []struct {
		name      string
		flags     []string
		wantForce map[string]string // DELETE target key → its force parameter
	}{
		{"without --force", nil, map[string]string{"k1": "", "k2": ""}},
		{"with --force", []string{"--force"}, map[string]string{"k1": "", "k2": "", "busy": "true"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newPagedAdmin(t,
				[]map[string]string{{"key": "k1", "state": "failed"}, {"key": "busy", "state": "processing"}},
				[]map[string]string{{"key": "k2", "state": "processed"}},
			)
			args := append([]string{"keys", "forget", "--admin", a.URL, "--yes"}, tt.flags...)
			args = append(args, "--state", "failed,processed,processing", "orders")
			var stdout, stderr bytes.Buffer
			run(args, &stdout, &stderr)
			got := map[string]string{}
			listed := map[string]string{"k1": "failed", "busy": "processing", "k2": "processed"}
			for _, r := range a.requests() {
				if r.Method == http.MethodDelete {
					k := strings.TrimPrefix(r.URL.Path, "/v1/keys/orders/")
					got[k] = r.URL.Query().Get("force")
					if st := r.URL.Query().Get("state"); st != listed[k] {
						t.Errorf("DELETE %s: got state=%q, want the state it was listed in, %q", k, st, listed[k])
					}
				}
			}
			if len(got) != len(tt.wantForce) {
				t.Errorf("got DELETEs %v, want %v", got, tt.wantForce)
			}
			for k, want := range tt.wantForce {
				if f, ok := got[k]; !ok || f != want {
					t.Errorf("DELETE %s: got force=%q (sent: %t), want force=%q", k, f, ok, want)
				}
			}
		})
	}
}

// A bulk forget keeps failed keys marked maybe_processed, which a replay
// could process twice, unless --include-maybe-processed, and says so.
func TestKeysForgetManyKeepsMaybeProcessed(t *testing.T) {
	tests := []struct {
		name       string
		flags      []string
		wantDelete []string
		wantCode   int
		wantOut    string
	}{
		{"dry run", nil, nil, exitOK,
			"would forget 1 and keep 1 maybe processed: the application may have processed them, check them there (keys list … | jq 'select(.maybe_processed)'; add --include-maybe-processed to forget those too)"},
		{"dry run, included", []string{"--include-maybe-processed"}, nil, exitOK,
			"would forget 2, 1 of them maybe processed (--include-maybe-processed)"},
		{"--yes", []string{"--yes"}, []string{"plain"}, exitFail,
			"kept orders/cut: maybe processed (check it in the application; use --include-maybe-processed)"},
		{"--yes, included", []string{"--yes", "--include-maybe-processed"}, []string{"plain", "cut"}, exitOK, "forgotten 2,"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newPagedAdmin(t, []map[string]string{{"key": "plain", "state": "failed"}, {"key": "cut", "state": "failed", "maybe_processed": "true"}})
			args := append([]string{"keys", "forget", "--admin", a.URL}, tt.flags...)
			var stdout, stderr bytes.Buffer
			code := run(append(args, "--state", "failed", "orders"), &stdout, &stderr)
			deleted := a.deleted()
			if !slices.Equal(deleted, tt.wantDelete) {
				t.Errorf("got DELETEs %q, want %q", deleted, tt.wantDelete)
			}
			// The store checks the mark again as it forgets: a key a cut
			// forward marked after the listing is left.
			for _, r := range a.requests() {
				if got, want := r.URL.Query().Get("keep_maybe_processed"), map[bool]string{true: "", false: "true"}[slices.Contains(tt.flags, "--include-maybe-processed")]; r.Method == http.MethodDelete && got != want {
					t.Errorf("DELETE %s: got keep_maybe_processed=%q, want %q", r.URL.Path, got, want)
				}
			}
			if len(tt.flags) == 0 || tt.flags[0] != "--yes" { // a dry run prints the keys it would forget
				if got, want := strings.Count(stdout.String(), `"key":"cut"`) == 1, slices.Contains(tt.flags, "--include-maybe-processed"); got != want {
					t.Errorf("dry run: got the kept key printed %v, want %v (stdout %q)", got, want, stdout.String())
				}
			}
			if code != tt.wantCode || !strings.Contains(stdout.String()+stderr.String(), tt.wantOut) {
				t.Errorf("got exit %d, output %q\n%q; want %d and %q", code, stdout.String(), stderr.String(), tt.wantCode, tt.wantOut)
			}
		})
	}
}

// --force forgets keys in flight, but one marked maybe_processed (an
// earlier attempt was cut) still needs --include-maybe-processed.
func TestKeysForgetManyForceKeepsMaybeProcessed(t *testing.T) {
	for _, tt := range []struct {
		flags      []string
		wantDelete []string
	}{
		{nil, nil},
		{[]string{"--force"}, []string{"busy"}},
		{[]string{"--force", "--include-maybe-processed"}, []string{"busy", "busycut"}},
	} {
		a := newPagedAdmin(t, []map[string]string{{"key": "busy", "state": "processing"}, {"key": "busycut", "state": "processing", "maybe_processed": "true"}})
		var stdout, stderr bytes.Buffer
		run(append(append([]string{"keys", "forget", "--admin", a.URL, "--yes"}, tt.flags...), "--state", "processing", "orders"), &stdout, &stderr)
		deleted := a.deleted()
		if !slices.Equal(deleted, tt.wantDelete) {
			t.Errorf("%v: got DELETEs %q, want %q", tt.flags, deleted, tt.wantDelete)
		}
		// Told what it takes: --force alone would not forget the marked one.
		if want := "skipped orders/busycut: in flight (use --force; it is marked maybe_processed too: --include-maybe-processed)"; tt.flags == nil && !strings.Contains(stdout.String(), want) {
			t.Errorf("without flags: got %q, want it to contain %q", stdout.String(), want)
		}
	}
}

// A bulk forget's dry run counts what the same command with --yes
// forgets, whatever mix of keys in flight and keys marked maybe_processed
// it lists (a key in flight carries its earlier attempt's mark), and the
// --yes summary counts the keys it kept.
func TestKeysForgetManyDryRunCountsWhatYesForgets(t *testing.T) {
	listed := []map[string]string{
		{"key": "plain", "state": "failed"},
		{"key": "cut", "state": "failed", "maybe_processed": "true"},
		{"key": "busy", "state": "processing"},
		{"key": "busycut", "state": "processing", "maybe_processed": "true"},
	}
	wouldForget := regexp.MustCompile(`would forget (\d+)`)
	for _, flags := range [][]string{nil, {"--force"}, {"--include-maybe-processed"}, {"--force", "--include-maybe-processed"}} {
		t.Run(strings.Join(append([]string{"flags"}, flags...), " "), func(t *testing.T) {
			forget := func(extra ...string) (int, string, []string) {
				a := newPagedAdmin(t, listed)
				args := append(append([]string{"keys", "forget", "--admin", a.URL}, flags...), extra...)
				var stdout, stderr bytes.Buffer
				code := run(append(args, "--state", "failed,processing", "orders"), &stdout, &stderr)
				deleted := a.deleted()
				return code, stdout.String() + stderr.String(), deleted
			}
			code, out, deleted := forget()
			m := wouldForget.FindStringSubmatch(out)
			if code != exitOK || m == nil || len(deleted) != 0 {
				t.Fatalf("dry run: got exit %d, DELETEs %q, output %q; want 0, none, and how many it would forget", code, deleted, out)
			}
			code, out, deleted = forget("--yes")
			if n, _ := strconv.Atoi(m[1]); n != len(deleted) {
				t.Errorf("dry run said it would forget %s; --yes forgot %d (%q)", m[1], len(deleted), deleted)
			}
			// Marked keys are kept, in flight too once --force lets those through.
			wantKept := map[bool]string{false: "kept 1 (maybe processed)", true: "kept 2 (maybe processed)"}[slices.Contains(flags, "--force")]
			if !slices.Contains(flags, "--include-maybe-processed") && !strings.Contains(out, wantKept) {
				t.Errorf("--yes: got output %q, want the summary to say %q", out, wantKept)
			}
			wantCode := exitFail // a key skipped or kept
			if len(deleted) == len(listed) {
				wantCode = exitOK
			}
			if code != wantCode {
				t.Errorf("--yes left %d of %d key(s): got exit %d, want %d", len(listed)-len(deleted), len(listed), code, wantCode)
			}
		})
	}
}

// webhookListener tells the webhook listener's answers from the admin
// API's: a route's answer carries Dedup-Status, and a path no route takes
// gets the no-route problem, which the admin API never sends.
func TestWebhookListener(t *testing.T) {
	tests := []struct {
		name   string
		header http.Header
		body   string
		want   bool
	}{
		{"a route's answer", http.Header{"Dedup-Status": {"rejected"}}, `{"type":"urn:dedupgw:problem:method-not-allowed"}`, true},
		{"no route", nil, `{"type":"urn:dedupgw:problem:no-route","status":404}`, true},
		{"the admin API's not found", nil, `{"type":"urn:dedupgw:problem:key-not-found","status":404}`, false},
		{"a record", nil, `{"route":"orders","key":"evt_1","state":"processed"}`, false},
		{"not JSON", nil, `404 page not found`, false},
	}
	for _, tt := range tests {
		if got := webhookListener(tt.header, []byte(tt.body)); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestAdminCallTellsAnotherServer: a 404 that is not one of the gateway's
// problem documents (an application's, at a wrong --admin) is an error
// naming the likely mistake, not "key not found"; the gateway's own
// problems, and other statuses, are passed on.
func TestAdminCallTellsAnotherServer(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		wantErr bool
	}{
		{"an application's 404", 404, "Not Found", true},
		{"an application's JSON 404", 404, `{"error":"not found"}`, true},
		{"a proxy's 502, passed on", 502, "<html>Bad Gateway</html>", false},
		{"net/http's 431, passed on", 431, "431 Request Header Fields Too Large", false},
		{"the gateway's key not found", 404, `{"type":"urn:dedupgw:problem:key-not-found","status":404}`, false},
		{"the gateway's store error", 503, `{"type":"urn:dedupgw:problem:store-unavailable","status":503}`, false},
		{"an application's 200", 200, "ok", false}, // an answer, read as such by the caller
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			code, _, err := adminCall(http.MethodGet, srv.URL+"/v1/keys/r/k", 1<<10)
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), "not as dedupgw's admin API") {
					t.Errorf("got (%d, %v), want an error saying the answer is not the admin API's", code, err)
				}
				return
			}
			if err != nil || code != tt.status {
				t.Errorf("got (%d, %v), want (%d, nil)", code, err, tt.status)
			}
		})
	}
}

// TestAdminCallTrimsTheToken: DEDUPGW_ADMIN_TOKEN read from a file or a
// Secret often ends in a newline; it is sent without it, rather than
// failing with "invalid header field value".
func TestAdminCallTrimsTheToken(t *testing.T) {
	got := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"type":"urn:dedupgw:problem:key-not-found","status":404}`)
	}))
	defer srv.Close()
	t.Setenv("DEDUPGW_ADMIN_TOKEN", " tok\r\n")
	if _, _, err := adminCall(http.MethodGet, srv.URL+"/v1/keys/r/k", 1<<10); err != nil {
		t.Fatalf("adminCall: %v", err)
	}
	if h := <-got; h != "Bearer tok" {
		t.Errorf("Authorization: got %q, want %q", h, "Bearer tok")
	}
}
