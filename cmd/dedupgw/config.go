package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"maps"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"

	"github.com/spf13/viper"
	yaml "go.yaml.in/yaml/v3"

	"github.com/dedupgw/dedupgw/providers"
	"github.com/dedupgw/dedupgw/proxy"
)

// File is the configuration file, as plain data. Load fills it from YAML,
// expands ${VAR} and ${file:PATH} references and applies DEDUPGW_*
// overrides; Validate checks
// it; GatewayConfig turns it into the proxy's configuration with every
// default applied. The `config` tags are the YAML keys.
type File struct {
	// Listen is the gateway's address. Empty means ":8080".
	Listen string `config:"listen"`
	// Admin configures the admin listener.
	Admin Admin `config:"admin"`
	// Log configures the logger.
	Log Log `config:"log"`
	// Server sets the HTTP server timeouts. Unset keys mean the built-in
	// values (see Server).
	Server Server `config:"server"`
	// Store selects and configures the dedup backend.
	Store Store `config:"store"`
	// Defaults are inherited by every route; nil fields mean the built-in
	// defaults (see builtinPolicy).
	Defaults Policy `config:"defaults"`
	// Routes are the webhook endpoints. At least one is required.
	Routes []Route `config:"routes"`

	// unset maps a value's key path to the environment variables its ${VAR}
	// references named but the environment did not set, so Validate can say
	// why a value is empty.
	unset map[string][]string
	// emptyFiles maps a value's key path to the files its ${file:PATH}
	// references read as empty, as unset does for variables.
	emptyFiles map[string][]string
	// fileErrs maps a value's key path to why the files its ${file:PATH}
	// references named could not be read: its problems, in place of any
	// other problem with the value.
	fileErrs map[string][]string
	// fileContents maps a value's key path to what its ${file:PATH} and
	// ${VAR} references read, so that no problem shows it (see
	// hideFileContents): such files and variables hold secrets.
	fileContents map[string][]hiddenText
	// files holds the state of every file a ${file:PATH} reference named,
	// by absolute path (see referencedFiles).
	files map[string]fileState
	// source is the configuration file's own absolute path, and the state
	// of the text this load read from it (see watchedFiles).
	source     string
	sourceRead fileState
	// fromEnv maps a key path a DEDUPGW_* variable set to that variable, so
	// a problem with its value names where the value came from.
	fromEnv map[string]string
	// emptyEnv are the DEDUPGW_* variables set to "", ignored.
	emptyEnv []envOverride
	// shadowedEnv are the DEDUPGW_* variables that override a value the
	// file sets otherwise: an edit of that key in the file changes nothing.
	shadowedEnv []envOverride
	// literalEnv are the DEDUPGW_* variables whose value holds "${", which
	// is not expanded there: DEDUPGW_ADMIN_TOKEN=${file:/run/token} would
	// be that text, a token nobody knows.
	literalEnv []envOverride
	// undecoded holds the keys whose values Load reported and left unset,
	// so Validate does not judge a default that stands in for them.
	undecoded map[string]bool
}

// fromEnvNote appends, to every problem of ps whose key (or a list item of
// it) a DEDUPGW_* variable set, the variable's name: in Kubernetes the value
// is in a Secret or the pod spec, not in the file the key points to.
func (f *File) fromEnvNote(ps Problems) {
	for i, p := range ps {
		key, _, _ := strings.Cut(p.Key, "[")
		if name, ok := f.fromEnv[key]; ok {
			ps[i].Msg += " (set by " + name + ")"
		}
	}
}

// Admin configures the admin listener (/healthz, /readyz, /metrics, /v1/keys).
type Admin struct {
	// Listen is the admin address. Empty means "127.0.0.1:9090".
	Listen string `config:"listen"`
	// Token, when set, is required as "Authorization: Bearer <token>" on /v1/*.
	Token secret `config:"token"`
	// Insecure allows a non-loopback Listen without a Token.
	Insecure bool `config:"insecure"`
}

// Log configures the logger.
type Log struct {
	// Level is debug, info, warn or error. Empty means info.
	Level string `config:"level"`
	// Format is json or console. Empty means json.
	Format string `config:"format"`
}

// Server sets the timeouts of the gateway's HTTP listener (read_header_timeout
// and idle_timeout also apply to the admin listener). A nil field is not set;
// a set one must be greater than 0. They are fixed at start-up: a reload
// that changes them takes effect at the next restart.
type Server struct {
	// ReadHeaderTimeout bounds reading a request's headers (slowloris).
	// Nil means 10s.
	ReadHeaderTimeout *time.Duration `config:"read_header_timeout"`
	// ReadTimeout bounds reading a whole request, headers and body; the
	// gateway also uses it as each delivery's body read deadline (a slow
	// body is answered 408). Nil means the largest max_body_bytes of any
	// route uploaded at 64 KiB/s after the header timeout, at least 30s
	// (30s for the default 1 MiB). It must not be shorter than
	// ReadHeaderTimeout.
	ReadTimeout *time.Duration `config:"read_timeout"`
	// IdleTimeout bounds how long an idle keep-alive connection stays open.
	// Nil means 120s.
	IdleTimeout *time.Duration `config:"idle_timeout"`
	// TrustedProxies are the peers (CIDR prefixes or single addresses)
	// whose X-Forwarded-Proto and X-Forwarded-Host reach the upstream.
	// Empty means proxy.DefaultTrustedProxies (loopback, private and shared
	// address space).
	TrustedProxies []string `config:"trusted_proxies"`
}

// trustedProxies returns TrustedProxies parsed, nil when it is empty, and
// the index of the first entry that is neither a prefix nor an address.
func (s Server) trustedProxies() ([]netip.Prefix, int, error) {
	if len(s.TrustedProxies) == 0 {
		return nil, 0, nil
	}
	out := make([]netip.Prefix, 0, len(s.TrustedProxies))
	for i, v := range s.TrustedProxies {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				return nil, i, err
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, 0, nil
}

// Store selects the dedup backend.
type Store struct {
	// Backend is bolt, redis or memory. Empty means bolt.
	Backend string `config:"backend"`
	// Bolt configures backend bolt.
	Bolt Bolt `config:"bolt"`
	// Redis configures backend redis.
	Redis Redis `config:"redis"`
}

// Bolt configures the embedded bbolt backend.
type Bolt struct {
	// Path is the database file. Empty means "dedupgw.db".
	Path string `config:"path"`
}

// Redis configures the Redis backend. Zero timeouts and pool size mean the
// backend's defaults (dial 2s, read and write 1s, 10 connections per CPU); a
// negative read or write timeout means none.
type Redis struct {
	// Addrs: one is a single node, several a Cluster, and with MasterName the
	// Sentinel addresses. Empty means ["127.0.0.1:6379"].
	Addrs []string `config:"addrs"`
	// Cluster makes even one address a Cluster seed (a managed service's
	// configuration endpoint). False means Cluster only with several addrs.
	Cluster bool `config:"cluster"`
	// MasterName selects Sentinel. Empty means single node or Cluster.
	MasterName string `config:"master_name"`
	// Username (Redis 6 ACL) and Password authenticate. Empty means none.
	Username string `config:"username"`
	Password secret `config:"password"`
	// SentinelUsername and SentinelPassword authenticate to the sentinels
	// (master_name set). Empty means none.
	SentinelUsername string `config:"sentinel_username"`
	SentinelPassword secret `config:"sentinel_password"`
	// DB is the logical database (single node or Sentinel). Zero means 0.
	DB int `config:"db"`
	// TLS connects with TLS 1.2+ and the system roots. False means plain TCP.
	TLS bool `config:"tls"`
	// KeyPrefix is prepended to every key. Empty means "dedupgw:".
	KeyPrefix string `config:"key_prefix"`
	// DialTimeout, ReadTimeout and WriteTimeout bound connecting and one
	// command's socket I/O. Zero means the backend's default.
	DialTimeout  time.Duration `config:"dial_timeout"`
	ReadTimeout  time.Duration `config:"read_timeout"`
	WriteTimeout time.Duration `config:"write_timeout"`
	// PoolSize is the number of connections per node. Zero means the
	// backend's default.
	PoolSize int `config:"pool_size"`
	// WaitReplicas, when positive, makes each claim and commit wait until
	// that many replicas acknowledged it (Redis WAIT), at most WaitTimeout.
	// Zero means no waiting. Single node or Sentinel only.
	WaitReplicas int `config:"wait_replicas"`
	// WaitTimeout bounds that wait. Zero means the backend's default
	// (100ms).
	WaitTimeout time.Duration `config:"wait_timeout"`
}

// cluster reports whether r describes a Redis Cluster: several addresses,
// or cluster: true, and no master_name (redisstore picks its client the
// same way).
func (r Redis) cluster() bool { return (len(r.Addrs) > 1 || r.Cluster) && r.MasterName == "" }

// Policy holds the keys that the defaults: block sets for every route and a
// route may override. A nil field is not set at this level.
type Policy struct {
	// Window is how long a processed key is remembered (default 24h).
	Window *time.Duration `config:"window"`
	// FailedRetention is how long a failed key's record is kept (default:
	// the window).
	FailedRetention *time.Duration `config:"failed_retention"`
	// Lease is how long an in-flight claim holds its key (default 60s); it
	// must be longer than UpstreamTimeout.
	Lease *time.Duration `config:"lease"`
	// UpstreamTimeout bounds one forward (default 30s).
	UpstreamTimeout *time.Duration `config:"upstream_timeout"`
	// MaxBodyBytes bounds a delivery's body; larger ones get 413 (default 1 MiB).
	MaxBodyBytes *int64 `config:"max_body_bytes"`
	// OnMissingKey is forward (default) or reject.
	OnMissingKey *string `config:"on_missing_key"`
	// OnStoreError is forward (default, fail open) or reject.
	OnStoreError *string `config:"on_store_error"`
	// OnInFlight is reject (default) or wait.
	OnInFlight *string `config:"on_in_flight"`
	// DuplicateResponse is ack (default) or replay.
	DuplicateResponse *string `config:"duplicate_response"`
	// OnFingerprintMismatch is ack (default) or reject.
	OnFingerprintMismatch *string `config:"on_fingerprint_mismatch"`
	// MaxReplayBytes bounds a stored response body (default 65536).
	MaxReplayBytes *int64 `config:"max_replay_bytes"`
	// ReplayHeaders are the response headers stored for replay (default
	// [Content-Type]). Nil when not set; an empty list stores none.
	ReplayHeaders []string `config:"replay_headers"`
}

// Route is one routes: entry.
type Route struct {
	// Name is unique among routes: metric label, keys API name, default
	// namespace. Required.
	Name string `config:"name"`
	// Path is an exact path or a prefix ending in "/*". Required.
	Path string `config:"path"`
	// Upstream is the application's base URL; the request path is appended
	// (without the route's own with StripPath). Required.
	Upstream string `config:"upstream"`
	// Namespace scopes keys. Empty means Name.
	Namespace string `config:"namespace"`
	// Provider is one of the providers package's names. Empty means generic.
	Provider string `config:"provider"`
	// Keys overrides the provider preset's key sources.
	Keys []string `config:"keys"`
	// Secrets enable signature verification; several allow rotation.
	Secrets secretList `config:"secrets"`
	// Tolerance is the signature timestamp tolerance; nil means 300s.
	Tolerance *time.Duration `config:"tolerance"`
	// Methods accepted. Empty means POST.
	Methods []string `config:"methods"`
	// OnOtherMethod is what a request of another method gets: reject
	// (the default, "": 405) or forward (passed through, not deduplicated;
	// see proxy.Route.OnOtherMethod). A route's own key, not a default.
	OnOtherMethod string `config:"on_other_method"`
	// PreserveHost sends the sender's Host to the upstream instead of the
	// upstream URL's host (see proxy.Route.PreserveHost).
	PreserveHost bool `config:"preserve_host"`
	// StripPath removes the route's path from the request's before it is
	// appended to the upstream URL's (see proxy.Route.StripPath).
	StripPath bool `config:"strip_path"`
	// Signature configures the generic provider's HMAC check.
	Signature Signature `config:"signature"`
	// FingerprintExclude lists top-level JSON fields left out of the
	// fingerprint (API idempotency).
	FingerprintExclude []string `config:"fingerprint_exclude"`
	// ClientIdentity names a header whose hash scopes keys per client.
	ClientIdentity string `config:"client_identity"`
	// ClientIdentitySecret, when set, keys that hash (HMAC-SHA256), so a
	// stored key says nothing about the credential. It needs
	// ClientIdentity and at least proxy.MinClientIdentitySecret bytes; set
	// but empty (a ${VAR} left unset, or the key written without a value)
	// is an error, not the plain hash. Nil (the key left out) means the
	// plain SHA-256.
	ClientIdentitySecret *secret `config:"client_identity_secret"`
	// Policy overrides the defaults: block for this route.
	Policy `config:",squash"`
}

// providerOf is r's provider name, generic when unset.
func providerOf(r Route) string {
	if r.Provider == "" {
		return providers.Generic
	}
	return r.Provider
}

// verifiesWithPublicKeys reports whether r's secrets are public
// verification keys: a generic route whose signature.algorithm is
// ecdsa-sha256.
func verifiesWithPublicKeys(r Route) bool {
	return providerOf(r) == providers.Generic && providers.GenericSignature(r.Signature).PublicKeys()
}

// namespaceOf is r's key scope: its namespace, else its name.
func namespaceOf(r Route) string {
	if r.Namespace != "" {
		return r.Namespace
	}
	return r.Name
}

// identitySecretOf is r's client_identity_secret, "" when unset.
func identitySecretOf(r Route) string {
	if r.ClientIdentitySecret == nil {
		return ""
	}
	return string(*r.ClientIdentitySecret)
}

// toleranceOf is r's signed-timestamp tolerance: its tolerance, else the
// default.
func toleranceOf(r Route) time.Duration {
	if r.Tolerance != nil {
		return *r.Tolerance
	}
	return defaultTolerance
}

// Signature is the generic provider's signature scheme; see
// providers.GenericSignature for what empty fields mean.
type Signature struct {
	Header          string `config:"header"`
	Algorithm       string `config:"algorithm"`
	Encoding        string `config:"encoding"`
	Prefix          string `config:"prefix"`
	TimestampHeader string `config:"timestamp_header"`
	Template        string `config:"template"`
	SignatureField  string `config:"signature_field"`
	TimestampField  string `config:"timestamp_field"`
	Separator       string `config:"separator"`
	TimestampFormat string `config:"timestamp_format"`
}

// Built-in values used where neither the file nor the environment sets one.
const (
	defaultListen      = ":8080"
	defaultAdminListen = "127.0.0.1:9090"
	defaultLogLevel    = "info"
	defaultLogFormat   = "json"
	defaultBackend     = "bolt"
	defaultBoltPath    = "dedupgw.db"
	defaultRedisAddr   = "127.0.0.1:6379"
	defaultKeyPrefix   = "dedupgw:"
	defaultTolerance   = providers.DefaultTolerance
)

// builtinPolicy returns the defaults that apply when neither the route nor
// the defaults: block sets a key.
func builtinPolicy() Policy {
	return Policy{
		Window:                ptr(24 * time.Hour),
		Lease:                 ptr(60 * time.Second),
		UpstreamTimeout:       ptr(30 * time.Second),
		MaxBodyBytes:          ptr[int64](1 << 20),
		OnMissingKey:          ptr(proxy.Forward),
		OnStoreError:          ptr(proxy.Forward),
		OnInFlight:            ptr(proxy.Reject),
		DuplicateResponse:     ptr(proxy.Ack),
		OnFingerprintMismatch: ptr(proxy.Ack),
		MaxReplayBytes:        ptr[int64](64 << 10),
		ReplayHeaders:         []string{"Content-Type"},
	}
}

func ptr[T any](v T) *T { return &v }

// failedRetention is p's failed_retention, zero (the window) when unset.
func failedRetention(p Policy) time.Duration {
	if p.FailedRetention == nil {
		return 0
	}
	return *p.FailedRetention
}

// over returns p with every field that o sets taken from o.
func (p Policy) over(o Policy) Policy {
	pick := func(dst, src reflect.Value) {
		for i := range dst.NumField() {
			if !src.Field(i).IsNil() {
				dst.Field(i).Set(src.Field(i))
			}
		}
	}
	pick(reflect.ValueOf(&p).Elem(), reflect.ValueOf(o))
	return p
}

// effective returns route i's policy with the file defaults and the built-in
// defaults applied. Every field is set.
func (f *File) effective(i int) Policy {
	return builtinPolicy().over(f.Defaults).over(f.Routes[i].Policy)
}

// Problem is one thing wrong with a configuration, named by its key path
// ("routes[1].lease").
type Problem struct {
	Key string
	Msg string
}

func (p Problem) String() string { return p.Key + ": " + p.Msg }

// Problems lists everything wrong with a configuration. It is the error type
// of Load and Validate; the validate command prints one per line.
type Problems []Problem

func (ps Problems) Error() string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return "invalid config: " + strings.Join(s, "; ")
}

func (ps *Problems) add(key, format string, args ...any) {
	*ps = append(*ps, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
}

// errOrNil returns ps as an error, or nil when it is empty.
func (ps Problems) errOrNil() error {
	if len(ps) == 0 {
		return nil
	}
	return ps
}

// sourceError is Load's error for a configuration file it could not read
// or parse, with what it read of the file (as watchedFiles gives it), so
// that serve's watch takes that content as tried: a SIGHUP's reload of a
// half-edited file is one rejected reload, not one more at the watch's
// next read.
type sourceError struct {
	err    error
	source string // the file's absolute path, "" when unknown
	read   fileState
}

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// newSourceError returns err with the state read of the configuration
// file at path.
func newSourceError(path string, read fileState, err error) error {
	abs, aerr := filepath.Abs(path)
	if aerr != nil {
		abs = ""
	}
	return &sourceError{err: err, source: abs, read: read}
}

// readConfig reads the configuration file at path whole, and reports
// whether it is a regular file: serve follows only those (watchedFiles). A
// pipe (a FIFO, /dev/stdin, a shell's <(…)) is read as well, but read
// again it blocks or reads empty.
func readConfig(path string) (text []byte, regular bool, err error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, false, err
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return nil, false, err
	}
	text, err = io.ReadAll(fh)
	if err != nil {
		return nil, false, err
	}
	return text, fi.Mode().IsRegular(), nil
}

// EnvPrefix starts the names of the environment variables that override
// scalar keys: store.redis.addrs is DEDUPGW_STORE_REDIS_ADDRS.
const EnvPrefix = "DEDUPGW_"

// Load reads the YAML configuration file at path. String values are expanded
// after parsing, one value at a time, so "${VAR}" is replaced by the variable's
// value from env (unset means empty), and "${file:PATH}" by the content of
// the file at PATH (relative to path's directory; see readFileRef), and
// neither can add YAML structure. A file that cannot be read is a problem
// named by the key that references it. Then
// every scalar key outside routes: can be overridden by its DEDUPGW_* variable
// (list keys take a comma-separated list). Unknown keys and values of the
// wrong type are reported as Problems naming the key; the returned File is then
// still usable for Validate, with the faulty values left unset. Any other
// error (unreadable file, YAML syntax) returns a nil File. env nil means no
// environment.
func Load(path string, env func(string) (string, bool)) (*File, error) {
	if env == nil {
		env = func(string) (string, bool) { return "", false }
	}
	text, regular, err := readConfig(path)
	if err != nil {
		return nil, newSourceError(path, stateOf(nil, bare(err)), fmt.Errorf("read config %s: %w", path, err))
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(text, &doc); err != nil {
		return nil, newSourceError(path, stateOf(text, nil), fmt.Errorf("read config %s: %w", path, syntaxError(text, err)))
	}
	v := viper.NewWithOptions(viper.KeyDelimiter("\x00")) // "a.b: x" is a key of its own, not a: {b: x}
	v.SetConfigType("yaml")
	if err := v.ReadConfig(bytes.NewReader(text)); err != nil {
		return nil, newSourceError(path, stateOf(text, nil), fmt.Errorf("read config %s: %w", path, err))
	}
	raw := v.AllSettings()

	f := &File{
		unset: map[string][]string{}, emptyFiles: map[string][]string{}, fileErrs: map[string][]string{},
		fileContents: map[string][]hiddenText{}, files: map[string]fileState{},
		fromEnv: map[string]string{}, undecoded: map[string]bool{},
	}
	if abs, err := filepath.Abs(path); err == nil && regular {
		f.source, f.sourceRead = abs, stateOf(text, nil)
	}
	var ps Problems
	// viper matches keys case-insensitively: two spellings of one key in a
	// mapping would silently merge, one value winning. Name them instead.
	caseCollisions(&doc, "", &ps)
	x := &expander{env: env, dir: filepath.Dir(path), files: f.files}
	for key, val := range raw {
		raw[key] = x.expandValue(val, key, f)
	}
	for _, o := range envOverrides() {
		s, ok := env(o.env)
		if !ok {
			continue
		}
		if strings.TrimSpace(s) == "" {
			// Set but empty (or blank), as DEDUPGW_ADMIN_TOKEN=${TOKEN}
			// with TOKEN unset gives: overriding with it would silently
			// drop the file's token, or widen listen to the default.
			// Ignore it and say so (Warnings).
			f.emptyEnv = append(f.emptyEnv, o)
			continue
		}
		if strings.Contains(s, "${") {
			f.literalEnv = append(f.literalEnv, o)
		}
		var val any = s
		if o.list {
			val = splitList(s)
		}
		if was, ok := getPath(raw, o.path); ok && fmt.Sprint(was) != fmt.Sprint(val) {
			f.shadowedEnv = append(f.shadowedEnv, o)
		}
		setPath(raw, o.path, val)
		key := strings.Join(o.path, ".")
		f.fromEnv[key] = o.env
		// The file's value, and any ${VAR} or ${file:PATH} it was built
		// from, is gone: an unset or unreadable one must not be warned
		// about or named in a problem.
		for _, m := range []map[string][]string{f.unset, f.emptyFiles, f.fileErrs} {
			for k := range m {
				if keyWithin(k, key) {
					delete(m, k)
				}
			}
		}
		for k := range f.fileContents {
			if keyWithin(k, key) {
				delete(f.fileContents, k)
			}
		}
	}

	decode(raw, reflect.ValueOf(f).Elem(), "", &ps)
	// A value whose file could not be read is reported as that, and only
	// that: what is left of it (empty, say) does not decode either.
	ps = f.hideFileContents(f.dropFileErrKeys(ps))
	for _, key := range slices.Sorted(maps.Keys(f.fileErrs)) {
		for _, msg := range f.fileErrs[key] {
			ps.add(key, "%s", msg)
		}
	}
	for _, p := range ps {
		f.undecoded[p.Key] = true
	}
	// A value that does not decode (a duration, a number) because a ${VAR}
	// in it was unset is explained by naming the variable.
	for i, p := range ps {
		ps[i].Msg += f.unsetNote(p.Key)
	}
	f.fromEnvNote(ps)
	f.applyDefaults()
	return f, ps.errOrNil()
}

// maxSyntaxScanLines and maxSyntaxScanBytes bound the files syntaxError
// searches (lines as lineBreak counts them): it parses up to one prefix per
// line, from the line yaml.v3 names on. maxSyntaxScanParsed bounds the
// bytes of all those prefixes together, which grow with the square of the
// lines searched (up to 32 MiB within the other two bounds: seconds of
// parsing, on every reload (SIGHUP) too). A search that would parse more
// gives up, as for a file past the other two bounds. 4 MiB is four times
// what a mistake on config.example.yaml's last line takes (1 MB, from
// routes:).
const (
	maxSyntaxScanLines  = 1000
	maxSyntaxScanBytes  = 64 << 10
	maxSyntaxScanParsed = 4 << 20
)

// syntaxError returns err, the YAML syntax error of text, naming the line of
// the mistake. yaml.v3 names the line where the enclosing block or flow
// collection starts (or the one before): a mis-indented key deep in a route
// is blamed on "routes:". The mistake is on the last line of the shortest
// prefix of text that fails with exactly err's message, and not above the
// line yaml.v3 names. Lines end at the line breaks yaml.v3 counts
// (lineBreak), so the line returned is numbered as yaml.v3 numbers lines.
// When no prefix does (the message depends on what follows), for an
// unexpected end of the file (an unclosed quote or bracket: a prefix ending
// inside a valid one fails the same way), or when the file is too large to
// search (maxSyntaxScanLines, maxSyntaxScanBytes, maxSyntaxScanParsed), err
// is returned as it is. A UTF-16 text is searched in UTF-8, as yaml.v3
// reads it.
func syntaxError(text []byte, err error) error {
	msg, _ := strings.CutPrefix(err.Error(), "yaml: ")
	named := 1
	if after, ok := strings.CutPrefix(msg, "line "); ok {
		if n, m, ok := strings.Cut(after, ": "); ok {
			named, _ = strconv.Atoi(n)
			msg = m
		}
	}
	if msg == "found unexpected end of stream" || len(text) > maxSyntaxScanBytes {
		return err
	}
	text = utf8Text(text)
	var ends []int // text[:ends[n-1]] holds lines 1..n
	for i := 0; i < len(text); {
		if w := lineBreak(text[i:]); w > 0 {
			i += w
			ends = append(ends, i)
		} else {
			i++
		}
	}
	if len(ends) >= maxSyntaxScanLines {
		return err
	}
	if len(ends) == 0 || ends[len(ends)-1] < len(text) {
		ends = append(ends, len(text)) // the last line, with no line break
	}
	var doc yaml.Node
	parsed := 0 // bytes, in all prefixes parsed
	for i, end := range ends {
		if n := i + 1; n >= named-1 {
			if parsed += end; parsed > maxSyntaxScanParsed {
				return err
			}
			if perr := yaml.Unmarshal(text[:end], &doc); perr != nil && perr.Error() == err.Error() {
				return fmt.Errorf("yaml: line %d: %s", n, msg)
			}
		}
	}
	return err
}

// lineBreak returns the length of the line break text starts with, 0 if it
// starts with none. The line breaks are those yaml.v3 counts lines by (its
// scanner's is_break and is_crlf): LF, CR LF (one break), a CR not followed
// by LF, and NEL (U+0085), LS (U+2028) and PS (U+2029) in UTF-8.
func lineBreak(text []byte) int {
	switch {
	case bytes.HasPrefix(text, []byte("\r\n")), bytes.HasPrefix(text, []byte("\u0085")):
		return 2
	case bytes.HasPrefix(text, []byte("\n")), bytes.HasPrefix(text, []byte("\r")):
		return 1
	case bytes.HasPrefix(text, []byte("\u2028")), bytes.HasPrefix(text, []byte("\u2029")):
		return 3
	}
	return 0
}

// utf8Text returns text in UTF-8: a text that starts with a UTF-16 byte
// order mark (FF FE or FE FF) decoded, as yaml.v3 decodes it before it
// scans and numbers the lines, and any other text as it is.
func utf8Text(text []byte) []byte {
	var order binary.ByteOrder
	switch {
	case bytes.HasPrefix(text, []byte{0xff, 0xfe}):
		order = binary.LittleEndian
	case bytes.HasPrefix(text, []byte{0xfe, 0xff}):
		order = binary.BigEndian
	default:
		return text
	}
	units := make([]uint16, len(text)/2)
	for i := range units {
		units[i] = order.Uint16(text[2*i:])
	}
	return []byte(string(utf16.Decode(units))) // the mark becomes UTF-8's, which yaml.v3 skips too
}

// applyDefaults fills the empty top-level keys with their built-in values.
// Route-level defaults are applied by GatewayConfig.
func (f *File) applyDefaults() {
	set := func(s *string, def string) {
		if *s == "" {
			*s = def
		}
	}
	// A token from a Secret or a file written with echo ends in a newline,
	// which no Authorization header can carry: every /v1/* call would be
	// refused. The white space around it is no part of the token.
	f.Admin.Token = secret(strings.TrimSpace(string(f.Admin.Token)))
	set(&f.Listen, defaultListen)
	set(&f.Admin.Listen, defaultAdminListen)
	set(&f.Log.Level, defaultLogLevel)
	set(&f.Log.Format, defaultLogFormat)
	set(&f.Store.Backend, defaultBackend)
	set(&f.Store.Bolt.Path, defaultBoltPath)
	set(&f.Store.Redis.KeyPrefix, defaultKeyPrefix)
	if f.Store.Redis.Addrs == nil { // absent; an explicit empty list is an error
		f.Store.Redis.Addrs = []string{defaultRedisAddr}
	}
}

// GatewayConfig returns the proxy configuration: every route with the
// defaults: block and the built-in defaults applied, so no field is left to
// the proxy's own zero-value defaults. Call it on a File that passed Validate.
func (f *File) GatewayConfig() proxy.Config {
	cfg := proxy.Config{Routes: make([]proxy.Route, 0, len(f.Routes))}
	for i, r := range f.Routes {
		p := f.effective(i)
		methods := r.Methods
		if len(methods) == 0 {
			methods = []string{"POST"}
		}
		cfg.Routes = append(cfg.Routes, proxy.Route{
			Name:                  r.Name,
			Path:                  r.Path,
			Upstream:              r.Upstream,
			Namespace:             namespaceOf(r),
			Methods:               slices.Clone(methods),
			OnOtherMethod:         r.OnOtherMethod,
			PreserveHost:          r.PreserveHost,
			StripPath:             r.StripPath,
			Window:                *p.Window,
			FailedRetention:       failedRetention(p),
			Lease:                 *p.Lease,
			UpstreamTimeout:       *p.UpstreamTimeout,
			MaxBodyBytes:          *p.MaxBodyBytes,
			OnMissingKey:          *p.OnMissingKey,
			OnStoreError:          *p.OnStoreError,
			OnInFlight:            *p.OnInFlight,
			DuplicateResponse:     *p.DuplicateResponse,
			OnFingerprintMismatch: *p.OnFingerprintMismatch,
			FingerprintExclude:    slices.Clone(r.FingerprintExclude),
			MaxReplayBytes:        *p.MaxReplayBytes,
			ReplayHeaders:         append([]string{}, p.ReplayHeaders...),
			ClientIdentity:        r.ClientIdentity,
			ClientIdentitySecret:  identitySecretOf(r),
			Provider: providers.Config{
				Provider:  providerOf(r),
				Keys:      slices.Clone(r.Keys),
				Secrets:   slices.Clone(r.Secrets),
				Tolerance: toleranceOf(r),
				Signature: providers.GenericSignature(r.Signature),
			},
		})
	}
	return cfg
}

// maxUpstreamTimeout returns the longest effective upstream_timeout, which
// bounds how long a graceful shutdown waits for in-flight deliveries.
func (f *File) maxUpstreamTimeout() time.Duration {
	longest := *builtinPolicy().over(f.Defaults).UpstreamTimeout
	for i := range f.Routes {
		longest = max(longest, *f.effective(i).UpstreamTimeout)
	}
	return longest
}

// expandValue replaces the ${VAR} and ${file:PATH} references in every
// string inside val, by x. path is val's key path; what the references
// left empty, or could not read, is recorded in f by path.
func (x *expander) expandValue(val any, path string, f *File) any {
	switch v := val.(type) {
	case string:
		s, e := x.expand(v)
		if len(e.unset) > 0 {
			f.unset[path] = e.unset
		}
		if len(e.empty) > 0 {
			f.emptyFiles[path] = e.empty
		}
		if len(e.errs) > 0 {
			f.fileErrs[path] = e.errs
		}
		if len(e.contents) > 0 {
			f.fileContents[path] = e.contents
		}
		return s
	case map[string]any:
		for k, e := range v {
			v[k] = x.expandValue(e, path+"."+k, f)
		}
		return v
	case []any:
		for i, e := range v {
			v[i] = x.expandValue(e, fmt.Sprintf("%s[%d]", path, i), f)
		}
		return v
	}
	return val
}

// expansion is what expand found besides the value: the variables env did
// not set, the files that were empty (by the path they were read at), why
// each file that could not be read could not, and what the others, and
// the variables that were set, held.
type expansion struct {
	unset, empty, errs []string
	contents           []hiddenText
}

// hiddenText is what a ${file:PATH} or ${VAR} reference read, and what a
// problem shows in its place (see hideFileContents).
type hiddenText struct {
	text, shownAs string
}

// expand replaces each ${NAME} in s by env(NAME), an unset variable by the
// empty string, and each ${file:PATH} by the content of that file (see
// readFileRef), one that cannot be read by the empty string. A "$" not
// followed by "{NAME}" or "{file:PATH}" is kept as written, so secrets may
// contain "$". Values are not expanded again: a variable or a file holding
// "${X}" gives "${X}".
func (x *expander) expand(s string) (string, expansion) {
	var b strings.Builder
	var out expansion
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), out
		}
		j := strings.IndexByte(s[i:], '}')
		name := ""
		if j > 0 {
			name = s[i+2 : i+j]
		}
		if p, ok := strings.CutPrefix(name, fileRefPrefix); ok {
			b.WriteString(s[:i])
			val, read, err := x.readFileRef(p)
			switch {
			case err != nil:
				out.errs = append(out.errs, err.Error())
			case val == "":
				out.empty = append(out.empty, read)
			default:
				out.contents = append(out.contents, hiddenText{text: val, shownAs: fileContentNotShown})
			}
			b.WriteString(val)
			s = s[i+j+1:]
			continue
		}
		if !validEnvName(name) {
			b.WriteString(s[:i+2])
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		if val, ok := x.env(name); ok {
			b.WriteString(val)
			if val != "" {
				out.contents = append(out.contents, hiddenText{text: val, shownAs: "<${" + name + "}, not shown>"})
			}
		} else {
			out.unset = append(out.unset, name)
		}
		s = s[i+j+1:]
	}
}

func validEnvName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// envOverride is one DEDUPGW_* variable and the key it overrides.
type envOverride struct {
	env  string
	path []string
	list bool
}

// envOverrides lists the overridable keys, derived from File's scalar and
// string-list fields outside routes: so a new key gets its variable for free.
func envOverrides() []envOverride {
	var out []envOverride
	var walk func(t reflect.Type, path []string)
	walk = func(t reflect.Type, path []string) {
		for i := range t.NumField() {
			sf := t.Field(i)
			name, _, _ := strings.Cut(sf.Tag.Get("config"), ",")
			if !sf.IsExported() || name == "" {
				continue
			}
			p := append(slices.Clone(path), name)
			ft := sf.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case ft.Kind() == reflect.Struct && ft != durationType:
				walk(ft, p)
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.String:
				// routes: not a scalar key
			default:
				out = append(out, envOverride{
					env:  EnvPrefix + strings.ToUpper(strings.Join(p, "_")),
					path: p,
					list: ft.Kind() == reflect.Slice,
				})
			}
		}
	}
	walk(reflect.TypeFor[File](), nil)
	return out
}

// caseCollisions reports, for every mapping under n, keys that differ only
// in case (viper would merge them), and keys holding a NUL byte (viper's key
// delimiter here, see Load: it would read one as a path), naming each by
// its path as Problems do.
func caseCollisions(n *yaml.Node, path string, ps *Problems) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			caseCollisions(c, path, ps)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			caseCollisions(c, fmt.Sprintf("%s[%d]", path, i), ps)
		}
	case yaml.MappingNode:
		seen := map[string]*yaml.Node{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			key := k.Value
			if path != "" {
				key = path + "." + k.Value
			}
			if strings.ContainsRune(k.Value, 0) {
				ps.add(strings.ReplaceAll(key, "\x00", `\0`), "a key must not hold a NUL byte")
				continue
			}
			lower := strings.ToLower(k.Value)
			if first, ok := seen[lower]; ok {
				ps.add(key, "duplicate key (also %q at line %d; keys are not case-sensitive)", first.Value, first.Line)
			} else {
				seen[lower] = k
			}
			caseCollisions(val, strings.ToLower(key), ps)
		}
	}
}

// envAdminURL is the variable the keys commands take the admin API's URL
// from.
const envAdminURL = EnvPrefix + "ADMIN_URL"

// envNotConfig are the DEDUPGW_* variables that are not configuration
// overrides: the keys commands' admin URL, and the knobs that the benchmark
// runner, the test suites and the CI scripts read (TestEnvKnobsAreKnown
// finds them in the repository, so that a developer's shell with one set
// gets no "misspelt?" warning).
var envNotConfig = []string{
	envAdminURL,
	EnvPrefix + "BENCH_PPROF",
	EnvPrefix + "CHAOS", EnvPrefix + "CHAOS_KEEP", EnvPrefix + "CHAOS_RACE", EnvPrefix + "CHAOS_REPORT",
	EnvPrefix + "MEASURE_KEYS", EnvPrefix + "REQUIRE_REDIS",
	EnvPrefix + "SCALE", EnvPrefix + "SCALE_BATCH", EnvPrefix + "SCALE_DIR",
	EnvPrefix + "SKIP_DOCKER",
}

// UnknownEnv returns the DEDUPGW_* names in environ ("NAME=value" entries,
// as os.Environ gives them) that override no key and are none of
// envNotConfig, sorted: most likely a misspelt override, which would
// otherwise be ignored without a word.
func UnknownEnv(environ []string) []string {
	known := map[string]bool{}
	for _, o := range envOverrides() {
		known[o.env] = true
	}
	for _, name := range envNotConfig {
		known[name] = true
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) && !known[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// NearestEnv returns the DEDUPGW_* override closest to name, an unknown
// variable UnknownEnv returned, when it is close enough to be a
// misspelling (as nearestKey judges a key); else "".
func NearestEnv(name string) string {
	rest, ok := strings.CutPrefix(name, EnvPrefix)
	if !ok {
		return ""
	}
	known := map[string]reflect.Value{}
	for _, o := range envOverrides() {
		known[strings.TrimPrefix(o.env, EnvPrefix)] = reflect.Value{}
	}
	if near := nearestKey(rest, known); near != "" {
		return EnvPrefix + near
	}
	return ""
}

// unknownEnvHint is what the warning about the unknown variable name adds:
// the override it was likely meant to be, or a plain question.
func unknownEnvHint(name string) string {
	if near := NearestEnv(name); near != "" {
		return fmt.Sprintf("did you mean %s?", near)
	}
	return "misspelt?"
}

func splitList(s string) []any {
	var out []any
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// setPath sets raw[path[0]][path[1]]… = val, creating maps on the way and
// replacing a non-map value in the way.
// getPath returns the value at path in raw, if there is one.
func getPath(raw map[string]any, path []string) (any, bool) {
	for _, k := range path[:len(path)-1] {
		next, ok := raw[k].(map[string]any)
		if !ok {
			return nil, false
		}
		raw = next
	}
	v, ok := raw[path[len(path)-1]]
	return v, ok && v != nil
}

func setPath(raw map[string]any, path []string, val any) {
	for _, k := range path[:len(path)-1] {
		next, ok := raw[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			raw[k] = next
		}
		raw = next
	}
	raw[path[len(path)-1]] = val
}

var durationType = reflect.TypeFor[time.Duration]()

// secretList is a list of secrets. Unlike other lists, one string in its
// place is one secret, never split on commas: a GitHub or generic HMAC
// secret is chosen by its owner and may contain one, and every fragment of
// a split secret would be accepted as a key.
type secretList []string

var secretListType = reflect.TypeFor[secretList]()

// secret is a config string that holds a password or token. One YAML reads
// as a number or a boolean is refused rather than turned into text (0123
// would be 83 or 123, a different password), and a value of another type
// (a date, a mapping) is refused without being shown.
type secret string

var (
	secretType    = reflect.TypeFor[secret]()
	secretPtrType = reflect.TypeFor[*secret]()
)

// secretNotShown is the problem with a secret that YAML read as neither a
// string nor a number (2024-01-01 is a date): its value is not echoed.
const secretNotShown = "want a string; quote it (the value is not shown)"

// decode stores raw (as parsed from YAML) into v, reporting unknown keys and
// values of the wrong type by key path. A value that fails to decode leaves v
// unchanged.
func decode(raw any, v reflect.Value, path string, ps *Problems) {
	t := v.Type()
	if raw == nil {
		// An optional secret written without a value ("key:" or "key: ~",
		// as a template or envsubst leaves an unset variable) is set but
		// empty, which Validate refuses, not left out: left out, it would
		// silently turn off what it protects.
		if t == secretPtrType {
			v.Set(reflect.New(secretType))
		}
		return
	}
	switch {
	case t == durationType:
		d, err := toDuration(raw)
		if err != nil {
			ps.add(path, "%v", err)
			return
		}
		v.SetInt(int64(d))
	case t == secretType:
		decodeSecret(raw, v, path, ps)
	case t.Kind() == reflect.Pointer:
		e := reflect.New(t.Elem())
		n := len(*ps)
		decode(raw, e.Elem(), path, ps)
		if len(*ps) == n {
			v.Set(e)
		}
	case t.Kind() == reflect.Struct:
		m, ok := raw.(map[string]any)
		if !ok {
			ps.add(path, "want a mapping of keys, got %s", describe(raw))
			return
		}
		fields := fieldsOf(v)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			key := k
			if path != "" {
				key = path + "." + k
			}
			fv, ok := fields[strings.ToLower(k)]
			if !ok {
				if first, _, dotted := strings.Cut(k, "."); dotted && fields[strings.ToLower(first)].IsValid() {
					ps.add(key, "unknown key: a dotted name is not a path here; nest it under %q", first+":")
				} else if near := nearestKey(strings.ToLower(k), fields); near != "" {
					ps.add(key, "unknown key (did you mean %q?)", near)
				} else {
					ps.add(key, "unknown key")
				}
				continue
			}
			decode(m[k], fv, key, ps)
		}
	case t.Kind() == reflect.Slice:
		secrets := t == secretListType
		list, ok := raw.([]any)
		if !ok {
			if s, isStr := raw.(string); isStr && secrets {
				list = []any{s}
			} else if isStr && t.Elem().Kind() == reflect.String {
				list = splitList(s) // a comma list, as in the environment
			} else if secrets && numberOrBool(raw) {
				ps.add(path, "want a list of strings; %s", secretNotString)
				return
			} else if secrets {
				ps.add(path, "want a list of strings, each quoted (the value is not shown)")
				return
			} else {
				ps.add(path, "want a list, got %s", describe(raw))
				return
			}
		}
		out := reflect.MakeSlice(t, len(list), len(list))
		n := len(*ps)
		for i, e := range list {
			key := fmt.Sprintf("%s[%d]", path, i)
			if secrets {
				decodeSecret(e, out.Index(i), key, ps)
				continue
			}
			decode(e, out.Index(i), key, ps)
		}
		// A list of routes is kept with its faulty entries partly decoded, so
		// their other problems are reported too; a list of scalars is all or
		// nothing.
		if len(*ps) == n || t.Elem().Kind() == reflect.Struct {
			v.Set(out)
		}
	case t.Kind() == reflect.String:
		switch x := raw.(type) {
		case string:
			v.SetString(x)
		case int, int64, uint64, bool:
			v.SetString(fmt.Sprint(x))
		case float64:
			v.SetString(strconv.FormatFloat(x, 'f', -1, 64))
		default:
			ps.add(path, "want a string, got %s", describe(raw))
		}
	case t.Kind() == reflect.Bool:
		switch x := raw.(type) {
		case bool:
			v.SetBool(x)
		case string:
			b, err := strconv.ParseBool(x)
			if err != nil {
				ps.add(path, "invalid boolean %q (want true or false)", x)
				return
			}
			v.SetBool(b)
		default:
			ps.add(path, "want true or false, got %s", describe(raw))
		}
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int64:
		n, err := toInt(raw)
		if err != nil {
			ps.add(path, "%v", err)
			return
		}
		v.SetInt(n)
	default:
		panic(fmt.Sprintf("config: no decoder for %s at %s", t, path))
	}
}

// decodeSecret stores raw, a secret as parsed from YAML, into v, a string:
// a string as it is; anything else is a problem at path that does not show
// the value, a number or a boolean (whose text YAML may have changed)
// named as such.
func decodeSecret(raw any, v reflect.Value, path string, ps *Problems) {
	switch x := raw.(type) {
	case string:
		v.SetString(x)
	default:
		if numberOrBool(raw) {
			ps.add(path, "must be a string; %s", secretNotString)
		} else {
			ps.add(path, "%s", secretNotShown)
		}
	}
}

// nearestKey returns the known key closest to the unknown key k, by edit
// distance with swaps, when it is close enough to be a misspelling (at most
// 2 edits, and fewer than half of k's length); else "". Ties go to the key
// fewer edits away without swaps ("wrti_timeout" is two edits from both
// write_timeout and wait_timeout, but two and three without swaps), then
// to the first in order.
func nearestKey(k string, known map[string]reflect.Value) string {
	best, bestDist, bestPlain := "", 0, 0
	names := slices.Sorted(maps.Keys(known))
	for _, name := range names {
		d := editDistance(k, name, true)
		if d > 2 || 2*d >= len(k) {
			continue
		}
		plain := editDistance(k, name, false)
		if best == "" || d < bestDist || d == bestDist && plain < bestPlain {
			best, bestDist, bestPlain = name, d, plain
		}
	}
	return best
}

// editDistance is the edit distance between a and b, in bytes: the number
// of insertions, deletions and substitutions of one byte (Levenshtein's)
// that turn a into b, and with swaps, also of swaps of two adjacent bytes
// (the optimal string alignment distance): "paht" is one edit from "path"
// with swaps, as a typist sees it, and two without.
func editDistance(a, b string, swaps bool) int {
	// rows[i%3] is row i of the table: a swap looks two rows back.
	var rows [3][]int
	for r := range rows {
		rows[r] = make([]int, len(b)+1)
	}
	for j := range rows[0] {
		rows[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur, prev, prev2 := rows[i%3], rows[(i-1)%3], rows[(i+1)%3]
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if swaps && i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
	}
	return rows[len(a)%3][len(b)]
}

// fieldsOf maps the config tag names of struct v's fields, including the
// fields of ",squash" embedded structs, to the fields.
func fieldsOf(v reflect.Value) map[string]reflect.Value {
	out := map[string]reflect.Value{}
	for i := range v.NumField() {
		sf := v.Type().Field(i)
		name, opt, _ := strings.Cut(sf.Tag.Get("config"), ",")
		switch {
		case opt == "squash":
			for k, fv := range fieldsOf(v.Field(i)) {
				out[k] = fv
			}
		case name != "" && sf.IsExported():
			out[name] = v.Field(i)
		}
	}
	return out
}

func toDuration(raw any) (time.Duration, error) {
	switch x := raw.(type) {
	case string:
		d, err := time.ParseDuration(strings.TrimSpace(x))
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q (want e.g. \"300ms\", \"30s\", \"24h\")", x)
		}
		return d, nil
	case int:
		if x == 0 {
			return 0, nil
		}
		return 0, fmt.Errorf("invalid duration %d (want a number with a unit, e.g. \"%ds\", \"%dm\" or \"%dh\")", x, x, x, x)
	case float64:
		if !math.IsInf(x, 0) && !math.IsNaN(x) {
			return 0, fmt.Errorf("invalid duration %v (want a number with a unit, e.g. \"%vs\", \"%vm\" or \"%vh\")", x, x, x, x)
		}
	}
	return 0, fmt.Errorf("want a duration such as \"30s\", got %s", describe(raw))
}

func toInt(raw any) (int64, error) {
	switch x := raw.(type) {
	case int:
		return int64(x), nil
	case int64:
		return x, nil
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), nil
		}
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x), nil
		}
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		if err == nil {
			return n, nil
		}
		return 0, fmt.Errorf("invalid integer %q", x)
	}
	return 0, fmt.Errorf("want an integer, got %s", describe(raw))
}

// secretNotString is the problem with a secret that YAML read as a number
// or a boolean: an unquoted 0123456 is the octal number 42798, 1e5 the
// float 100000, a long run of digits a rounded float. Turned back into
// text, such a secret would be another key, and every delivery would fail
// its signature check with nothing said at start-up. The value is not
// shown: it is a secret.
const secretNotString = "YAML reads it as a number or a boolean, whose text can change on the way (0123 is octal 83, 1e5 the float 100000); quote it (the value is not shown)"

// numberOrBool reports whether raw is a YAML number or boolean.
func numberOrBool(raw any) bool {
	switch raw.(type) {
	case int, int64, uint64, float64, bool:
		return true
	}
	return false
}

func describe(raw any) string {
	switch x := raw.(type) {
	case map[string]any:
		return "a mapping"
	case []any:
		return "a list"
	case string:
		return strconv.Quote(x)
	}
	return fmt.Sprint(raw)
}
