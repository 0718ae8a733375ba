package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// listedIDs parses JSON Lines of key objects and returns their keys,
// sorted, failing t on a line that is not one.
func listedIDs(t *testing.T, stdout string) []string {
	t.Helper()
	var ids []string
	for line := range strings.Lines(stdout) {
		var k struct {
			Route, Key, State string
		}
		if err := json.Unmarshal([]byte(line), &k); err != nil || k.Route != "orders" || k.Key == "" || k.State == "" {
			t.Fatalf("line %q: got (%+v, %v), want a key object of route orders", line, k, err)
		}
		ids = append(ids, k.Key)
	}
	slices.Sort(ids)
	return ids
}

// The operator's incident workflow, on a real gateway and bolt file: list
// the failed keys, list what was processed in a window, see what a bulk
// forget would do, do it (a key in flight is skipped without --force), and
// the forgotten keys' next deliveries are forwarded again.
func TestE2EKeysListAndBulkForget(t *testing.T) {
	const token = "e2e-admin-token"
	u := newUpstream(t)
	release := make(chan struct{})
	u.setHandler(func(w http.ResponseWriter, r *http.Request, _ int) {
		switch key := r.Header.Get("Dedup-Key"); {
		case strings.HasPrefix(key, "orders:fail_"):
			w.WriteHeader(http.StatusInternalServerError)
		case key == "orders:busy":
			<-release
		}
	})
	g := startGateway(t, gwConfig(t, t.TempDir(), u.URL, "", "    window: 1h\n"), "DEDUPGW_ADMIN_TOKEN="+token)
	url := g.url("/hooks/orders")
	for _, id := range []string{"ok_1", "ok_2", "ok_3"} {
		wantAnswer(t, id, deliver(t, url, id, "{}"), 200, "forwarded")
	}
	for _, id := range []string{"fail_1", "fail_2"} {
		wantAnswer(t, id, deliver(t, url, id, "{}"), 500, "forwarded")
	}
	done := make(chan error, 1)
	go func() { _, err := tryDeliver(url, "busy", "{}"); done <- err }()
	defer func() {
		close(release)
		if err := <-done; err != nil {
			t.Errorf("the held delivery: %v", err)
		}
	}()
	eventually(t, 10*time.Second, func() bool { return u.count("orders:busy") == 1 }, func() string { return "the delivery at the upstream" })

	admin := "--admin=" + g.adminURL("")
	env := []string{"DEDUPGW_ADMIN_TOKEN=" + token}
	list := func(what string, wantCode int, args ...string) []string {
		t.Helper()
		code, stdout, stderr := runCLI(t, env, append([]string{"keys", "list", admin}, args...)...)
		if code != wantCode {
			t.Fatalf("%s: got exit %d, want %d\nstdout: %s\nstderr: %s", what, code, wantCode, stdout, stderr)
		}
		return listedIDs(t, stdout)
	}
	lists := []struct {
		name string
		args []string
		want []string
	}{
		{"every key", []string{"orders"}, []string{"busy", "fail_1", "fail_2", "ok_1", "ok_2", "ok_3"}},
		{"failed in the last hour", []string{"--state", "failed", "--since", "1h", "orders"}, []string{"fail_1", "fail_2"}},
		{"processed in a window", []string{"--state", "processed", "--since", time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), "--until", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "orders"}, []string{"ok_1", "ok_2", "ok_3"}},
		{"in flight", []string{"--state", "processing", "orders"}, []string{"busy"}},
		{"settled or seen before an hour ago", []string{"--until", "1h", "orders"}, nil},
		{"failed before an hour from now", []string{"--state", "failed", "--until", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "orders"}, []string{"fail_1", "fail_2"}},
		{"processed in the future", []string{"--state", "processed", "--since", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "orders"}, nil},
	}
	for _, tt := range lists {
		if got := list(tt.name, 0, tt.args...); !slices.Equal(got, tt.want) {
			t.Errorf("keys list %s: got %q, want %q", tt.name, got, tt.want)
		}
	}
	if got := list("--limit 2", 0, "--limit", "2", "orders"); len(got) != 2 {
		t.Errorf("keys list --limit 2: got %q, want 2 keys", got)
	}
	if code, _, stderr := runCLI(t, env, "keys", "list", admin, "--since", "yesterday", "orders"); code != 2 || !strings.Contains(stderr, "since=yesterday") {
		t.Errorf("keys list --since yesterday: got exit %d, stderr %q; want 2 naming since=yesterday", code, stderr)
	}
	if code, _, stderr := runCLI(t, env, "keys", "list", admin, "nope"); code != 1 || !strings.Contains(stderr, "not found") {
		t.Errorf("keys list of an unknown route: got exit %d, stderr %q; want 1, not found", code, stderr)
	}
	if code, _, stderr := runCLI(t, []string{"DEDUPGW_ADMIN_TOKEN="}, "keys", "list", admin, "orders"); code != 1 || !strings.Contains(stderr, "unauthorized") {
		t.Errorf("keys list without a token: got exit %d, stderr %q; want 1, unauthorized", code, stderr)
	}

	// Without --yes a bulk forget only shows what it would do.
	code, stdout, stderr := runCLI(t, env, "keys", "forget", admin, "--since", "1h", "orders")
	if code != 0 || !strings.Contains(stderr, "listed 6 key(s) of route orders: would forget 5 and skip 1 in flight (add --force to forget those too).") || !strings.Contains(stderr, "--yes") {
		t.Errorf("forget without --yes: got exit %d, stderr %q; want 0 and what it would do", code, stderr)
	}
	if got, want := listedIDs(t, stdout), []string{"fail_1", "fail_2", "ok_1", "ok_2", "ok_3"}; !slices.Equal(got, want) {
		t.Errorf("forget without --yes: got the keys %q printed, want %q (those it would forget)", got, want)
	}
	if got := list("after the dry run", 0, "orders"); len(got) != 6 {
		t.Errorf("after a forget without --yes: got %q, want all 6 keys still there", got)
	}

	// With --yes: every key but the one in flight.
	code, stdout, stderr = runCLI(t, env, "keys", "forget", admin, "--yes", "--since", "1h", "orders")
	if code != 1 || !strings.Contains(stdout, "forgotten 5, skipped 1 (in flight), changed since the listing 0, not found anymore 0") || !strings.Contains(stdout, "skipped orders/busy: in flight (use --force)") {
		t.Errorf("forget --yes: got exit %d\nstdout: %s\nstderr: %s\nwant 1 and forgotten 5, skipped 1", code, stdout, stderr)
	}
	if got, want := list("after forget --yes", 0, "orders"), []string{"busy"}; !slices.Equal(got, want) {
		t.Errorf("after forget --yes: got %q, want %q", got, want)
	}
	wantAnswer(t, "ok_1 redelivered", deliver(t, url, "ok_1", "{}"), 200, "forwarded")
	if got := u.count("orders:ok_1"); got != 2 {
		t.Errorf("ok_1 at the upstream: got %d deliveries, want 2", got)
	}

	// --force takes the key in flight too.
	code, stdout, stderr = runCLI(t, env, "keys", "forget", admin, "--yes", "--force", "--state", "processing", "orders")
	if code != 0 || !strings.Contains(stdout, "forgotten 1, skipped 0 (in flight), changed since the listing 0, not found anymore 0") {
		t.Errorf("forget --yes --force: got exit %d\nstdout: %s\nstderr: %s\nwant 0 and forgotten 1", code, stdout, stderr)
	}
	if got := list("after forget --force", 0, "--state", "processing", "orders"); got != nil {
		t.Errorf("after forget --force: got %q in flight, want none", got)
	}
}
