package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// defaultAdminURL is where the keys commands find the admin API.
const defaultAdminURL = "http://127.0.0.1:9090"

// keysTimeout bounds one keys API call.
const keysTimeout = 10 * time.Second

const keysUsage = `Usage:
  dedupgw keys get [--admin URL] ROUTE KEY     print the key's record as JSON
  dedupgw keys list [--admin URL] [--state S] [--since T] [--until T] [--limit N] ROUTE
                                               print the route's keys, one JSON object a line
  dedupgw keys forget [--admin URL] [--force] ROUTE KEY
                                               forget the key so its next delivery is forwarded;
                                               a key whose delivery is in flight needs --force
  dedupgw keys forget [--admin URL] [--force] [--yes] [--include-maybe-processed] [--state S] [--since T] [--until T] ROUTE
                                               forget every key the filters list: without --yes
                                               only print them; keys in flight need --force, and
                                               keys marked maybe_processed --include-maybe-processed

--state is processing, processed or failed (comma-separated for several).
--since and --until take an RFC 3339 time (2026-12-01T10:00:00Z) or a
duration meaning that long before the command started (1h); a processed
or failed key is placed by when it completed, one in flight by when it was
first seen. Since is inclusive, until exclusive. --limit 0 (the default) lists every key.

A key marked "maybe_processed": true had an attempt that ended without an
answer (cut at upstream_timeout, a shutdown, a lost connection, a gateway
that stopped mid-forward): the application may have processed it, and a
replay would process it again. A bulk forget keeps such keys, in flight
too, unless --include-maybe-processed; check them in the application first.

The admin token is read from DEDUPGW_ADMIN_TOKEN. --admin defaults to
DEDUPGW_ADMIN_URL, else ` + defaultAdminURL + `.
`

// cmdKeys runs "keys get", "keys list" and "keys forget" against the admin
// API. It exits non-zero when the key is absent (404), the token is refused
// (401) or the gateway cannot be reached; see cmdKeysForgetMany for a
// forget by filters.
func cmdKeys(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		fmt.Fprintf(stderr, "dedupgw keys: missing subcommand (get, list or forget)\n%s", keysUsage)
		return exitUsage
	case args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help":
		fmt.Fprint(stdout, keysUsage)
		return exitOK
	case args[0] != "get" && args[0] != "forget" && args[0] != "list":
		fmt.Fprintf(stderr, "dedupgw keys: unknown subcommand %q (want get, list or forget)\n%s", args[0], keysUsage)
		return exitUsage
	}
	op := args[0]
	fs := flag.NewFlagSet("dedupgw keys "+op, flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := defaultAdminURL
	if v, ok := os.LookupEnv(envAdminURL); ok && v != "" {
		def = v
	}
	admin := fs.String("admin", def, "admin API base URL")
	var (
		bulk bulkForget
		f    listFilters
	)
	if op == "forget" {
		fs.BoolVar(&bulk.force, "force", false, "forget the key even while a delivery of it is in flight")
		fs.BoolVar(&bulk.yes, "yes", false, "with filters: forget the keys listed (without it they are only printed)")
		fs.BoolVar(&bulk.maybeProcessed, "include-maybe-processed", false, "with filters: forget keys marked maybe_processed too (the application may have processed them)")
	}
	if op != "get" {
		fs.StringVar(&f.state, "state", "", "only keys in this state: processing, processed or failed (comma-separated for several)")
		fs.StringVar(&f.since, "since", "", "only keys at or after this RFC 3339 time, or this long ago (1h)")
		fs.StringVar(&f.until, "until", "", "only keys before this RFC 3339 time, or this long ago")
	}
	if op == "list" {
		fs.IntVar(&f.limit, "limit", 0, "list at most this many keys (0: all)")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return usageExit(err)
	}
	if op == "list" || (op == "forget" && f.any()) {
		return cmdKeysMany(op, fs, *admin, f, bulk, stdout, stderr)
	}
	if bulk.maybeProcessed {
		// A single forget forgets the key named, marked or not.
		fmt.Fprintf(stderr, "dedupgw keys forget: --include-maybe-processed applies to a forget by filters (--state, --since, --until); ROUTE KEY forgets that key whatever its mark\n")
		return exitUsage
	}
	if (fs.NArg() > 2 && strings.HasPrefix(fs.Arg(2), "-")) || (misplacedFlag(fs) && !slices.Contains(args, "--")) {
		// Go's flag package stops at the first argument: --admin after
		// the key would otherwise be an unexplained usage error, and
		// "forget ROUTE --yes" would forget a key named --yes. After
		// "--", ROUTE and KEY are taken as written.
		fmt.Fprintf(stderr, "dedupgw keys %s: flags go before ROUTE and KEY, e.g. dedupgw keys %s --admin URL ROUTE KEY\n", op, op)
		return exitUsage
	}
	if fs.NArg() != 2 || fs.Arg(0) == "" || fs.Arg(1) == "" {
		msg := fmt.Sprintf("want ROUTE and KEY, got %d argument(s)", fs.NArg())
		switch {
		case fs.NArg() == 1 && op == "forget":
			msg = "missing KEY after ROUTE " + strconv.Quote(fs.Arg(0)) + " (to forget by state or time, give --state, --since or --until)"
		case fs.NArg() == 1:
			msg = "missing KEY after ROUTE " + strconv.Quote(fs.Arg(0))
		case fs.NArg() == 0:
			msg = "missing ROUTE and KEY"
		}
		fmt.Fprintf(stderr, "dedupgw keys %s: %s\n%s", op, msg, keysUsage)
		return exitUsage
	}
	route, key := fs.Arg(0), fs.Arg(1)
	base, ok := adminBase(*admin, stderr)
	if !ok {
		return exitUsage
	}

	method := http.MethodGet
	if op == "forget" {
		method = http.MethodDelete
	}
	target := base + "/v1/keys/" + pathSegment(route) + "/" + pathSegment(key)
	if bulk.force {
		target += "?force=true"
	}
	code, body, err := adminCall(method, target, 1<<20)
	if err != nil {
		fmt.Fprintf(stderr, "dedupgw keys: %v\n", err)
		return exitFail
	}

	switch {
	case op == "get" && code == http.StatusOK:
		var out bytes.Buffer
		if json.Indent(&out, body, "", "  ") != nil {
			out.Reset()
			out.Write(body)
		}
		fmt.Fprintln(stdout, strings.TrimRight(out.String(), "\n"))
		return exitOK
	case op == "forget" && code/100 == 2:
		fmt.Fprintf(stdout, "forgot %s/%s: its next delivery will be forwarded\n", route, key)
		if bulk.force {
			// The gateway refuses the forward's commit once the claim is
			// gone: a delivery in flight is not recorded when it succeeds.
			fmt.Fprintln(stdout, "(forced: a delivery of it still in flight, if any, will not be recorded when it finishes; a copy of it will be forwarded again)")
		}
		return exitOK
	case code == http.StatusNotFound:
		fmt.Fprintf(stderr, "dedupgw keys: %s/%s: not found (%s)\n", route, key, detail(body))
	case code == http.StatusConflict:
		fmt.Fprintf(stderr, "dedupgw keys: %s/%s: in flight (%s)\n", route, key, strings.Replace(detail(body), "add ?force=true", "use --force", 1))
	case code == http.StatusUnauthorized:
		fmt.Fprint(stderr, msgUnauthorized())
	default:
		fmt.Fprintf(stderr, "dedupgw keys: %s %s: %d %s (%s)\n", method, target, code, http.StatusText(code), detail(body))
	}
	return exitFail
}

// misplacedFlag reports whether an argument after ROUTE is one of fs's
// flags ("-yes", "--state=failed"): Go's flag package stops at ROUTE, so
// it would be taken for a key.
func misplacedFlag(fs *flag.FlagSet) bool {
	for _, a := range fs.Args()[min(1, fs.NArg()):] {
		name, ok := strings.CutPrefix(a, "-")
		if !ok {
			continue
		}
		name = strings.TrimPrefix(name, "-")
		name, _, _ = strings.Cut(name, "=")
		if fs.Lookup(name) != nil {
			return true
		}
	}
	return false
}

// cmdKeysMany runs "keys list" and a bulk "keys forget" (one with
// filters) on the parsed flags: one argument, ROUTE.
func cmdKeysMany(op string, fs *flag.FlagSet, admin string, f listFilters, bulk bulkForget, stdout, stderr io.Writer) int {
	if (fs.NArg() > 1 && strings.HasPrefix(fs.Arg(1), "-")) || misplacedFlag(fs) {
		fmt.Fprintf(stderr, "dedupgw keys %s: flags go before ROUTE, e.g. dedupgw keys %s --state failed ROUTE\n", op, op)
		return exitUsage
	}
	if fs.NArg() != 1 || fs.Arg(0) == "" {
		msg := fmt.Sprintf("want ROUTE alone, got %d argument(s)", fs.NArg())
		switch {
		case fs.NArg() == 0:
			msg = "missing ROUTE"
		case op == "forget":
			msg = "give either KEY or filters (--state, --since, --until), not both"
		}
		fmt.Fprintf(stderr, "dedupgw keys %s: %s\n%s", op, msg, keysUsage)
		return exitUsage
	}
	if msg := checkListArgs(f); msg != "" {
		fmt.Fprintf(stderr, "dedupgw keys %s: %s\n", op, msg)
		return exitUsage
	}
	base, ok := adminBase(admin, stderr)
	if !ok {
		return exitUsage
	}
	f = f.resolved(time.Now())
	if op == "list" {
		return cmdKeysList(base, fs.Arg(0), f, stdout, stderr)
	}
	return cmdKeysForgetMany(base, fs.Arg(0), f, bulk, stdout, stderr)
}

// adminBase returns the admin API's base URL from --admin, without a
// trailing "/"; ok false, said on stderr, when it is not an http(s) URL.
func adminBase(admin string, stderr io.Writer) (base string, ok bool) {
	u, err := url.Parse(strings.TrimRight(admin, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		fmt.Fprintf(stderr, "dedupgw keys: invalid --admin URL %q\n", admin)
		return "", false
	}
	return u.String(), true
}

// msgUnauthorized is what the keys commands say when the admin API refused
// the token (401): that none was sent, or that the one sent is not the
// gateway's.
func msgUnauthorized() string {
	if adminToken() != "" {
		return "dedupgw keys: unauthorized: the gateway refused the token in DEDUPGW_ADMIN_TOKEN; it must be the gateway's admin.token\n"
	}
	return "dedupgw keys: unauthorized: set DEDUPGW_ADMIN_TOKEN to the gateway's admin.token\n"
}

// pathSegment escapes s as one URL path segment: "/" included, and "." and
// "..", which would otherwise be dot segments the admin API refuses.
func pathSegment(s string) string {
	if s == "." || s == ".." {
		return strings.Repeat("%2E", len(s))
	}
	return url.PathEscape(s)
}

// detail returns the detail (else title) of a problem+json body, or the body.
func detail(body []byte) string {
	var p struct{ Title, Detail string }
	if json.Unmarshal(body, &p) == nil {
		if p.Detail != "" {
			return p.Detail
		}
		if p.Title != "" {
			return p.Title
		}
	}
	return strings.TrimSpace(string(body))
}
