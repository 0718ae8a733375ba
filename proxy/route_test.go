package proxy

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/providers"
)

func TestNewRejectsBadConfig(t *testing.T) {
	good := func() Route { return genericRoute("orders", "/hooks/orders", "http://127.0.0.1:3000") }
	tests := []struct {
		name   string
		routes func() []Route
		want   []string // every substring must appear in the error
	}{
		{"no routes", func() []Route { return nil }, []string{"routes: at least one route is required"}},
		{"paths one to a lenient upstream", func() []Route {
			r := good()
			r.Name, r.Path = "upper", "/Hooks/Orders/"
			return []Route{good(), r}
		}, []string{`routes[1].path: "/Hooks/Orders/" and routes[0].path "/hooks/orders" are one path to an upstream that ignores case`}},
		{"lease not longer than upstream timeout", func() []Route {
			r := good()
			r.Name = "stripe"
			r.Lease, r.UpstreamTimeout = 30*time.Second, 30*time.Second
			return []Route{good2(), r}
		}, []string{"routes[1] (stripe): lease (30s) must be longer than upstream_timeout (30s)"}},
		{"default lease vs long upstream timeout", func() []Route {
			r := good()
			r.UpstreamTimeout = 2 * time.Minute
			return []Route{r}
		}, []string{"routes[0] (orders): lease (1m0s) must be longer than upstream_timeout (2m0s)"}},
		{"missing name, path, upstream", func() []Route { return []Route{{Provider: good().Provider}} },
			[]string{"routes[0].name: is required", "routes[0].path: is required", "routes[0].upstream: is required"}},
		{"bad path", func() []Route { r := good(); r.Path = "hooks"; return []Route{r} }, []string{"routes[0].path: \"hooks\" must start with /"}},
		{"star inside path", func() []Route { r := good(); r.Path = "/a*/b"; return []Route{r} }, []string{"routes[0].path:"}},
		{"bad upstream scheme", func() []Route { r := good(); r.Upstream = "ftp://x"; return []Route{r} }, []string{"routes[0].upstream: \"ftp://x\" must be an http:// or https:// URL"}},
		{"upstream without host", func() []Route { r := good(); r.Upstream = "http://"; return []Route{r} }, []string{"routes[0].upstream:"}},
		{"upstream with a port but no host", func() []Route { r := good(); r.Upstream = "http://:3000"; return []Route{r} }, []string{`routes[0].upstream: "http://:3000" has no host`}},
		{"upstream with user info", func() []Route { r := good(); r.Upstream = "http://token@x/?key=s3cret"; return []Route{r} },
			[]string{`routes[0].upstream: "http://xxxxx@x/?xxxxx" may not carry a query, fragment or user info`}},
		{"duplicate names and paths", func() []Route { return []Route{good(), good()} },
			[]string{`routes[1].name: "orders" is already used by routes[0]`, `routes[1].path: "/hooks/orders" is already used by routes[0]`}},
		{"bad name", func() []Route { r := good(); r.Name = "a/b"; return []Route{r} }, []string{"routes[0].name:"}},
		// A bbolt store keys records by "namespace:id": namespace "orders:eu"
		// and key "x" would be namespace "orders" and key "eu:x".
		{"namespace with a colon", func() []Route { r := good(); r.Namespace = "orders:eu"; return []Route{r} },
			[]string{`routes[0].namespace: "orders:eu" must not contain ':'`}},
		{"negative durations and sizes", func() []Route {
			r := good()
			r.Window, r.MaxBodyBytes, r.MaxReplayBytes = -time.Second, -1, -1
			return []Route{r}
		}, []string{"routes[0].window: (-1s) must not be negative", "routes[0].max_body_bytes:", "routes[0].max_replay_bytes:"}},
		{"bad policies", func() []Route {
			r := good()
			r.OnMissingKey, r.OnStoreError, r.OnInFlight, r.DuplicateResponse, r.OnFingerprintMismatch = "x", "wait", "forward", "x", "x"
			r.OnOtherMethod = "ack"
			return []Route{r}
		}, []string{
			`routes[0].on_missing_key: "x" must be one of forward, reject`,
			`routes[0].on_store_error: "wait" must be one of forward, reject`,
			`routes[0].on_in_flight: "forward" must be one of reject, wait`,
			`routes[0].duplicate_response: "x" must be one of ack, replay`,
			`routes[0].on_fingerprint_mismatch: "x" must be one of ack, reject`,
			`routes[0].on_other_method: "ack" must be one of reject, forward`,
		}},
		{"bad method", func() []Route { r := good(); r.Methods = []string{"PO ST"}; return []Route{r} }, []string{"routes[0].methods[0]:"}},
		{"unknown provider", func() []Route { r := good(); r.Provider = providers.Config{Provider: "paypal"}; return []Route{r} }, []string{"routes[0].provider: unknown provider"}},
		{"empty secret", func() []Route {
			r := good()
			r.Provider = providers.Config{Provider: providers.Stripe, Secrets: []string{""}}
			return []Route{r}
		}, []string{"routes[0].secrets[0] is empty"}},
		{"generic without keys", func() []Route { r := good(); r.Provider = providers.Config{}; return []Route{r} }, []string{"routes[0].keys:"}},
		{"client_identity_secret shorter than 16 bytes", func() []Route {
			r := good()
			r.ClientIdentity, r.ClientIdentitySecret = "Authorization", "fifteen-bytes!!"
			return []Route{r}
		}, []string{"routes[0].client_identity_secret: is shorter than 16 bytes (the value is not shown)"}},
		{"client_identity_secret without client_identity", func() []Route {
			r := good()
			r.ClientIdentitySecret = "0123456789abcdef"
			return []Route{r}
		}, []string{"routes[0].client_identity_secret: is set without client_identity"}},
	}
	store := memstore.New(memstore.Options{SweepInterval: -1})
	defer store.Close()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, err := New(Config{Routes: tc.routes()}, store, Options{})
			if err == nil {
				g.Close()
				t.Fatalf("got no error, want one containing %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error %q, want it to contain %q", err, w)
				}
			}
			for _, r := range tc.routes() {
				if r.ClientIdentitySecret != "" && strings.Contains(err.Error(), r.ClientIdentitySecret) {
					t.Errorf("got error %q, want it not to show the client_identity_secret", err)
				}
			}
		})
	}
}

func good2() Route { return genericRoute("other", "/hooks/other", "http://127.0.0.1:3000") }

func TestRouteDefaultsAndMatching(t *testing.T) {
	store := memstore.New(memstore.Options{SweepInterval: -1})
	defer store.Close()
	routes := []Route{
		genericRoute("exact", "/hooks/special", "http://127.0.0.1:1"),
		genericRoute("short", "/hooks/*", "http://127.0.0.1:1"),
		genericRoute("long", "/hooks/deep/*", "http://127.0.0.1:1"),
	}
	g, err := New(Config{Routes: routes}, store, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	table := g.routes.Load()

	rt := table.byName["exact"]
	defaults := []struct {
		name      string
		got, want any
	}{
		{"window", rt.Window, 24 * time.Hour},
		{"failed_retention", rt.FailedRetention, 24 * time.Hour}, // the window
		{"lease", rt.Lease, 60 * time.Second},
		{"upstream_timeout", rt.UpstreamTimeout, 30 * time.Second},
		{"max_body_bytes", rt.MaxBodyBytes, int64(1 << 20)},
		{"max_replay_bytes", rt.MaxReplayBytes, int64(64 << 10)},
		{"namespace", rt.Namespace, "exact"},
		{"on_missing_key", rt.OnMissingKey, Forward},
		{"on_store_error", rt.OnStoreError, Forward},
		{"on_in_flight", rt.OnInFlight, Reject},
		{"duplicate_response", rt.DuplicateResponse, Ack},
		{"on_fingerprint_mismatch", rt.OnFingerprintMismatch, Ack},
		{"methods", strings.Join(rt.methods, ","), "POST"},
		{"replay_headers", strings.Join(rt.ReplayHeaders, ","), "Content-Type"},
	}
	for _, d := range defaults {
		if d.got != d.want {
			t.Errorf("default %s: got %v, want %v", d.name, d.got, d.want)
		}
	}

	matches := []struct{ path, want string }{
		{"/hooks/special", "exact"},
		{"/hooks/special/x", "short"},
		{"/hooks/x", "short"},
		{"/hooks/", "short"},
		{"/hooks", "short"},
		{"/hooks/deep/x/y", "long"},
		{"/hooks/deep", "long"},
		{"/hooksx", ""},
		{"/", ""},
		{"", ""},
	}
	for _, m := range matches {
		got := ""
		if rt := table.match(m.path); rt != nil {
			got = rt.Name
		}
		if got != m.want {
			t.Errorf("match(%q): got route %q, want %q", m.path, got, m.want)
		}
	}
}

func TestCanonicalPath(t *testing.T) {
	tests := []struct {
		uri  string // the request-target as sent
		want bool
	}{
		{"/", true},
		{"/webhooks/stripe", true},
		{"/hooks/", true},
		{"/hooks/orders?id=1", true},
		{"/a;v=1/b", true},
		{"/a%20b/.well-known/...", true},
		{"/webhooks%3Astripe", true},
		{"/a/../b", false},
		{"/api/payments/../../webhooks/stripe", false},
		{"/a/./b", false},
		{"/..", false},
		{"/a/..", false},
		{"/a/.", false},
		{"/a/%2e%2e/b", false},
		{"/a/%2E./b", false},
		{"/a/..;/b", false},
		{"/a/.;x/b", false},
		{"/a//b", false},
		{"//webhooks/stripe", false},
		{`/a\..\b`, false},
		{"/a%2F..%2Fb", false},
		{"/webhooks%2fstripe", false},
		{"/a%5cb", false},
		{"*", false},
		{"/hooks/stripe%00", false},
		{"/hooks/stripe%09", false},
		{"/hooks/stripe%23x", false},
		{"/hooks/stripe%3Fx=1", false},
		{"/hooks/%252e%252e/hooks/stripe", false},
		{"/api/files/user%2540example.com", false}, // %40 once decoded: a double encoding
		{"/hooks/100%25", true},
		{"/api/files/50%25-off.txt", true},
		{"/api/files/report%20Q1.pdf", true},
		{"/api/files/caf%C3%A9", true},
	}
	for _, tt := range tests {
		t.Run(tt.uri, func(t *testing.T) {
			u, err := url.ParseRequestURI(tt.uri)
			if err != nil {
				t.Fatalf("ParseRequestURI(%q): %v", tt.uri, err)
			}
			if got := canonicalPath(u); got != tt.want {
				t.Errorf("canonicalPath(%q): got %v, want %v", tt.uri, got, tt.want)
			}
		})
	}
}

// signedBesideOpen serves an unsigned generic route on openPath (a prefix)
// and a Stripe route on stripePath, signed with stripeSecret, both to one
// upstream: config.example.yaml's shape.
func signedBesideOpen(t *testing.T, openPath, stripePath string) (*harness, *upstream) {
	t.Helper()
	up := newUpstream(t, nil)
	open := genericRoute("open", openPath, up.URL)
	stripe := genericRoute("stripe", stripePath, up.URL)
	stripe.Provider = providers.Config{Provider: providers.Stripe, Secrets: []string{stripeSecret}}
	return newHarness(t, Config{Routes: []Route{open, stripe}}, harnessOpts{}), up
}

// wantInvalidPath posts a forged event to each path and wants 400
// invalid-path with no Dedup-Status (no route decided).
func wantInvalidPath(t *testing.T, h *harness, paths ...string) {
	t.Helper()
	for _, path := range paths {
		resp := h.send(path, `{"id":"evt_forged"}`, "Idempotency-Key: k-"+path)
		if resp.Status != http.StatusBadRequest || !strings.Contains(string(resp.Body), "invalid-path") {
			t.Errorf("%s: got %d %s, want 400 invalid-path", path, resp.Status, resp.Body)
		}
		if got := resp.Header.Values(HeaderDedupStatus); len(got) != 0 {
			t.Errorf("%s: got Dedup-Status %q, want none (no route decided)", path, got)
		}
	}
}

// TestDotSegmentsCannotReachASignedRoute is config.example.yaml's shape: an
// unsigned prefix route beside a signed exact route on the same upstream. A
// path that matches the prefix route here but that the upstream (nginx,
// Spring, ...) normalises to the signed route's path must not be forwarded.
func TestDotSegmentsCannotReachASignedRoute(t *testing.T) {
	h, up := signedBesideOpen(t, "/api/payments/*", "/webhooks/stripe")
	wantInvalidPath(t, h,
		"/api/payments/../../webhooks/stripe",
		"/api/payments/%2e%2e/%2e%2e/webhooks/stripe",
		"/api/payments/..;/..;/webhooks/stripe",
		"/api/payments%2F..%2F..%2Fwebhooks/stripe",
	)
	if n := up.count(); n != 0 {
		t.Errorf("got %d requests at the upstream, want 0", n)
	}
	// The canonical path still works.
	if resp := h.send("/api/payments/charge", `{}`, "Idempotency-Key: ok-1"); resp.Status != http.StatusOK {
		t.Errorf("/api/payments/charge: got %d %s, want 200", resp.Status, resp.Body)
	}
}

func TestLoosePath(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/", "/"},
		{"/hooks/stripe", "/hooks/stripe"},
		{"/Hooks/STRIPE/", "/hooks/stripe"},
		{"/hooks/stripe.json", "/hooks/stripe"},
		{"/hooks/stripe.x.json", "/hooks/stripe"},
		{"/hooks/stripe..", "/hooks/stripe"},
		{"/hooks/.well-known.json", "/hooks/.well-known"},
		{"/hooks;v=1/stripe;jsessionid=1", "/hooks/stripe"},
		{"/hooks/.well-known", "/hooks/.well-known"},
		{"/v1.2/stripe", "/v1.2/stripe"},
		// Letters that Unicode-aware case-insensitive matching (Java's
		// equalsIgnoreCase, JavaScript's /iu) takes for ASCII ones.
		{"/hooks/\u017ftripe", "/hooks/stripe"}, // long s
		{"/hooks/str\u0131pe", "/hooks/stripe"}, // dotless i
		{"/hooks/STR\u0130PE", "/hooks/stripe"}, // capital I with dot
		{"/hooks/\u212aey", "/hooks/key"},       // Kelvin sign
		{"/hooks/\u00e9v\u00c9nement", "/hooks/\u00e9v\u00e9nement"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			if got := loosePath(tt.in); got != tt.want {
				t.Errorf("loosePath(%q): got %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestLenientPathsCannotReachASignedRoute: upstreams that ignore case, a
// trailing slash, ;parameters or an extension (Express, Spring, Tomcat,
// Rails) would route these to their Stripe handler, while the gateway's
// exact match sends them to the unsigned prefix route.
func TestLenientPathsCannotReachASignedRoute(t *testing.T) {
	h, up := signedBesideOpen(t, "/hooks/*", "/hooks/stripe")
	wantInvalidPath(t, h, "/hooks/stripe/", "/hooks/Stripe", "/hooks/STRIPE/", "/hooks/stripe;jsessionid=1", "/hooks/stripe.json",
		// Spring's suffix pattern "/hooks/stripe.*" takes every dot after
		// the name, not only the last extension.
		"/hooks/stripe.x.json", "/hooks/stripe..", "/hooks/Stripe.tar.gz",
		// Java's equalsIgnoreCase and JavaScript's /iu read a long s or a
		// dotless i as "s" and "i".
		"/hooks/%C5%BFtripe", "/hooks/str%C4%B1pe")
	// A path no route matches is answered 404 whatever a lenient reading
	// would match: nothing is forwarded.
	if resp := h.send("/HOOKS/STRIPE", `{}`); resp.Status != http.StatusNotFound {
		t.Errorf("/HOOKS/STRIPE: got %d, want 404", resp.Status)
	}
	if n := up.count(); n != 0 {
		t.Errorf("got %d requests at the upstream, want 0", n)
	}
	// The prefix route still takes its own paths, in any form.
	for _, path := range []string{"/hooks/orders", "/hooks/Orders/", "/hooks/orders.json"} {
		if resp := h.send(path, `{}`, "Idempotency-Key: ok-"+path); resp.Status != http.StatusOK {
			t.Errorf("%s: got %d %s, want 200", path, resp.Status, resp.Body)
		}
	}
	if resp := h.send("/hooks/stripe", `{"id":"evt_1"}`, stripeHeader(`{"id":"evt_1"}`, time.Now())); resp.Status != http.StatusOK {
		t.Errorf("the signed delivery: got %d %s, want 200", resp.Status, resp.Body)
	}
}

// TestLenientCheckKeepsOrdinaryPaths: paths a route is configured with, in
// any case or with dots, and a prefix route's own root, are not refused.
func TestLenientCheckKeepsOrdinaryPaths(t *testing.T) {
	up := newUpstream(t, nil)
	routes := []Route{
		genericRoute("versioned", "/api/v1.0/*", up.URL),
		genericRoute("upper", "/Hooks/Orders", up.URL),
		genericRoute("file", "/hooks/event.json", up.URL),
		genericRoute("root", "/", up.URL), // beside the catch-all: not a collision
		genericRoute("all", "/*", up.URL),
	}
	h := newHarness(t, Config{Routes: routes}, harnessOpts{})
	for _, path := range []string{"/api/v1.0", "/api/v1.0/", "/api/v1.0/x", "/Hooks/Orders", "/hooks/event.json", "/", "/anything/Else.json/"} {
		if resp := h.send(path, `{}`, "Idempotency-Key: k-"+path); resp.Status != http.StatusOK {
			t.Errorf("%s: got %d %s, want 200", path, resp.Status, resp.Body)
		}
	}
}

func TestRedactURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"http://app:3000/hooks", `"http://app:3000/hooks"`},
		{"http://user:s3cret@app:3000/", `"http://xxxxx@app:3000/"`},
		{"http://token@app/", `"http://xxxxx@app/"`},
		{"http://app/?key=s3cret", `"http://app/?xxxxx"`},
		{"http://app/#s3cret", `"http://app/#xxxxx"`},
		// Mistyped: the credentials are not user info to url.Parse.
		{"admin:s3cret@app:3000", "(not shown: it may hold credentials)"},
		{"http//admin:s3cret@app:3000", "(not shown: it may hold credentials)"},
		{"http://user:s3%zzcret@app/", "(not shown: it may hold credentials)"},
		{"localhost:3000", `"localhost:3000"`},
		{"http://admin:s3cret", "(not shown: it may hold credentials)"},
		{"admin:s3cret", "(not shown: it may hold credentials)"},
		{"http://admin:s3cret\"app:3000/", "(not shown: it may hold credentials)"},
		{"ftp://x", `"ftp://x"`},
	}
	for _, tt := range tests {
		if got := RedactURL(tt.in); got != tt.want {
			t.Errorf("RedactURL(%q): got %s, want %s", tt.in, got, tt.want)
		}
	}
}
