package main

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/providers"
	"github.com/dedupgw/dedupgw/proxy"
)

// Validate checks every rule that the contract states for a configuration and
// returns all the problems it finds as Problems, each named by its key, or
// nil. Values that Load could not decode are left unset and are not reported
// twice.
func (f *File) Validate() error {
	var ps Problems
	f.checkAddr(&ps, "listen", f.Listen, ":8080")
	if f.checkAddr(&ps, "admin.listen", f.Admin.Listen, "127.0.0.1:9090") && f.Admin.unguarded() {
		ps.add("admin.listen", "%q is not a loopback address: set admin.token (or admin.insecure: true to serve the keys API without one)%s", f.Admin.Listen, f.unsetNote("admin.listen"))
	}
	if strings.ContainsFunc(string(f.Admin.Token), func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		ps.add("admin.token", "holds a control character (a line break, a tab; the value is not shown): no client can send it in an Authorization header, so every /v1/* call would be refused")
	}
	if f.Listen == f.Admin.Listen && !strings.HasSuffix(f.Listen, ":0") {
		ps.add("admin.listen", "%q is also listen: the two listeners need different addresses", f.Admin.Listen)
	}
	oneOf(&ps, "log.level", f.Log.Level, "debug", "info", "warn", "error")
	oneOf(&ps, "log.format", f.Log.Format, "json", "console")
	f.checkServer(&ps)
	f.checkStore(&ps)

	checkPolicy(&ps, "defaults", f.Defaults)
	def := builtinPolicy().over(f.Defaults)
	if *def.Lease <= *def.UpstreamTimeout && (f.Defaults.Lease != nil || f.Defaults.UpstreamTimeout != nil) &&
		!f.undecoded["defaults.lease"] && !f.undecoded["defaults.upstream_timeout"] {
		ps.add("defaults.lease", "%v%s must be longer than upstream_timeout %v%s",
			*def.Lease, origin(f.Defaults.Lease, nil), *def.UpstreamTimeout, origin(f.Defaults.UpstreamTimeout, nil))
	}

	if len(f.Routes) == 0 {
		ps.add("routes", "at least one route is required")
	}
	names := map[string]int{}
	paths := map[string]int{}
	for i, r := range f.Routes {
		key := fmt.Sprintf("routes[%d]", i)
		f.checkRoute(&ps, key, r)
		if r.Name != "" {
			if j, dup := names[r.Name]; dup {
				ps.add(key+".name", "duplicate route name %q (also routes[%d])", r.Name, j)
			} else {
				names[r.Name] = i
			}
		}
		if r.Path != "" {
			// Paths that differ only in what lenient upstreams ignore (case,
			// a trailing slash, ;params, an extension) collide too.
			form := proxy.LenientPath(r.Path)
			switch j, dup := paths[form]; {
			case dup && f.Routes[j].Path == r.Path:
				ps.add(key+".path", "duplicate path %q (also routes[%d])", r.Path, j)
			case dup:
				ps.add(key+".path", "%q and routes[%d].path %q are one path to an upstream that ignores case, a trailing slash, ;parameters or an extension", r.Path, j, f.Routes[j].Path)
			default:
				paths[form] = i
			}
		}
		checkPolicy(&ps, key, r.Policy)
		// A side that did not decode is not compared: the route's own, or
		// the defaults' when the route inherits it.
		leaseBad := f.undecoded[key+".lease"] || r.Lease == nil && f.undecoded["defaults.lease"]
		timeoutBad := f.undecoded[key+".upstream_timeout"] || r.UpstreamTimeout == nil && f.undecoded["defaults.upstream_timeout"]
		if (r.Lease != nil || r.UpstreamTimeout != nil) && !leaseBad && !timeoutBad {
			p := f.effective(i)
			if *p.Lease <= *p.UpstreamTimeout {
				ps.add(key+".lease", "%v%s must be longer than upstream_timeout %v%s",
					*p.Lease, origin(r.Lease, f.Defaults.Lease), *p.UpstreamTimeout, origin(r.UpstreamTimeout, f.Defaults.UpstreamTimeout))
			}
		}
	}
	ps = f.hideFileContents(f.dropFileErrKeys(ps))
	f.fromEnvNote(ps)
	return ps.errOrNil()
}

// checkAddr reports whether addr is a valid host:port, adding a problem if not.
// An address holding user info or a scheme ("redis://:pw@redis:6379", a
// REDIS_URL where an address belongs) is refused without being shown: the
// problem is printed by validate and logged by serve, and its password would
// be too (a "pw@redis:6379" would otherwise pass, and be logged and dialled).
func (f *File) checkAddr(ps *Problems, key, addr, example string) bool {
	store := strings.HasPrefix(key, "store.")
	if strings.Contains(addr, "@") || strings.Contains(addr, "://") {
		where := ""
		if store {
			where = ", and the password in store.redis.password"
		}
		ps.add(key, "invalid address (not shown: it may hold credentials; want host:port, e.g. %q%s)", example, where)
		return false
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		ps.add(key, "invalid address %q (want host:port, e.g. %q)%s", addr, example, f.unsetNote(key))
		return false
	}
	want := "a number from 0 to 65535 or a service name"
	if store {
		want = "a number from 1 to 65535 or a service name" // 0 names no server
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil && !allDigits(port) { // a service name, e.g. http
		var named int
		named, err = net.LookupPort("tcp", port)
		n = uint64(max(named, 0))
	}
	if err != nil || store && n == 0 {
		ps.add(key, "invalid port in %q (want %s, e.g. %q)%s", addr, want, example, f.unsetNote(key))
		return false
	}
	return true
}

// allDigits reports whether s is non-empty and all ASCII digits.
func allDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// isLoopback reports whether the host of addr is a loopback name or address.
// An empty host means every interface and is not.
func isLoopback(addr string) bool {
	host, _, _ := net.SplitHostPort(addr)
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// checkServer checks the server: block: each timeout it sets is positive,
// read_timeout (headers and body) is not shorter than the header timeout,
// and every trusted proxy is a prefix or an address.
func (f *File) checkServer(ps *Problems) {
	s := f.Server
	ok := true
	positive := func(name string, d *time.Duration) {
		if d != nil && *d <= 0 {
			ps.add("server."+name, "must be greater than 0, got %v", *d)
			ok = false
		}
	}
	positive("read_header_timeout", s.ReadHeaderTimeout)
	positive("read_timeout", s.ReadTimeout)
	positive("idle_timeout", s.IdleTimeout)
	if ok && s.ReadTimeout != nil && *s.ReadTimeout < headerTimeout(f) {
		ps.add("server.read_timeout", "%v must not be shorter than read_header_timeout %v (it bounds headers and body)", *s.ReadTimeout, headerTimeout(f))
	}
	if _, i, err := s.trustedProxies(); err != nil {
		ps.add(fmt.Sprintf("server.trusted_proxies[%d]", i), "%q is neither a CIDR prefix nor an address (e.g. \"10.0.0.0/8\" or \"35.191.0.1\")", s.TrustedProxies[i])
	}
}

func (f *File) checkStore(ps *Problems) {
	s := f.Store
	switch s.Backend {
	case "bolt":
		if s.Bolt.Path == "" {
			ps.add("store.bolt.path", "%s", f.empty("store.bolt.path"))
		}
	case "memory":
	case "redis":
		if len(s.Redis.Addrs) == 0 {
			ps.add("store.redis.addrs", "at least one address is required%s", f.unsetNote("store.redis.addrs"))
		}
		for i, a := range s.Redis.Addrs {
			f.checkAddr(ps, fmt.Sprintf("store.redis.addrs[%d]", i), a, "redis:6379")
		}
		if s.Redis.DB < 0 {
			ps.add("store.redis.db", "must not be negative, got %d", s.Redis.DB)
		}
		if s.Redis.SentinelUsername != "" && s.Redis.SentinelPassword == "" {
			ps.add("store.redis.sentinel_username", "needs sentinel_password: without one no AUTH is sent to the sentinels%s", f.unsetNote("store.redis.sentinel_password"))
		}
		if s.Redis.MasterName == "" {
			for _, k := range []struct{ key, v string }{{"sentinel_username", s.Redis.SentinelUsername}, {"sentinel_password", string(s.Redis.SentinelPassword)}} {
				if k.v != "" {
					ps.add("store.redis."+k.key, "authenticates to the sentinels: set it only with master_name")
				}
			}
		}
		if s.Redis.Cluster && s.Redis.MasterName != "" {
			ps.add("store.redis.cluster", "a Redis Cluster has no master_name (that is Sentinel): set one or the other")
		}
		if s.Redis.DB != 0 && s.Redis.cluster() {
			ps.add("store.redis.db", "a Redis Cluster (several addrs, or cluster: true) has only db 0")
		}
		if s.Redis.PoolSize < 0 {
			ps.add("store.redis.pool_size", "must not be negative, got %d", s.Redis.PoolSize)
		}
		// Negative read and write timeouts mean "no timeout" to the backend.
		if s.Redis.DialTimeout < 0 {
			ps.add("store.redis.dial_timeout", "must not be negative, got %v", s.Redis.DialTimeout)
		}
		f.checkWait(ps)
	default:
		ps.add("store.backend", "unknown backend %q (want bolt, redis or memory)", s.Backend)
	}
}

// checkWait checks store.redis.wait_replicas and wait_timeout, as
// redisstore.Config does, naming the keys.
func (f *File) checkWait(ps *Problems) {
	r := f.Store.Redis
	if r.WaitReplicas < 0 {
		ps.add("store.redis.wait_replicas", "must not be negative, got %d", r.WaitReplicas)
	}
	if r.WaitReplicas > 0 && r.cluster() {
		ps.add("store.redis.wait_replicas", "a Redis Cluster (several addrs, or cluster: true) routes WAIT to no particular shard; use it with a single node or Sentinel")
	}
	switch wait := r.WaitTimeout; {
	case wait < 0:
		ps.add("store.redis.wait_timeout", "must not be negative, got %v", wait)
	case wait > 0 && wait < time.Millisecond:
		ps.add("store.redis.wait_timeout", "must be at least 1ms, got %v (Redis's WAIT counts milliseconds)", wait)
	case r.WaitReplicas > 0:
		if wait == 0 {
			wait = redisstore.DefaultWaitTimeout
		}
		read := r.ReadTimeout
		if read == 0 {
			read = redisstore.DefaultReadTimeout
		}
		switch {
		case read > 0 && wait >= read:
			ps.add("store.redis.wait_timeout", "%v must be below store.redis.read_timeout (%v), which would cut the wait off", wait, read)
		case wait >= proxy.DefaultStoreTimeout:
			ps.add("store.redis.wait_timeout", "%v must be below the gateway's %v bound on a store operation, which would cut the wait off", wait, proxy.DefaultStoreTimeout)
		}
	}
}

// checkPolicy checks the keys that p sets; prefix is "defaults" or "routes[i]".
func checkPolicy(ps *Problems, prefix string, p Policy) {
	positive := func(name string, d *time.Duration) {
		if d != nil && *d <= 0 {
			ps.add(prefix+"."+name, "must be greater than 0, got %v", *d)
		}
	}
	positive("window", p.Window)
	positive("failed_retention", p.FailedRetention)
	positive("lease", p.Lease)
	positive("upstream_timeout", p.UpstreamTimeout)
	if p.MaxBodyBytes != nil && *p.MaxBodyBytes <= 0 {
		ps.add(prefix+".max_body_bytes", "must be greater than 0, got %d", *p.MaxBodyBytes)
	}
	if p.MaxReplayBytes != nil && *p.MaxReplayBytes <= 0 {
		ps.add(prefix+".max_replay_bytes", "must be greater than 0, got %d (omit it for the default, 65536)", *p.MaxReplayBytes)
	}
	policy := func(name string, v *string, allowed ...string) {
		if v != nil {
			oneOf(ps, prefix+"."+name, *v, allowed...)
		}
	}
	policy("on_missing_key", p.OnMissingKey, proxy.Forward, proxy.Reject)
	policy("on_store_error", p.OnStoreError, proxy.Forward, proxy.Reject)
	policy("on_in_flight", p.OnInFlight, proxy.Reject, proxy.Wait)
	policy("duplicate_response", p.DuplicateResponse, proxy.Ack, proxy.Replay)
	policy("on_fingerprint_mismatch", p.OnFingerprintMismatch, proxy.Ack, proxy.Reject)
	for i, h := range p.ReplayHeaders {
		if !isToken(h) {
			ps.add(fmt.Sprintf("%s.replay_headers[%d]", prefix, i), "invalid header name %q", h)
		}
	}
}

var routeName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

func (f *File) checkRoute(ps *Problems, key string, r Route) {
	switch {
	case r.Name == "":
		ps.add(key+".name", "%s", f.empty(key+".name"))
	case !routeName.MatchString(r.Name):
		ps.add(key+".name", "invalid name %q (letters, digits, '_', '.', '-'; it appears in URLs and metric labels)", r.Name)
	}
	checkPath(ps, key+".path", r.Path, f.empty(key+".path"))
	if r.Upstream == "" {
		ps.add(key+".upstream", "%s", f.empty(key+".upstream"))
	} else if schemeless(r.Upstream) {
		ps.add(key+".upstream", "invalid upstream URL %q: no scheme (want \"http://%s\", or https://…)%s", r.Upstream, r.Upstream, f.unsetNote(key+".upstream"))
	} else if u, err := url.Parse(r.Upstream); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		// No host name ("http://:3000", from "http://${APP_HOST}:3000"
		// with APP_HOST unset) would be dialled as this machine.
		ps.add(key+".upstream", "invalid upstream URL %s (want http://host[:port][/path] or https://…)%s", proxy.RedactURL(r.Upstream), f.unsetNote(key+".upstream"))
	} else if u.User != nil {
		// The transport would drop it silently, and it would be a secret
		// in the config's logs.
		ps.add(key+".upstream", "upstream URL %s must not carry user info (the gateway sends no credentials of its own)", proxy.RedactURL(r.Upstream))
	} else if u.RawQuery != "" || u.Fragment != "" {
		ps.add(key+".upstream", "upstream URL %s must not have a query or fragment", proxy.RedactURL(r.Upstream))
	}
	if strings.Contains(r.Namespace, ":") {
		ps.add(key+".namespace", "must not contain ':' (it separates namespace and key), got %q", r.Namespace)
	} else if strings.ContainsFunc(r.Namespace, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		// The application gets it at the start of Dedup-Key, where HTTP
		// drops leading white space (" ns" would read as route ns's
		// namespace) and a control character fails every forward.
		ps.add(key+".namespace", "must not contain white space or control characters (it begins the application's Dedup-Key header), got %q", r.Namespace)
	}

	provider := providerOf(r)
	switch provider {
	case providers.Stripe, providers.Shopify, providers.GitHub, providers.StandardWebhooks, providers.Slack, providers.Generic:
	default:
		hint := ""
		if strings.EqualFold(provider, "svix") {
			hint = "; Svix signs as Standard Webhooks: use standard-webhooks"
		}
		ps.add(key+".provider", "unknown provider %q (want %s, %s, %s, %s, %s or %s)%s", r.Provider,
			providers.Stripe, providers.Shopify, providers.GitHub, providers.StandardWebhooks, providers.Slack, providers.Generic, hint)
	}
	if provider == providers.Generic && len(r.Keys) == 0 {
		if r.Provider == "" {
			ps.add(key+".keys", "a route without a provider (generic) needs keys (e.g. [\"header:Idempotency-Key\", \"body\"]); or set provider (%s, %s, %s, %s or %s)",
				providers.Stripe, providers.Shopify, providers.GitHub, providers.StandardWebhooks, providers.Slack)
		} else {
			ps.add(key+".keys", "provider generic needs keys (e.g. [\"header:Idempotency-Key\", \"body\"])")
		}
	}
	for i, k := range r.Keys {
		if err := checkKeySource(k); err != nil {
			k := fmt.Sprintf("%s.keys[%d]", key, i)
			ps.add(k, "%v%s", err, f.unsetNote(k))
		}
	}
	for i, s := range r.Secrets {
		k := fmt.Sprintf("%s.secrets[%d]", key, i)
		why := f.whyEmpty(k)
		if i == 0 && len(r.Secrets) == 1 && why == "" {
			why = f.whyEmpty(key + ".secrets") // written as one string, not a list
		}
		switch {
		case s == "" && why != "":
			ps.add(k, "must not be empty (%s)", why)
		case s == "":
			ps.add(k, "%s", f.empty(k))
		case why != "":
			// "whsec_${SUFFIX}" with SUFFIX unset is "whsec_": not empty,
			// but not the secret either, and every delivery would fail.
			addPartlyUnset(ps, k, why)
		}
	}
	if provider == providers.StandardWebhooks || provider == providers.Generic {
		// The secret's format (whsec_<base64>, whpk_<base64>; an ECDSA
		// verification key, and no such key as an HMAC secret) is checked
		// here too, so it is listed with every other problem and names
		// its route, not found only when the gateway is built.
		for i, s := range r.Secrets {
			if s == "" {
				continue
			}
			cfg := providers.Config{Provider: provider, Secrets: []string{s}}
			if provider == providers.Generic {
				// Only the secret is checked here: an ECDSA key's
				// format, or a public key given as an HMAC secret.
				cfg.Keys = []string{"body"}
				if verifiesWithPublicKeys(r) {
					cfg.Signature.Algorithm = r.Signature.Algorithm
				}
			}
			if err := cfg.Validate(); err != nil {
				_, msg, _ := strings.Cut(err.Error(), ": ")
				ps.add(fmt.Sprintf("%s.secrets[%d]", key, i), "%s", msg)
			}
		}
	}
	switch {
	case r.Tolerance != nil && *r.Tolerance <= 0:
		ps.add(key+".tolerance", "must be greater than 0, got %v (omit it for the default, 300s)", *r.Tolerance)
	case r.Tolerance != nil && *r.Tolerance < time.Second:
		// A delivery's signed timestamp is whole seconds, up to a second
		// before it was sent: most would be refused.
		ps.add(key+".tolerance", "must be at least 1s, got %v: signed timestamps are whole seconds, so most deliveries would fail their check (omit it for the default, 300s)", *r.Tolerance)
	}
	for i, m := range r.Methods {
		if !isToken(m) || m != strings.ToUpper(m) {
			ps.add(fmt.Sprintf("%s.methods[%d]", key, i), "invalid method %q (want upper case, e.g. POST)", m)
		}
	}
	oneOfOrEmpty(ps, key+".on_other_method", r.OnOtherMethod, proxy.Reject, proxy.Forward)
	if r.Signature != (Signature{}) {
		before := len(*ps)
		if provider != providers.Generic {
			ps.add(key+".signature", "only provider generic takes a signature block; %s has its own scheme", provider)
		}
		oneOfFold(ps, key+".signature.algorithm", r.Signature.Algorithm, "sha1", "sha256", "sha512", providers.ECDSASHA256)
		oneOfFold(ps, key+".signature.encoding", r.Signature.Encoding, "hex", "base64")
		oneOfFold(ps, key+".signature.timestamp_format", r.Signature.TimestampFormat, "unix", "rfc3339")
		if h := r.Signature.Header; h != "" && !isToken(h) {
			ps.add(key+".signature.header", "invalid header name %q", h)
		}
		if h := r.Signature.TimestampHeader; h != "" && !isToken(h) {
			ps.add(key+".signature.timestamp_header", "invalid header name %q", h)
		}
		if note := f.unsetNote(key + ".signature.template"); note != "" {
			// Whatever the variable held (a notification URL, say) is
			// missing from the signed content: no delivery would verify.
			ps.add(key+".signature.template", "part of it is missing, so no delivery would verify%s", note)
		}
		if strings.Contains(r.Signature.Template, "{timestamp}") && r.Signature.TimestampHeader == "" && r.Signature.TimestampField == "" {
			ps.add(key+".signature.template", "uses {timestamp} but signature.timestamp_header (or timestamp_field) is not set")
		}
		if len(*ps) == before {
			// What only the providers package knows (an unsigned
			// timestamp_header, a bad template), in this same list.
			if err := providers.GenericSignature(r.Signature).Validate(); err != nil {
				field, msg, _ := strings.Cut(err.Error(), ": ")
				ps.add(key+"."+field, "%s", msg)
			}
		}
	}
	for i, e := range r.FingerprintExclude {
		if e == "" {
			ps.add(fmt.Sprintf("%s.fingerprint_exclude[%d]", key, i), "empty field name")
		}
	}
	if r.ClientIdentity != "" && !isToken(r.ClientIdentity) {
		ps.add(key+".client_identity", "invalid header name %q", r.ClientIdentity)
	}
	f.checkIdentitySecret(ps, key, r)
}

// checkIdentitySecret checks a route's client_identity_secret, as
// proxy.New does, without showing it. Set but empty is an error: a
// ${VAR} left unset would otherwise hash without the secret, and re-scope
// every key.
func (f *File) checkIdentitySecret(ps *Problems, key string, r Route) {
	if r.ClientIdentitySecret == nil {
		return
	}
	k := key + ".client_identity_secret"
	why := f.whyEmpty(k)
	switch s := *r.ClientIdentitySecret; {
	case s == "":
		ps.add(k, "%s (set it; removing the key instead hashes client identities without a secret and re-scopes every key)", f.empty(k))
	case why != "":
		addPartlyUnset(ps, k, why)
	case len(s) < proxy.MinClientIdentitySecret:
		ps.add(k, "is shorter than %d bytes (the value is not shown); use a random one, e.g. from openssl rand -hex 32", proxy.MinClientIdentitySecret)
	}
	if r.ClientIdentity == "" {
		ps.add(k, "is set without client_identity (it keys the hash of that header's value)")
	}
}

// addPartlyUnset reports the secret at key, built in part from unset
// variables or empty files (why, from whyEmpty): not empty, but not the
// secret either.
func addPartlyUnset(ps *Problems, key, why string) {
	ps.add(key, "%s (the secret would be only the rest of its text)", why)
}

func checkPath(ps *Problems, key, path, emptyMsg string) {
	switch {
	case path == "":
		ps.add(key, "%s", emptyMsg)
	case !strings.HasPrefix(path, "/"):
		ps.add(key, "must start with \"/\", got %q", path)
	case strings.ContainsAny(path, "?# \t"):
		ps.add(key, "must be a plain path without query, fragment or spaces, got %q", path)
	case strings.Contains(strings.TrimSuffix(path, "/*"), "*"):
		ps.add(key, "\"*\" is only allowed as a final \"/*\" (a prefix), got %q", path)
	}
}

// checkKeySource checks one keys: entry with the providers package's own
// parser, so the config and the gateway agree on what is valid.
func checkKeySource(s string) error {
	err := providers.ValidateKeys([]string{s})
	if kse, ok := errors.AsType[*providers.KeySourceError](err); ok {
		hint := ""
		if strings.HasPrefix(kse.Reason, "unknown") {
			hint = " (want header:NAME, json:PATH, query:NAME or body)"
		}
		return fmt.Errorf("%s %q%s", kse.Reason, kse.Source, hint)
	}
	return err
}

// isToken reports whether s is a non-empty RFC 9110 token (header names,
// methods).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c > 0x7e || c <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c) {
			return false
		}
	}
	return true
}

func oneOf(ps *Problems, key, v string, allowed ...string) {
	for _, a := range allowed {
		if v == a {
			return
		}
	}
	ps.add(key, "invalid value %q (want %s)", v, orList(allowed))
}

func oneOfOrEmpty(ps *Problems, key, v string, allowed ...string) {
	if v != "" {
		oneOf(ps, key, v, allowed...)
	}
}

// oneOfFold is oneOfOrEmpty in any case (SHA256, Base64), for the values the
// providers package reads that way.
func oneOfFold(ps *Problems, key, v string, allowed ...string) {
	if i := slices.IndexFunc(allowed, func(a string) bool { return strings.EqualFold(v, a) }); i >= 0 {
		v = allowed[i]
	}
	oneOfOrEmpty(ps, key, v, allowed...)
}

func orList(s []string) string {
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// empty explains an empty required value, naming the unset environment
// variables it was expanded from, if any.
func (f *File) empty(key string) string {
	return "must not be empty" + f.unsetNote(key)
}

// unsetNote returns " (environment variable X is not set)" when key's value
// named ${X} references the environment did not set, " (file F is empty)"
// when it named an empty file with ${file:F}, else "": why the value is
// empty or does not decode.
func (f *File) unsetNote(key string) string {
	if why := f.whyEmpty(key); why != "" {
		return " (" + why + ")"
	}
	return ""
}

// Warnings returns what is valid in f but likely a mistake, each naming its
// key: validate prints them and serve logs them at start-up.
//
// A failed_retention longer than the window keeps receipts of failures
// longer than those of successes.
//
// A window shorter than twice the signature tolerance on a route that signs
// timestamps forgets a key while a captured copy of its delivery still
// verifies: the copy is forwarded again. A window shorter than the span the
// route's provider documents for its retries (providers.RetrySpan) forgets
// a key the provider may still deliver.
//
// A tolerance on a route whose signatures carry no timestamp bounds nothing.
//
// A prefix route that maps gateway paths onto upstream paths otherwise
// than a route verifying its deliveries otherwise, on the same upstream
// server, may forward some to that route's handler (strip_path, or
// upstream base paths that differ): senders reach it without its
// signature.
//
// An unsigned generic route that replays stored answers without
// client_identity replays the answer one client got to any client that
// sends the same key (the IETF idempotency draft scopes keys per client).
//
// A provider route without secrets verifies nothing: whoever can reach the
// gateway can send a real event's ID first. Nor does a generic route with a
// signature: scheme but no secrets, which looks verified.
//
// A DEDUPGW_* variable set to "" is ignored (an unset ${VAR} in a compose
// file or manifest gives one).
//
// A value built from a ${VAR} the environment did not set is empty there.
//
// A key_prefix holding a Redis hash tag ({...}) on a Cluster puts every
// key in one slot, on one node.
//
// A secret that begins or ends with white space (a trailing newline of a
// file the variable was read from) is not what any provider signs with; a
// client_identity_secret with it scopes keys unlike a replica given the
// secret without it.
//
// A replay_headers entry the gateway never replays as stored
// (notReplayed) does nothing. A route that replays stored answers and takes
// HEAD replays a HEAD's empty answer to later requests with its key; one
// whose replay_headers leaves out Content-Type replays bodies untyped.
//
// store.redis.wait_replicas makes a claim fail while too few replicas
// acknowledge it; a route with on_store_error: forward then forwards every
// delivery without deduplication.
func (f *File) Warnings() []Problem {
	ws := append(f.envWarnings(), f.unsetWarnings()...)
	var unsigned []string // provider routes without secrets
	var failOpen []string // routes that forward on store errors, when claims wait for replicas
	waiting := f.Store.Backend == "redis" && f.Store.Redis.WaitReplicas > 0
	for i, r := range f.Routes {
		p := f.effective(i)
		if waiting && p.OnStoreError != nil && *p.OnStoreError == proxy.Forward {
			failOpen = append(failOpen, strconv.Quote(r.Name))
		}
		if p.FailedRetention != nil && *p.FailedRetention > *p.Window {
			ws = append(ws, Problem{
				Key: fmt.Sprintf("routes[%d].failed_retention", i),
				Msg: fmt.Sprintf("route %q keeps failed keys (%v) longer than processed ones (window %v)", r.Name, *p.FailedRetention, *p.Window),
			})
		}
		publicKeys := verifiesWithPublicKeys(r)
		for j, secret := range r.Secrets {
			if publicKeys {
				continue // a verification key is read with white space skipped
			}
			if providerOf(r) == providers.StandardWebhooks {
				// A base64 secret's line breaks are skipped as it is
				// decoded: a trailing newline signs nothing else.
				secret = strings.TrimRight(secret, "\r\n")
			}
			if secret != "" && strings.TrimSpace(secret) != secret {
				ws = append(ws, Problem{
					Key: fmt.Sprintf("routes[%d].secrets[%d]", i, j),
					Msg: fmt.Sprintf("route %q has a secret that begins or ends with white space (a space, or a newline more, in the file or variable it was read from?): deliveries signed with the secret itself fail their check", r.Name),
				})
			}
		}
		if cis := identitySecretOf(r); cis != "" && strings.TrimSpace(cis) != cis {
			ws = append(ws, Problem{
				Key: fmt.Sprintf("routes[%d].client_identity_secret", i),
				Msg: fmt.Sprintf("route %q has a client_identity_secret that begins or ends with white space (a space, or a newline more, in the file or variable it was read from?): a replica given the same secret without it scopes every key differently", r.Name),
			})
		}
		if r.Tolerance != nil && !timestamped(r) {
			ws = append(ws, Problem{
				Key: fmt.Sprintf("routes[%d].tolerance", i),
				Msg: fmt.Sprintf("route %q sets a tolerance, but its signatures carry no timestamp (%s), so it bounds nothing", r.Name, untimedReason(r)),
			})
		}
		if span, why := providers.RetrySpan(providerOf(r)); p.Window != nil && *p.Window < span {
			ws = append(ws, Problem{
				Key: fmt.Sprintf("routes[%d].window", i),
				Msg: fmt.Sprintf("route %q forgets a processed key after %v, but %s: a retry that reaches the gateway later (its answers lost, or the gateway unreachable for a while) is forwarded again; set window: %dh or more", r.Name, *p.Window, why, (span+time.Hour-1)/time.Hour),
			})
		}
		if p.Window != nil && signsTimestamps(r) {
			tol := toleranceOf(r)
			if accepted := 2 * tol; *p.Window < accepted {
				ws = append(ws, Problem{
					Key: fmt.Sprintf("routes[%d].window", i),
					Msg: fmt.Sprintf("route %q forgets a processed key after %v, but accepts a signed timestamp for up to %v after a delivery first arrives (tolerance %v, past and future): a copy captured in transit and sent again after the window still verifies, and is forwarded again; keep window at least %v", r.Name, *p.Window, accepted, tol, accepted),
				})
			}
		}
		generic := providerOf(r) == providers.Generic
		if !generic && len(r.Secrets) == 0 {
			unsigned = append(unsigned, strconv.Quote(r.Name))
		}
		if generic && len(r.Secrets) == 0 && r.Signature != (Signature{}) {
			ws = append(ws, Problem{
				Key: fmt.Sprintf("routes[%d].signature", i),
				Msg: fmt.Sprintf("route %q describes a signature but has no secrets:, so it verifies nothing: anyone who can reach the gateway can send events on it; set secrets (the scheme is used only with them)", r.Name),
			})
		}
		// The route's keys and signature as the providers package reads
		// them, for the checks of what the signature covers.
		signing := providers.Config{
			Provider: r.Provider, Keys: r.Keys, Secrets: r.Secrets,
			Signature: providers.GenericSignature(r.Signature),
		}
		if srcs := providers.UnsignedKeySources(signing); len(srcs) > 0 {
			ws = append(ws, Problem{
				Key: fmt.Sprintf("routes[%d].keys", i),
				Msg: fmt.Sprintf("route %q verifies signatures, but its key source(s) %s are not covered by them: whoever captured one signed delivery can resend it under any key, so the application processes it again, and a real event's key claimed that way before the event arrives makes its genuine delivery a duplicate that is never forwarded; key on what the signature covers (json:, body) or, on a generic route, sign the header ({header:NAME} in signature.template)", r.Name, strings.Join(srcs, ", ")),
			})
		}
		if srcs := providers.ShiftableKeySources(signing); len(srcs) > 0 {
			ws = append(ws, Problem{
				Key: fmt.Sprintf("routes[%d].signature.template", i),
				Msg: fmt.Sprintf("route %q keys by %s, which its signature template signs next to another header or the body with nothing between them: whoever captured one delivery can move characters from one to the other (\"msg-1\" + \"abc\" as \"msg-1a\" + \"bc\") and resend it under a new key, which the signature still verifies, so the application processes it again; key on a value the template separates from its neighbours (a literal or {timestamp} between them)", r.Name, strings.Join(srcs, ", ")),
			})
		}
		ws = append(ws, replayHeaderWarnings(fmt.Sprintf("routes[%d]", i), r.ReplayHeaders)...)
		if p.DuplicateResponse != nil && *p.DuplicateResponse == proxy.Replay {
			if j := slices.Index(r.Methods, http.MethodHead); j >= 0 {
				pass := ""
				if len(r.Secrets) == 0 {
					pass = ", and set on_other_method: forward to pass it through"
				}
				ws = append(ws, Problem{
					Key: fmt.Sprintf("routes[%d].methods[%d]", i, j),
					Msg: fmt.Sprintf("route %q replays stored answers and takes HEAD: a HEAD's answer has no body, so a HEAD first with a key is replayed, empty, to every later request with that key; a safe method needs no idempotency key, so leave HEAD out of methods%s", r.Name, pass),
				})
			}
			if !slices.ContainsFunc(p.ReplayHeaders, func(h string) bool { return strings.EqualFold(h, "Content-Type") }) {
				ws = append(ws, Problem{
					Key: fmt.Sprintf("routes[%d].replay_headers", i),
					Msg: fmt.Sprintf("route %q replays stored answers without their Content-Type (replay_headers does not list it): a client cannot tell what a replayed body is; list Content-Type", r.Name),
				})
			}
		}
		if generic && len(r.Secrets) == 0 && r.ClientIdentity == "" && p.DuplicateResponse != nil && *p.DuplicateResponse == proxy.Replay {
			cookies := ""
			if slices.ContainsFunc(p.ReplayHeaders, func(h string) bool { return strings.EqualFold(h, "Set-Cookie") }) {
				cookies = ", and replay_headers lists Set-Cookie, so the cookies set for another client too (a session of theirs)"
			}
			ws = append(ws, Problem{
				Key: fmt.Sprintf("routes[%d].client_identity", i),
				Msg: fmt.Sprintf("route %q replays stored answers without client_identity: any client that sends another's key gets the answer stored for it%s; set client_identity (e.g. Authorization)", r.Name, cookies),
			})
		}
	}
	ws = append(ws, replayHeaderWarnings("defaults", f.Defaults.ReplayHeaders)...)
	ws = append(ws, f.sharedNamespaceWarnings()...)
	ws = append(ws, f.reachWarnings()...)
	if len(unsigned) > 0 {
		verb := "verify"
		if len(unsigned) == 1 {
			verb = "verifies"
		}
		ws = append(ws, Problem{
			Key: "routes",
			Msg: fmt.Sprintf("%s %s no signatures (a provider but no secrets:): anyone who can reach the gateway can send a real event's ID first and have the genuine delivery answered as a duplicate", strings.Join(unsigned, ", "), verb),
		})
	}
	if r := f.Store.Redis; f.Store.Backend == "redis" && r.cluster() && hasHashTag(r.KeyPrefix) {
		ws = append(ws, Problem{
			Key: "store.redis.key_prefix",
			Msg: fmt.Sprintf("%q holds a hash tag: every key hashes to its one slot, so one Cluster node holds and serves them all; drop the braces to spread the keys", r.KeyPrefix),
		})
	}
	if len(failOpen) > 0 {
		ws = append(ws, Problem{
			Key: "store.redis.wait_replicas",
			Msg: fmt.Sprintf("claims fail while fewer than %d replicas acknowledge them (a replica down, or after a failover), and then %s (on_store_error: forward, the default) forward every delivery without deduplication: set on_store_error: reject", f.Store.Redis.WaitReplicas, strings.Join(failOpen, ", ")),
		})
	}
	return ws
}

// signsTimestamps reports whether r verifies a signed timestamp against its
// tolerance: a route with secrets whose scheme signs one (see timestamped).
func signsTimestamps(r Route) bool {
	return len(r.Secrets) > 0 && timestamped(r)
}

// timestamped reports whether r's signature scheme signs a timestamp, which
// tolerance bounds: stripe, slack and standard-webhooks, and generic with a
// signature.timestamp_header or timestamp_field.
func timestamped(r Route) bool {
	switch providerOf(r) {
	case providers.Stripe, providers.Slack, providers.StandardWebhooks:
		return true
	case providers.Generic:
		return r.Signature.TimestampHeader != "" || r.Signature.TimestampField != ""
	}
	return false
}

// untimedReason says why r's signatures carry no timestamp (timestamped is
// false).
func untimedReason(r Route) string {
	if providerOf(r) == providers.Generic {
		return "no signature.timestamp_header or timestamp_field"
	}
	return providerOf(r) + " signs none"
}

// notReplayed are the response headers a replay never carries as stored:
// the gateway sets Content-Length and Dedup-Status itself, a replay is not
// chunked, and the rest belong to one connection.
var notReplayed = []string{"Connection", "Content-Length", "Dedup-Status", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// replayHeaderWarnings warns about each header of a replay_headers list
// (under prefix) that a replay never carries as stored (notReplayed).
func replayHeaderWarnings(prefix string, headers []string) []Problem {
	var ws []Problem
	for i, h := range headers {
		if slices.Contains(notReplayed, http.CanonicalHeaderKey(h)) {
			ws = append(ws, Problem{
				Key: fmt.Sprintf("%s.replay_headers[%d]", prefix, i),
				Msg: fmt.Sprintf("%s is never replayed as stored: the gateway sets Content-Length and Dedup-Status itself, a replayed answer is not chunked, and hop-by-hop headers belong to one connection", http.CanonicalHeaderKey(h)),
			})
		}
	}
	return ws
}

// sharedNamespaceWarnings warns about each route that shares its key
// namespace with an earlier route whose deliveries are verified otherwise
// (see verificationOf): a sender the other route accepts can claim this
// route's keys first, and the genuine deliveries of those events are then
// answered as duplicates and never forwarded.
func (f *File) sharedNamespaceWarnings() []Problem {
	var ws []Problem
	first := make(map[string]int) // namespace → index of its first route
	for i, r := range f.Routes {
		ns := namespaceOf(r)
		j, seen := first[ns]
		if !seen {
			first[ns] = i
			continue
		}
		o := f.Routes[j]
		if verificationOf(r) == verificationOf(o) {
			continue
		}
		ws = append(ws, Problem{
			Key: fmt.Sprintf("routes[%d].namespace", i),
			Msg: fmt.Sprintf("routes %q and %q share the key namespace %q but verify their deliveries differently (%s and %s): a sender one of them accepts can claim the other's event keys first, and the other's genuine deliveries of those events are then answered as duplicates and never forwarded; give each route its own namespace", o.Name, r.Name, ns, verificationOf(o), verificationOf(r)),
		})
	}
	return ws
}

// reachWarnings warns about each route that forwards some of its gateway
// paths (an exact route's one, a prefix route's below it) to upstream
// paths where a route verifying its deliveries otherwise (see
// verificationOf) has its handler, on the same upstream server. "/public/*" with strip_path to http://app:3000 forwards
// /public/stripe to the app's /stripe, where the signed stripe route's
// deliveries arrive, with no signature check; so does "/x/*" to
// http://app:3000 beside a signed "/webhooks/stripe" to http://app:3000/x.
// Two routes that map gateway paths to upstream paths alike are safe: the
// gateway path that would reach the other's handler is the other's own,
// which the router gives to it (and the case or trailing-slash variants of
// which it refuses).
func (f *File) reachWarnings() []Problem {
	var ws []Problem
	maps := make([]pathMap, len(f.Routes))
	for i, r := range f.Routes {
		maps[i] = pathMapOf(r)
	}
	for i, a := range f.Routes {
		ma := maps[i]
		for j, b := range f.Routes {
			mb := maps[j]
			if i == j || len(b.Secrets) == 0 || verificationOf(a) == verificationOf(b) || ma.server != mb.server {
				continue
			}
			// from, a's gateway path(s), reach to, upstream paths of b's:
			// b's own, reached by another gateway path than b's, or part
			// of b's prefix, mapped otherwise than b maps it.
			var from, to string
			switch {
			case (mb.up == ma.up || ma.prefix && strings.HasPrefix(mb.up, ma.up)) && ma.gw+mb.up[len(ma.up):] != mb.gw:
				from, to = strings.TrimSuffix(ma.gw+mb.up[len(ma.up):], "/"), ma.origin+strings.TrimSuffix(mb.up, "/")
			case mb.prefix && strings.HasPrefix(ma.up, mb.up) && mb.gw+ma.up[len(mb.up):] != ma.gw:
				from, to = strings.TrimSuffix(ma.gw, "/"), ma.origin+strings.TrimSuffix(ma.up, "/")
				if ma.prefix {
					from, to = "every path below "+ma.gw, "paths below "+ma.origin+ma.up
				}
			default:
				continue
			}
			key := fmt.Sprintf("routes[%d].upstream", i)
			if a.StripPath {
				key = fmt.Sprintf("routes[%d].strip_path", i)
			}
			ws = append(ws, Problem{
				Key: key,
				Msg: fmt.Sprintf("route %q (%s) forwards %s to %s, where route %q's deliveries (%s) arrive: a sender can reach that handler through %q without its signature; map both routes' paths onto the upstream alike (the same upstream base path, both with or both without strip_path), or give %q an upstream path of its own", a.Name, verificationOf(a), from, to, b.Name, verificationOf(b), a.Name, a.Name),
			})
		}
	}
	return ws
}

// pathMap is how a route maps gateway paths onto its upstream, for
// reachWarnings. Paths are in lower case (upstreams may read them without
// regard to case) and end in "/".
type pathMap struct {
	server string // the host and port dialled (see upstreamServer)
	origin string // scheme://host as written, in lower case, for messages
	gw     string // the gateway path: a prefix route's prefix, an exact route's path
	// up is the upstream path its deliveries arrive at (under, for a
	// prefix route): the upstream URL's path joined with gw, or with
	// strip_path the upstream URL's path alone.
	up     string
	prefix bool
}

func pathMapOf(r Route) pathMap {
	m := pathMap{
		server: upstreamServer(r),
		origin: strings.ToLower(r.Upstream),
		gw:     strings.ToLower(strings.TrimSuffix(strings.TrimSuffix(r.Path, "*"), "/") + "/"),
		up:     "/",
		prefix: strings.HasSuffix(r.Path, "/*"),
	}
	u, err := url.Parse(r.Upstream)
	if err != nil { // refused by Validate
		return m
	}
	p := u.Path
	if !r.StripPath {
		p = strings.TrimSuffix(p, "/") + "/" + strings.TrimPrefix(strings.TrimSuffix(r.Path, "*"), "/")
	}
	m.origin = strings.ToLower(u.Scheme + "://" + u.Host)
	m.up = strings.ToLower(strings.TrimSuffix(p, "/") + "/")
	return m
}

// upstreamServer returns the host and port r's upstream dials, alike for
// every way of writing one server: the host in lower case without a
// trailing dot, an IP address in its canonical form, any loopback address
// as localhost (the gateway's own machine), and the scheme's
// default port when none is written. The scheme is left out: one port
// serves one listener, whichever scheme the URL names.
func upstreamServer(r Route) string {
	u, err := url.Parse(r.Upstream)
	if err != nil { // refused by Validate
		return r.Upstream
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().String()
		// 0.0.0.0 and :: reach this host too: Linux connects to them
		// locally, as to a loopback address.
		if a.IsLoopback() || a.IsUnspecified() {
			host = "localhost"
		}
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	return net.JoinHostPort(host, port)
}

// verificationOf describes which senders r lets in, without its secrets:
// "no signature" whatever its provider, or that provider's signatures.
// Two routes of one provider with other secrets verify alike: a provider
// endpoint being moved has two routes with two secrets sharing one
// namespace, so that each event is processed once (keeping them apart
// would process each twice during the move).
func verificationOf(r Route) string {
	if len(r.Secrets) == 0 {
		return "no signature"
	}
	return providerOf(r) + " signatures"
}

// hasHashTag reports whether s holds a Redis Cluster hash tag: a "{"
// followed, not at once, by a "}". A key starting with s hashes only that.
func hasHashTag(s string) bool {
	_, after, ok := strings.Cut(s, "{")
	i := strings.IndexByte(after, '}')
	return ok && i > 0
}

// envWarnings returns the warnings about DEDUPGW_* variables set to "",
// overriding a different value in the file, or holding a "${" reference
// they do not expand.
// They hold for a file with problems too (an ignored variable may be the
// cause), so validate gives them either way.
func (f *File) envWarnings() []Problem {
	var ws []Problem
	for _, o := range f.emptyEnv {
		ws = append(ws, Problem{
			Key: strings.Join(o.path, "."),
			Msg: fmt.Sprintf("%s is set but empty (or blank), and ignored: the file's value (or the default) applies; unset it or give it a value", o.env),
		})
	}
	for _, o := range f.shadowedEnv {
		ws = append(ws, Problem{
			Key: strings.Join(o.path, "."),
			Msg: fmt.Sprintf("%s overrides the file's value, which differs: while it is set, editing this key in the file (and reloading) changes nothing", o.env),
		})
	}
	for _, o := range f.literalEnv {
		ws = append(ws, Problem{
			Key: strings.Join(o.path, "."),
			Msg: fmt.Sprintf("%s holds \"${\", which is not expanded in DEDUPGW_* variables: its value is used as written; put a ${VAR} or ${file:PATH} reference in the config file instead", o.env),
		})
	}
	return ws
}

// unsetWarnings warns about each value of a valid file that a ${VAR} the
// environment did not set left empty in part or whole, as docker compose
// does: a path of "/hooks/${ROUTE}" would serve "/hooks/". A variable set
// to "" is taken as meant, and not warned about; nor are the blocks of the
// stores not in use (a redis: block kept beside backend: bolt).
//
// A value built from a ${file:PATH} whose file is empty is warned about
// alike.
func (f *File) unsetWarnings() []Problem {
	var ws []Problem
	keys := slices.Sorted(maps.Keys(f.unset))
	for k := range f.emptyFiles {
		if _, ok := f.unset[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, key := range keys {
		if block, ok := strings.CutPrefix(strings.ToLower(key), "store."); ok && !strings.HasPrefix(block, "backend") && !strings.HasPrefix(block, f.Store.Backend+".") {
			continue
		}
		if vars := f.unset[key]; len(vars) > 0 {
			verb := "is"
			if len(vars) > 1 {
				verb = "are"
			}
			ws = append(ws, Problem{Key: key, Msg: fmt.Sprintf("built from ${%s}, which %s not set, so empty there; set it (to \"\" if empty is meant)", strings.Join(vars, "}, ${"), verb)})
		}
		if files := f.emptyFiles[key]; len(files) > 0 {
			verb := "is"
			if len(files) > 1 {
				verb = "are"
			}
			ws = append(ws, Problem{Key: key, Msg: fmt.Sprintf("built from the file %s, which %s empty, so empty there; write the value into it (or drop the ${file:…} reference if empty is meant)", strings.Join(files, ", "), verb)})
		}
	}
	return ws
}

// origin says where a route's value came from when it was not its own:
// " (from defaults)" or " (the default)"; "" when the route set it.
func origin(route, defaults *time.Duration) string {
	switch {
	case route != nil:
		return ""
	case defaults != nil:
		return " (from defaults)"
	default:
		return " (the default)"
	}
}

// unguarded reports whether a would serve the keys API, forget included, on
// a non-loopback address without a token and without admin.insecure.
func (a Admin) unguarded() bool {
	return a.Token == "" && !a.Insecure && !isLoopback(a.Listen)
}

// schemeless reports whether upstream is host:port[/path] without a scheme
// ("127.0.0.1:3000", "app:8080/hooks"): a value without '@', query or
// fragment, so without the parts proxy.RedactURL hides, which the error
// can therefore show with its fix. "http:8080" is a mistyped scheme, not a
// host named http.
func schemeless(upstream string) bool {
	if strings.Contains(upstream, "://") || strings.ContainsAny(upstream, "@?# ") {
		return false
	}
	hostPort, _, _ := strings.Cut(upstream, "/")
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil || host == "" || port == "" || strings.EqualFold(host, "http") || strings.EqualFold(host, "https") {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}
