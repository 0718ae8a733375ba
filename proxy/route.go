package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/providers"
)

// Built-in defaults for zero Route fields, as Route's field docs state.
const (
	defaultWindow          = 24 * time.Hour
	defaultLease           = 60 * time.Second
	defaultUpstreamTimeout = 30 * time.Second
	defaultMaxBodyBytes    = 1 << 20
	defaultMaxReplayBytes  = 64 << 10
)

// route is a validated, defaulted Route ready to serve.
type route struct {
	Route
	index    int
	target   *url.URL
	methods  []string
	prefix   string // "/hooks/" for "/hooks/*", empty for exact routes
	provider *providers.Provider
	proxy    *httputil.ReverseProxy
	log      *zap.Logger
	// sampledLog is log, sampled on its own counts: for what any sender
	// can cause at will (see sampledLogsPerSecond).
	sampledLog *zap.Logger
	// metrics are the route's series, set by the Gateway before the route
	// serves (New, Reload).
	metrics *routeMetrics
	// scopeMAC keys the client scope with ClientIdentitySecret; nil when
	// the route has none (the scope is then the plain SHA-256).
	scopeMAC *scopeMAC
}

// routeLabel names a route in validation errors: "routes[1] (stripe)".
func routeLabel(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("routes[%d]", i)
	}
	return fmt.Sprintf("routes[%d] (%s)", i, name)
}

// allows reports whether the route accepts method.
func (rt *route) allows(method string) bool { return slices.Contains(rt.methods, method) }

// allowsFold reports whether method is one of the route's methods, case
// aside.
func (rt *route) allowsFold(method string) bool {
	return slices.ContainsFunc(rt.methods, func(m string) bool { return strings.EqualFold(m, method) })
}

// passes reports whether r, whose method is not one of the route's, is
// forwarded unchanged (on_other_method: forward) rather than answered 405.
// A method of the route's in another case ("post") is refused: many
// applications upper-case the method, and would take it for one whose key
// was never claimed. A signed route passes only a GET or HEAD without a
// body, which no provider signs (Meta's subscription check, GET
// ?hub.challenge=…, which the application answers after checking its
// verify token): a body reaches the application verified or not at all.
// The GET's query and headers are not verified; the application must not
// act on them.
func (rt *route) passes(r *http.Request) bool {
	switch {
	case rt.OnOtherMethod != Forward || rt.allowsFold(r.Method):
		return false
	case rt.passesReadsOnly():
		return (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.ContentLength == 0
	}
	return true
}

// passesReadsOnly reports whether the route passes other methods
// (on_other_method: forward) but, being signed, only as a GET or HEAD
// without a body (see passes).
func (rt *route) passesReadsOnly() bool {
	return rt.OnOtherMethod == Forward && rt.provider.Verifier != nil
}

// allowHeader is the Allow header of the route's 405: its methods, and on
// a signed forward route the bodiless reads it passes.
func (rt *route) allowHeader() string {
	if rt.passesReadsOnly() {
		var more []string
		for _, m := range []string{http.MethodGet, http.MethodHead} {
			if !rt.allows(m) {
				more = append(more, m)
			}
		}
		return strings.Join(append(slices.Clip(rt.methods), more...), ", ")
	}
	return strings.Join(rt.methods, ", ")
}

// routeTable is one immutable generation of routes. Reload swaps whole tables.
type routeTable struct {
	all      []*route
	exact    map[string]*route
	prefixes []*route // longest prefix first
	byName   map[string]*route
	// looseExact and loosePrefixes are exact and prefixes keyed by their
	// loosePath forms: how a lenient upstream routes (see lookup).
	looseExact    map[string]*route
	loosePrefixes []loosePrefix // longest first
}

// loosePrefix is a prefix route's prefix in its loosePath form.
type loosePrefix struct {
	prefix string // "/hooks/" for "/Hooks/*"
	rt     *route
}

// match returns the route for path: an exact route first, then the longest
// matching prefix route, or nil. A prefix route "/hooks/*" matches "/hooks"
// and every path below "/hooks/".
func (t *routeTable) match(path string) *route {
	rt, _ := t.lookup(path)
	return rt
}

// lookup returns match's route for path and whether path is ambiguous: it
// would match another route (or rt none) once read as lenient upstreams read
// paths, ignoring case, a trailing slash, ";parameters" and the last
// segment's extension (Express, Spring, Tomcat, Rails and ASP.NET each do
// some of this). A signed exact route /hooks/stripe beside an unsigned prefix
// route /hooks/* would otherwise let /hooks/Stripe/ through unsigned to the
// app's Stripe handler. A path that matches no route, or an exact route's own
// path (colliding lenient forms are a configuration error), is never
// ambiguous.
func (t *routeTable) lookup(path string) (rt *route, ambiguous bool) {
	if rt, ok := t.exact[path]; ok {
		return rt, false
	}
	for _, p := range t.prefixes {
		if underPrefix(path, p.prefix) {
			rt = p
			break
		}
	}
	if rt == nil {
		return nil, false
	}
	if lr, ok := t.looseExact[loosePath(path)]; ok {
		return rt, lr != rt
	}
	// Prefixes are compared without dropping an extension: "/v1.2" is the
	// prefix route "/v1.2/*" itself.
	n := loosePrefixPath(path)
	for _, lp := range t.loosePrefixes {
		if underPrefix(n, lp.prefix) {
			return rt, lp.rt != rt
		}
	}
	return rt, true
}

// underPrefix reports whether a prefix route with prefix ("/hooks/" for
// "/hooks/*") takes path: "/hooks" itself and every path below "/hooks/".
func underPrefix(path, prefix string) bool {
	return strings.HasPrefix(path, prefix) || path == strings.TrimSuffix(prefix, "/")
}

// isHex reports whether c is a hexadecimal digit.
func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// LenientPath returns the form of a route's configured path (exact, or a
// "/prefix/*") that two routes must not share: the path as upstreams that
// ignore case, a trailing slash, ";parameters" or an extension read it. New
// refuses routes whose forms collide; a config validator can call it to
// report that with its other problems.
func LenientPath(routePath string) string {
	if prefix, ok := strings.CutSuffix(routePath, "*"); ok && strings.HasSuffix(prefix, "/") {
		return foldCase(prefix) + "*"
	}
	return loosePath(routePath)
}

// loosePath returns p in lower case, without ";parameters" in its segments,
// a trailing "/" or the last segment's extension: everything from its first
// "." after its first byte. Spring's suffix pattern match reads a handler's
// "/hooks/stripe" as "/hooks/stripe.*", whose "*" takes dots too, so
// "/hooks/stripe.x.json" and "/hooks/stripe.." reach it as well as
// "/hooks/stripe.json" does. It allocates only when p changes.
func loosePath(p string) string {
	p = loosePrefixPath(p)
	last := p[strings.LastIndexByte(p, '/')+1:]
	if len(last) > 1 {
		if dot := strings.IndexByte(last[1:], '.'); dot >= 0 {
			p = p[:len(p)-len(last)+1+dot]
		}
	}
	return p
}

// loosePrefixPath is loosePath keeping the extension.
func loosePrefixPath(p string) string {
	if strings.IndexByte(p, ';') >= 0 {
		var b strings.Builder
		for i, seg := range strings.Split(p, "/") {
			if i > 0 {
				b.WriteByte('/')
			}
			seg, _, _ = strings.Cut(seg, ";")
			b.WriteString(seg)
		}
		p = b.String()
	}
	if len(p) > 1 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	return foldCase(p)
}

// foldCase returns p in lower case with every letter that a case-insensitive
// comparison takes for another written as that one: "ſ" (long s) as "s" and
// "ı" (dotless i) as "i", as well as the Kelvin sign as "k". strings.ToLower
// leaves the first two alone, yet Java's equalsIgnoreCase and Unicode-aware
// regular expressions (Java's UNICODE_CASE, JavaScript's /iu), and Python's
// casefold, read "/hooks/ſtripe" as "/hooks/stripe". Each rune is upper- then
// lower-cased (ı → I → i), then replaced by the least rune of its simple case
// folding orbit, lower-cased (ſ → S → s), so every spelling gives one form.
func foldCase(p string) string {
	ascii := true
	for i := 0; i < len(p); i++ {
		if p[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return strings.ToLower(p)
	}
	return strings.Map(func(r rune) rune {
		r = unicode.ToLower(unicode.ToUpper(r))
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		return unicode.ToLower(least)
	}, p)
}

// canonicalPath reports whether u's path is one every upstream reads as the
// gateway routes it: absolute, with no "." or ".." segment (also not as
// "..;x", which Tomcat reads as ".."), no empty segment but a trailing one
// ("//" is merged by nginx), no backslash, no control character, "#" or "?"
// (each possible only percent-encoded), no escape left after decoding (a
// double encoding such as %252e, which an upstream decoding twice reads as
// "."; a lone "%", as in 50%25-off, is fine), and no percent-encoded "/" or
// "\".
// Anything else could match an unsigned prefix route here and be normalised
// by the upstream into a signed route's path, skipping its signature check.
// Webhook providers post to the path they were configured with, which is
// canonical, so the gateway refuses the rest.
func canonicalPath(u *url.URL) bool {
	p := u.Path
	if p == "" || p[0] != '/' || strings.ContainsAny(p, "\\#?") {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < 0x20 || p[i] == 0x7f { // %00, %09, ... decoded
			return false
		}
		if p[i] == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) {
			return false // still an escape once decoded: a double encoding
		}
	}
	for rest := p[1:]; ; {
		seg, after, more := strings.Cut(rest, "/")
		if j := strings.IndexByte(seg, ';'); j >= 0 {
			seg = seg[:j]
		}
		if seg == "." || seg == ".." || (seg == "" && more) {
			return false
		}
		if !more {
			break
		}
		rest = after
	}
	if u.RawPath != "" {
		raw := strings.ToUpper(u.RawPath)
		if strings.Contains(raw, "%2F") || strings.Contains(raw, "%5C") {
			return false
		}
	}
	return true
}

// newProviderFunc builds a route's provider (providers.New).
type newProviderFunc func(providers.Config) (*providers.Provider, error)

// buildRoutes validates cfg, fills defaults and builds every route's
// provider. All problems are reported at once, each naming its config key.
// The routes' proxies are attached by the caller.
func buildRoutes(cfg Config, newProvider newProviderFunc, now func() time.Time) (*routeTable, error) {
	t := &routeTable{
		exact:  make(map[string]*route),
		byName: make(map[string]*route),
	}
	var errs []error
	if len(cfg.Routes) == 0 {
		errs = append(errs, errors.New("routes: at least one route is required"))
	}
	paths := make(map[string]int)
	for i, r := range cfg.Routes {
		rt, rerrs := buildRoute(i, r, newProvider, now)
		errs = append(errs, rerrs...)
		if rt == nil {
			continue
		}
		if rt.Name != "" {
			if j, dup := t.byName[rt.Name]; dup {
				errs = append(errs, fmt.Errorf("routes[%d].name: %q is already used by routes[%d]", i, rt.Name, j.index))
			} else {
				t.byName[rt.Name] = rt
			}
		}
		if rt.Path != "" {
			if j, dup := paths[rt.Path]; dup {
				errs = append(errs, fmt.Errorf("routes[%d].path: %q is already used by routes[%d]", i, rt.Path, j))
			} else {
				paths[rt.Path] = i
			}
		}
		t.all = append(t.all, rt)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	t.looseExact = make(map[string]*route)
	loose := make(map[string]*route) // every loose form, exact and prefix, to find collisions
	for _, rt := range t.all {
		// A prefix's form has its own key space: an exact route may sit at
		// a prefix's root ("/" beside "/*"); the exact one wins both readings.
		form := LenientPath(rt.Path)
		if rt.prefix == "" {
			t.exact[rt.Path] = rt
			t.looseExact[form] = rt
		} else {
			t.prefixes = append(t.prefixes, rt)
			t.loosePrefixes = append(t.loosePrefixes, loosePrefix{prefix: foldCase(rt.prefix), rt: rt})
		}
		if other, dup := loose[form]; dup {
			errs = append(errs, fmt.Errorf("routes[%d].path: %q and routes[%d].path %q are one path to an upstream that ignores case, a trailing slash, ;parameters or an extension", rt.index, rt.Path, other.index, other.Path))
		}
		loose[form] = rt
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	slices.SortStableFunc(t.prefixes, func(a, b *route) int { return len(b.prefix) - len(a.prefix) })
	slices.SortStableFunc(t.loosePrefixes, func(a, b loosePrefix) int { return len(b.prefix) - len(a.prefix) })
	return t, nil
}

// buildRoute validates and defaults one route. It returns the route (possibly
// incomplete) together with every problem found.
func buildRoute(i int, r Route, newProvider newProviderFunc, now func() time.Time) (*route, []error) {
	var errs []error
	key := func(field string) string { return fmt.Sprintf("routes[%d].%s", i, field) }
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key(field), fmt.Sprintf(format, args...)))
	}
	rt := &route{Route: r, index: i}

	switch {
	case r.Name == "":
		bad("name", "is required")
	case !validName(r.Name):
		bad("name", "%q may hold only letters, digits, '-', '_' and '.'", r.Name)
	}

	switch {
	case r.Path == "":
		bad("path", "is required")
	case !strings.HasPrefix(r.Path, "/"):
		bad("path", "%q must start with /", r.Path)
	case strings.HasSuffix(r.Path, "/*"):
		rt.prefix = strings.TrimSuffix(r.Path, "*")
		if strings.Contains(rt.prefix, "*") {
			bad("path", "%q may hold '*' only as a final \"/*\"", r.Path)
		}
	case strings.Contains(r.Path, "*"):
		bad("path", "%q may hold '*' only as a final \"/*\"", r.Path)
	}

	if r.Upstream == "" {
		bad("upstream", "is required")
	} else if u, err := url.Parse(r.Upstream); err != nil {
		bad("upstream", "%s is not a URL", RedactURL(r.Upstream))
	} else if u.Scheme != "http" && u.Scheme != "https" {
		bad("upstream", "%s must be an http:// or https:// URL", RedactURL(r.Upstream))
	} else if u.Hostname() == "" { // "http://:3000" would be dialled as this machine
		bad("upstream", "%s has no host", RedactURL(r.Upstream))
	} else if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		bad("upstream", "%s may not carry a query, fragment or user info", RedactURL(r.Upstream))
	} else {
		rt.target = u
	}

	switch {
	case rt.Namespace == "":
		rt.Namespace = r.Name
	case strings.Contains(rt.Namespace, ":"):
		// A store keys records by "namespace:id" (bbolt literally), so
		// namespace "a:b" and key "x" would be namespace "a" and key "b:x":
		// another route's key.
		bad("namespace", "%q must not contain ':' (it separates namespace and key)", rt.Namespace)
	}
	if len(r.Methods) == 0 {
		rt.methods = []string{http.MethodPost}
	}
	for j, m := range r.Methods {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m == "" || strings.ContainsFunc(m, func(c rune) bool { return c < 'A' || c > 'Z' }) {
			bad(fmt.Sprintf("methods[%d]", j), "%q is not an HTTP method", r.Methods[j])
			continue
		}
		rt.methods = append(rt.methods, m)
	}

	durations := []struct {
		field string
		v     *time.Duration
		def   time.Duration
	}{
		{"window", &rt.Window, defaultWindow},
		{"lease", &rt.Lease, defaultLease},
		{"upstream_timeout", &rt.UpstreamTimeout, defaultUpstreamTimeout},
	}
	for _, d := range durations {
		switch {
		case *d.v < 0:
			bad(d.field, "(%s) must not be negative", *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	switch {
	case r.FailedRetention < 0:
		bad("failed_retention", "(%s) must not be negative", r.FailedRetention)
	case r.FailedRetention == 0:
		rt.FailedRetention = rt.Window
	}
	if rt.Lease > 0 && rt.UpstreamTimeout > 0 && rt.Lease <= rt.UpstreamTimeout {
		errs = append(errs, fmt.Errorf("%s: lease (%s) must be longer than upstream_timeout (%s)",
			routeLabel(i, r.Name), rt.Lease, rt.UpstreamTimeout))
	}

	switch {
	case r.MaxBodyBytes < 0:
		bad("max_body_bytes", "(%d) must not be negative", r.MaxBodyBytes)
	case r.MaxBodyBytes == 0:
		rt.MaxBodyBytes = defaultMaxBodyBytes
	}
	switch {
	case r.MaxReplayBytes < 0:
		bad("max_replay_bytes", "(%d) must not be negative", r.MaxReplayBytes)
	case r.MaxReplayBytes == 0:
		rt.MaxReplayBytes = defaultMaxReplayBytes
	}
	if r.ReplayHeaders == nil {
		rt.ReplayHeaders = []string{"Content-Type"}
	}

	policies := []struct {
		field   string
		v       *string
		allowed []string
	}{
		{"on_missing_key", &rt.OnMissingKey, []string{Forward, Reject}},
		{"on_store_error", &rt.OnStoreError, []string{Forward, Reject}},
		{"on_in_flight", &rt.OnInFlight, []string{Reject, Wait}},
		{"duplicate_response", &rt.DuplicateResponse, []string{Ack, Replay}},
		{"on_fingerprint_mismatch", &rt.OnFingerprintMismatch, []string{Ack, Reject}},
		{"on_other_method", &rt.OnOtherMethod, []string{Reject, Forward}},
	}
	for _, p := range policies {
		if *p.v == "" {
			*p.v = p.allowed[0]
			continue
		}
		if !slices.Contains(p.allowed, *p.v) {
			bad(p.field, "%q must be one of %s", *p.v, strings.Join(p.allowed, ", "))
		}
	}

	// Neither message shows the secret.
	if r.ClientIdentitySecret != "" {
		if r.ClientIdentity == "" {
			bad("client_identity_secret", "is set without client_identity (it keys the hash of that header's value)")
		}
		if len(r.ClientIdentitySecret) < MinClientIdentitySecret {
			bad("client_identity_secret", "is shorter than %d bytes (the value is not shown)", MinClientIdentitySecret)
		} else {
			rt.scopeMAC = newScopeMAC(r.ClientIdentitySecret)
		}
	}

	pcfg := r.Provider
	if pcfg.Now == nil {
		pcfg.Now = now
	}
	p, err := newProvider(pcfg)
	if err != nil {
		// providers.New names the field it rejects ("keys[1]: …",
		// "secrets[0] is empty …"), so prefix only the route.
		errs = append(errs, fmt.Errorf("routes[%d].%w", i, err))
	} else {
		rt.provider = p
	}
	return rt, errs
}

// RedactURL returns raw, a configured upstream URL, fit for an error message
// or a log line: its user info, query and fragment, which may hold
// credentials, read "xxxxx". A value that does not parse, is opaque (but
// for host:port), or holds an '@' that is not user info, is not shown.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" && strings.Trim(u.Opaque, "0123456789") != "" || u.User == nil && strings.Contains(raw, "@") {
		// A mistyped URL often holds a password where url.Parse sees none
		// ("http://admin:s3cret", a port): show none of it.
		return "(not shown: it may hold credentials)"
	}
	if u.Opaque != "" { // host:port without a scheme
		return strconv.Quote(raw)
	}
	if u.User != nil {
		u.User = url.User("xxxxx")
	}
	if u.RawQuery != "" {
		u.RawQuery = "xxxxx"
	}
	if u.Fragment != "" {
		u.Fragment, u.RawFragment = "xxxxx", ""
	}
	return strconv.Quote(u.String())
}

// validName reports whether a route name is safe as a metric label value and
// as a path segment of the keys API.
func validName(s string) bool {
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return s != "" && s != "." && s != ".."
}
