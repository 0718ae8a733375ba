package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

// listHarness is an admin API on a memstore whose clock the test moves, with
// keys of route orders (namespace orders) in every state, and one key of
// another route. orders' keys, by state and time (clock at Epoch):
//
//	p1  processed at +10m     p2  processed at +50m
//	f1  failed at +20m        f2  failed at +55m (first seen at +10m)
//	inflight  claimed at +58m (the clock stands at +58m)
type listHarness struct {
	t     *testing.T
	admin *httptest.Server
	fs    *flakyStore
}

func newListHarness(t *testing.T, token string) *listHarness {
	t.Helper()
	clk := storetest.NewFakeClock(storetest.Epoch)
	ms := memstore.New(memstore.Options{Now: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { _ = ms.Close() })
	fs := &flakyStore{Store: ms}
	other := genericRoute("billing", "/billing/*", "http://127.0.0.1:1")
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/*", "http://127.0.0.1:1"), other}}, harnessOpts{store: fs, now: clk.Now})
	ctx := context.Background()
	at := func(min int) { clk.Advance(storetest.Epoch.Add(time.Duration(min) * time.Minute).Sub(clk.Now())) }
	claim := func(ns, id string) string {
		res, err := ms.Claim(ctx, dedup.Key{Namespace: ns, ID: id}, dedup.ClaimOptions{Lease: 5 * time.Minute})
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("Claim(%s): got (%v, %v)", id, res.Outcome, err)
		}
		return res.Token
	}
	commit := func(ns, id, tok string) {
		if err := ms.Commit(ctx, dedup.Key{Namespace: ns, ID: id}, tok, dedup.CommitOptions{Window: 24 * time.Hour, Status: 200, Response: &dedup.Response{Status: 200, Body: []byte("secret body")}}); err != nil {
			t.Fatal(err)
		}
	}
	fail := func(ns, id, tok string) {
		if err := ms.Release(ctx, dedup.Key{Namespace: ns, ID: id}, tok, dedup.ReleaseOptions{Retain: 24 * time.Hour, Status: 500}); err != nil {
			t.Fatal(err)
		}
	}
	at(10)
	commit("orders", "p1", claim("orders", "p1"))
	f2 := claim("orders", "f2")
	commit("billing", "p1", claim("billing", "p1"))
	at(20)
	fail("orders", "f1", claim("orders", "f1"))
	at(50)
	commit("orders", "p2", claim("orders", "p2"))
	at(55)
	fail("orders", "f2", f2)
	at(58)
	claim("orders", "inflight")

	admin := httptest.NewServer(NewAdmin(h.gw, fs, AdminOptions{Token: token}))
	t.Cleanup(admin.Close)
	return &listHarness{t: t, admin: admin, fs: fs}
}

func (l *listHarness) get(path, auth, host string) (int, http.Header, []byte) {
	l.t.Helper()
	req, err := http.NewRequest(http.MethodGet, l.admin.URL+path, nil)
	if err != nil {
		l.t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if host != "" {
		req.Host = host
	}
	resp, err := l.admin.Client().Do(req)
	if err != nil {
		l.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// listed follows the pages of path (which has a query) and returns the
// keys' IDs sorted.
func (l *listHarness) listed(path, auth string) []string {
	l.t.Helper()
	var ids []string
	cursor := ""
	for pages := 0; pages < 100; pages++ {
		p := path
		if cursor != "" {
			p += "&cursor=" + url.QueryEscape(cursor)
		}
		code, _, body := l.get(p, auth, "")
		if code != http.StatusOK {
			l.t.Fatalf("GET %s: got %d %s, want 200", p, code, body)
		}
		var page struct {
			Keys []struct{ Key string }
			Next *string
		}
		if err := json.Unmarshal(body, &page); err != nil || page.Next == nil || page.Keys == nil {
			l.t.Fatalf("GET %s: got %s, want {\"keys\":[…],\"next\":…}", p, body)
		}
		for _, k := range page.Keys {
			ids = append(ids, k.Key)
		}
		if cursor = *page.Next; cursor == "" {
			slices.Sort(ids)
			return ids
		}
	}
	l.t.Fatalf("GET %s: no last page after 100", path)
	return nil
}

func TestAdminListKeys(t *testing.T) {
	l := newListHarness(t, "")
	tests := []struct {
		query string
		want  []string
	}{
		{"", []string{"f1", "f2", "inflight", "p1", "p2"}},
		{"state=failed", []string{"f1", "f2"}},
		{"state=processed&state=failed", []string{"f1", "f2", "p1", "p2"}},
		{"state=processed,processing", []string{"inflight", "p1", "p2"}},
		{"state=processing", []string{"inflight"}},
		// The clock stands at +58m: 10m ago is +48m. f2 was first seen at
		// +10m but failed at +55m.
		{"since=10m", []string{"f2", "inflight", "p2"}},
		{"state=failed&since=10m", []string{"f2"}},
		{"since=2026-01-02T03:20:05Z&until=2026-01-02T03:55:05Z", []string{"f1", "p2"}},
		{"since=2026-01-02T04:20:05%2B01:00&until=2026-01-02T03:55:05Z", []string{"f1", "p2"}},
		{"until=2026-01-02T03:14:05Z", nil}, // until is exclusive: p1 settled at 03:14:05
		{"until=2026-01-02T03:14:05.001Z", []string{"p1"}},
		{"limit=1", []string{"f1", "f2", "inflight", "p1", "p2"}},
		{"limit=2&state=processed", []string{"p1", "p2"}},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			if got := l.listed("/v1/keys/orders?"+tt.query, ""); !slices.Equal(got, tt.want) {
				t.Errorf("GET /v1/keys/orders?%s: got keys %q, want %q", tt.query, got, tt.want)
			}
		})
	}

	t.Run("entries are the records GET shows", func(t *testing.T) {
		_, _, body := l.get("/v1/keys/orders?state=processed,processing&limit=1000", "", "")
		var page struct{ Keys []map[string]any }
		if err := json.Unmarshal(body, &page); err != nil {
			t.Fatal(err)
		}
		for _, k := range page.Keys {
			id, _ := k["key"].(string)
			_, _, one := l.get("/v1/keys/orders/"+id, "", "")
			var want map[string]any
			if err := json.Unmarshal(one, &want); err != nil {
				t.Fatal(err)
			}
			got, _ := json.Marshal(k)
			wantJSON, _ := json.Marshal(want)
			if string(got) != string(wantJSON) {
				t.Errorf("listed %s: got %s, want %s", id, got, wantJSON)
			}
			if strings.Contains(string(got), "secret body") || strings.Contains(string(got), "owner") || strings.Contains(string(got), "response") {
				t.Errorf("listed %s: got %s, want no owner token or stored response", id, got)
			}
		}
	})

	t.Run("an empty page is an empty list", func(t *testing.T) {
		code, hdr, body := l.get("/v1/keys/orders?state=failed&since=1m", "", "")
		if code != 200 || strings.TrimSpace(string(body)) != `{"keys":[],"next":""}` || hdr.Get("Content-Type") != "application/json" {
			t.Errorf("got %d %q %s, want 200 application/json {\"keys\":[],\"next\":\"\"}", code, hdr.Get("Content-Type"), body)
		}
	})
}

func TestAdminListKeysRefusals(t *testing.T) {
	const token = "s3cret-token"
	l := newListHarness(t, token)
	bearer := "Bearer " + token
	tests := []struct {
		name, path, auth string
		wantCode         int
		wantType         string
		wantDetail       string // a part of the problem's detail
	}{
		{"no token", "/v1/keys/orders", "", 401, "unauthorized", ""},
		{"wrong token", "/v1/keys/orders", "Bearer nope", 401, "unauthorized", ""},
		{"unknown route", "/v1/keys/nope", bearer, 404, "unknown-route", "no route"},
		{"unknown state", "/v1/keys/orders?state=done", bearer, 400, "invalid-query", "state=done"},
		{"empty state", "/v1/keys/orders?state=", bearer, 400, "invalid-query", "state="},
		{"bad since", "/v1/keys/orders?since=yesterday", bearer, 400, "invalid-query", "since=yesterday"},
		{"negative duration", "/v1/keys/orders?since=-1h", bearer, 400, "invalid-query", "since=-1h"},
		{"bad until", "/v1/keys/orders?until=2026-13-01", bearer, 400, "invalid-query", "until=2026-13-01"},
		{"since after until", "/v1/keys/orders?since=1h&until=2h", bearer, 400, "invalid-query", "since must be before until"},
		{"limit 0", "/v1/keys/orders?limit=0", bearer, 400, "invalid-query", "limit=0"},
		{"limit over the cap", "/v1/keys/orders?limit=1001", bearer, 400, "invalid-query", "limit=1001"},
		{"limit not a number", "/v1/keys/orders?limit=ten", bearer, 400, "invalid-query", "limit=ten"},
		{"limit twice", "/v1/keys/orders?limit=1&limit=2", bearer, 400, "invalid-query", "limit: given 2 times"},
		{"since twice", "/v1/keys/orders?since=1h&since=2h", bearer, 400, "invalid-query", "since: given 2 times"},
		{"until twice", "/v1/keys/orders?until=1h&until=2h", bearer, 400, "invalid-query", "until: given 2 times"},
		{"a misspelt filter", "/v1/keys/orders?stat=failed", bearer, 400, "invalid-query", "stat: unknown parameter"},
		{"bad cursor", "/v1/keys/orders?cursor=garbage", bearer, 400, "invalid-query", "cursor:"},
		{"DELETE of the listing", "/v1/keys/orders", bearer, 405, "method-not-allowed", "GET"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := http.MethodGet
			if strings.HasPrefix(tt.name, "DELETE") {
				method = http.MethodDelete
			}
			req, _ := http.NewRequest(method, l.admin.URL+tt.path, nil)
			if tt.auth != "" {
				req.Header.Set("Authorization", tt.auth)
			}
			resp, err := l.admin.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var p struct{ Type, Detail string }
			_ = json.Unmarshal(body, &p)
			if resp.StatusCode != tt.wantCode || !strings.HasSuffix(p.Type, tt.wantType) || !strings.Contains(p.Detail, tt.wantDetail) {
				t.Errorf("%s %s: got %d %s, want %d …%s with %q in the detail", method, tt.path, resp.StatusCode, body, tt.wantCode, tt.wantType, tt.wantDetail)
			}
			if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
				t.Errorf("got Content-Type %q, want problem+json", resp.Header.Get("Content-Type"))
			}
		})
	}

	t.Run("store down", func(t *testing.T) {
		l.fs.down.Store(true)
		defer l.fs.down.Store(false)
		code, hdr, body := l.get("/v1/keys/orders", bearer, "")
		if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
			t.Errorf("got %d (Retry-After %q) %s, want 503 with Retry-After", code, hdr.Get("Retry-After"), body)
		}
	})
}

// Without a token the listing, like the rest of /v1, answers only requests
// addressed to an IP address or localhost.
func TestAdminListKeysHostRule(t *testing.T) {
	l := newListHarness(t, "")
	for _, tt := range []struct {
		host string
		want int
	}{
		{"", 200},
		{"localhost:9090", 200},
		{"rebind.example:9090", 403},
	} {
		if got, _, body := l.get("/v1/keys/orders", "", tt.host); got != tt.want {
			t.Errorf("Host %q: got %d %s, want %d", tt.host, got, body, tt.want)
		}
	}
}
