// Command dedupgw is the webhook deduplication gateway.
//
//	dedupgw serve --config FILE              run the gateway
//	dedupgw validate --config FILE           check a configuration, listing every problem
//	dedupgw version                          print the version
//	dedupgw keys get [--admin URL] ROUTE KEY     show a key's record (admin API)
//	dedupgw keys list [--admin URL] [--state S] [--since T] [--until T] [--limit N] ROUTE
//	                                         list a route's keys as JSON Lines
//	dedupgw keys forget [--admin URL] [--force] ROUTE KEY  forget a key so its replay is forwarded
//	dedupgw keys forget [--admin URL] [--force] [--yes] [--include-maybe-processed] [--state S] [--since T] [--until T] ROUTE
//	                                         forget every key the filters list (--yes to do it)
//
// serve reloads the configuration on SIGHUP and drains in-flight deliveries on
// SIGTERM or SIGINT. The keys commands read the admin token from
// DEDUPGW_ADMIN_TOKEN.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/proxy"
)

// version is stamped at build time with -ldflags "-X main.version=v1.2.3".
// Unstamped, main makes it "dev" plus the commit go build recorded (see
// devVersion).
var version = "dev"

// devVersion names an unstamped build by the VCS revision go build
// recorded in info, "dev-<12 hex digits>", with "-dirty" for a modified
// tree; "dev" without one. Two unstamped builds of different commits can
// then be told apart (found in an upgrade trial).
func devVersion(info *debug.BuildInfo, ok bool) string {
	if !ok {
		return "dev"
	}
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if rev == "" {
		return "dev"
	}
	return "dev-" + rev[:min(12, len(rev))] + dirty
}

const usage = `dedupgw — webhook deduplication gateway

Usage:
  dedupgw serve --config FILE              run the gateway (SIGHUP reloads, SIGTERM drains)
  dedupgw validate --config FILE           check a configuration; exit 1 listing every problem
  dedupgw version                          print the version
  dedupgw keys get [--admin URL] ROUTE KEY     print a key's record as JSON
  dedupgw keys list [--admin URL] [--state S] [--since T] [--until T] [--limit N] ROUTE
                                           print a route's keys, one JSON object a line
  dedupgw keys forget [--admin URL] [--force] ROUTE KEY
                                           forget a key so its next delivery is forwarded
  dedupgw keys forget [--admin URL] [--force] [--yes] [--include-maybe-processed] [--state S] [--since T] [--until T] ROUTE
                                           forget every key the filters list; without --yes
                                           only print them; keeps keys in flight and keys
                                           marked maybe_processed (dedupgw keys --help says more)

Environment:
  ${VAR} in config values is expanded, ${file:PATH} replaced by the file's content (a
  change to it, or to the config file, reloads within 10s); DEDUPGW_* variables override
  keys outside routes
  (DEDUPGW_STORE_BACKEND, DEDUPGW_STORE_REDIS_ADDRS=a:6379,b:6379, ...).
  The keys commands send DEDUPGW_ADMIN_TOKEN as the bearer token.
`

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // the command ran and failed (invalid config, 404, server error)
	exitUsage = 2 // the command line is wrong
)

func main() {
	if version == "dev" {
		version = devVersion(debug.ReadBuildInfo())
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args (without the program name), writing
// results to stdout and diagnostics to stderr, and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "serve":
		return cmdServe(args[1:], stderr)
	case "validate":
		return cmdValidate(args[1:], stdout, stderr)
	case "version", "--version", "-version":
		fmt.Fprintf(stdout, "dedupgw %s %s %s/%s\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return exitOK
	case "keys":
		return cmdKeys(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "dedupgw: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

// looksLikeConfig reports whether arg, an argument given without --config,
// names a file that exists or a YAML file.
func looksLikeConfig(arg string) bool {
	if ext := strings.ToLower(filepath.Ext(arg)); ext == ".yaml" || ext == ".yml" {
		return true
	}
	st, err := os.Stat(arg)
	return err == nil && st.Mode().IsRegular()
}

// shellWord returns s as it can be typed to a shell: as it is when it holds
// only characters no shell reads specially, else single-quoted.
func shellWord(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:=@%+,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// configFlag parses "--config FILE" (and no positional arguments) for serve
// and validate. When ok is false the command exits with code: 0 after
// -h/--help (the usage was printed), exitUsage for a wrong command line.
func configFlag(name string, args []string, stderr io.Writer) (path string, code int, ok bool) {
	fs := flag.NewFlagSet("dedupgw "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("config", "", "configuration file (YAML)")
	if err := fs.Parse(args); err != nil {
		return "", usageExit(err), false
	}
	if fs.NArg() > 0 {
		hint := ""
		if *file == "" && fs.NArg() == 1 && looksLikeConfig(fs.Arg(0)) {
			hint = fmt.Sprintf(" (did you mean --config %s?)", shellWord(fs.Arg(0)))
		}
		fmt.Fprintf(stderr, "dedupgw %s: unexpected argument %q%s\n", name, fs.Arg(0), hint)
		return "", exitUsage, false
	}
	if *file == "" {
		fmt.Fprintf(stderr, "dedupgw %s: missing --config FILE\n", name)
		return "", exitUsage, false
	}
	return *file, exitOK, true
}

// usageExit is the exit code after a flag set's Parse failed with err: 0
// for -h or --help, which asked for the usage the flag package printed, and
// exitUsage for a wrong command line.
func usageExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

// loadConfig loads and validates the file at path. The error is Problems when
// the file was read but is invalid, listing every problem; a problem under
// routes[N] names its route. The File is nil only when the file could not
// be read or parsed: with Problems it is returned too, for its environment
// warnings (see cmdValidate), not to be used otherwise.
func loadConfig(path string, env func(string) (string, bool)) (*File, error) {
	f, ps, err := checkConfig(path, env)
	if err != nil {
		return nil, err
	}
	if len(ps) > 0 {
		nameRoutes(ps, f.Routes)
		return f, ps
	}
	return f, nil
}

// checkConfig loads the file at path and validates it. It returns every
// problem Load and Validate found, and an error only when the file could not
// be read or parsed.
func checkConfig(path string, env func(string) (string, bool)) (*File, Problems, error) {
	f, err := Load(path, env)
	var ps Problems
	if err != nil && !errors.As(err, &ps) {
		return nil, nil, err
	}
	if verr := f.Validate(); verr != nil {
		var vps Problems
		if !errors.As(verr, &vps) {
			return nil, nil, verr
		}
		ps = append(ps, vps...)
	}
	return f, ps, nil
}

// nameRoutes adds the route's name to each problem under routes[N], so a
// reader with many routes need not count them.
func nameRoutes(ps Problems, routes []Route) {
	for i, p := range ps {
		rest, ok := strings.CutPrefix(p.Key, "routes[")
		if !ok {
			continue
		}
		n, _, ok := strings.Cut(rest, "]")
		if !ok {
			continue
		}
		idx, err := strconv.Atoi(n)
		if err != nil || idx < 0 || idx >= len(routes) || routes[idx].Name == "" {
			continue
		}
		ps[i].Msg += fmt.Sprintf(" (route %q)", routes[idx].Name)
	}
}

// printConfigError writes err to w, one problem per line when it lists them.
func printConfigError(w io.Writer, path string, err error) {
	var ps Problems
	if !errors.As(err, &ps) {
		fmt.Fprintf(w, "dedupgw: %v\n", err)
		return
	}
	noun := "problems"
	if len(ps) == 1 {
		noun = "problem"
	}
	fmt.Fprintf(w, "dedupgw: %s: %d %s:\n", path, len(ps), noun)
	for _, p := range ps {
		fmt.Fprintf(w, "  %s\n", p)
	}
}

func cmdValidate(args []string, stdout, stderr io.Writer) int {
	path, code, ok := configFlag("validate", args, stderr)
	if !ok {
		return code
	}
	f, err := loadConfig(path, os.LookupEnv)
	if err == nil {
		// Build the routes as serve would, so a file that validates also
		// starts (the proxy checks what the file's schema cannot).
		err = tryGateway(f)
	}
	if err != nil {
		printConfigError(stderr, path, err)
	}
	// Warnings about the environment hold whatever the file says, and may
	// explain a problem (a misspelt or empty DEDUPGW_ADMIN_TOKEN).
	for _, name := range UnknownEnv(os.Environ()) {
		fmt.Fprintf(stderr, "dedupgw validate: warning: %s overrides no configuration key and is ignored (%s)\n", name, unknownEnvHint(name))
	}
	var ws []Problem
	switch {
	case f == nil:
	case err != nil:
		ws = f.envWarnings()
	default:
		ws = f.Warnings()
	}
	for _, w := range ws {
		fmt.Fprintf(stderr, "dedupgw validate: warning: %s\n", w)
	}
	if err != nil {
		if f != nil {
			// Warnings judge a file that is valid (windows against the
			// provider's retries, routes without secrets, …): say there
			// may be a second round rather than let this one look complete.
			fmt.Fprintln(stderr, "dedupgw validate: more checks (warnings about likely mistakes) run once these problems are fixed")
		}
		return exitFail
	}
	names := make([]string, len(f.Routes))
	for i, r := range f.Routes {
		names[i] = r.Name
	}
	noun := "routes"
	if len(f.Routes) == 1 {
		noun = "route"
	}
	fmt.Fprintf(stdout, "%s: ok (store %s; %d %s: %s)\n", path, f.Store.Backend, len(f.Routes), noun, strings.Join(names, ", "))
	return exitOK
}

// tryGateway builds the gateway for f on a throw-away memory store.
func tryGateway(f *File) error {
	store := memstore.New(memstore.Options{SweepInterval: -1})
	defer store.Close()
	gw, err := proxy.New(f.GatewayConfig(), store, proxy.Options{})
	if err != nil {
		return err
	}
	return gw.Close()
}
