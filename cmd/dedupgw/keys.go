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
  dedupgw keys forget [--admin URL] [--force] ROUTE KEY
                                               forget the key so its next delivery is forwarded;
                                               a key whose delivery is in flight needs --force

The admin token is read from DEDUPGW_ADMIN_TOKEN. --admin defaults to
DEDUPGW_ADMIN_URL, else ` + defaultAdminURL + `.
`

// cmdKeys runs "keys get" and "keys forget" against the admin API. It exits
// non-zero when the key is absent (404), the token is refused (401) or the
// gateway cannot be reached.
func cmdKeys(args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		fmt.Fprintf(stderr, "dedupgw keys: missing subcommand (get or forget)\n%s", keysUsage)
		return exitUsage
	case args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help":
		fmt.Fprint(stdout, keysUsage)
		return exitOK
	case args[0] != "get" && args[0] != "forget":
		msg := fmt.Sprintf("unknown subcommand %q (want get or forget)", args[0])
		if args[0] == "list" {
			msg += "; there is no listing: the admin API answers by exact key"
		}
		fmt.Fprintf(stderr, "dedupgw keys: %s\n%s", msg, keysUsage)
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
	var force *bool
	if op == "forget" {
		force = fs.Bool("force", false, "forget the key even while a delivery of it is in flight")
	}
	if err := fs.Parse(args[1:]); err != nil {
		return usageExit(err)
	}
	if fs.NArg() > 2 && strings.HasPrefix(fs.Arg(2), "-") {
		// Go's flag package stops at the first argument: --admin after
		// the key would otherwise be an unexplained usage error.
		fmt.Fprintf(stderr, "dedupgw keys %s: flags go before ROUTE and KEY, e.g. dedupgw keys %s --admin URL ROUTE KEY\n", op, op)
		return exitUsage
	}
	if fs.NArg() != 2 || fs.Arg(0) == "" || fs.Arg(1) == "" {
		msg := fmt.Sprintf("want ROUTE and KEY, got %d argument(s)", fs.NArg())
		switch {
		case fs.NArg() == 1:
			msg = "missing KEY after ROUTE " + strconv.Quote(fs.Arg(0))
		case fs.NArg() == 0:
			msg = "missing ROUTE and KEY"
		}
		fmt.Fprintf(stderr, "dedupgw keys %s: %s\n%s", op, msg, keysUsage)
		return exitUsage
	}
	route, key := fs.Arg(0), fs.Arg(1)
	base, err := url.Parse(strings.TrimRight(*admin, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		fmt.Fprintf(stderr, "dedupgw keys: invalid --admin URL %q\n", *admin)
		return exitUsage
	}

	method := http.MethodGet
	if op == "forget" {
		method = http.MethodDelete
	}
	target := base.String() + "/v1/keys/" + pathSegment(route) + "/" + pathSegment(key)
	if force != nil && *force {
		target += "?force=true"
	}
	req, err := http.NewRequest(method, target, nil)
	if err != nil {
		fmt.Fprintf(stderr, "dedupgw keys: %v\n", err)
		return exitFail
	}
	if tok, _ := os.LookupEnv("DEDUPGW_ADMIN_TOKEN"); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	client := &http.Client{Timeout: keysTimeout}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintf(stderr, "dedupgw keys: %v\n", err)
		return exitFail
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		fmt.Fprintf(stderr, "dedupgw keys: read answer: %v\n", err)
		return exitFail
	}

	switch {
	case op == "get" && resp.StatusCode == http.StatusOK:
		var out bytes.Buffer
		if json.Indent(&out, body, "", "  ") != nil {
			out.Reset()
			out.Write(body)
		}
		fmt.Fprintln(stdout, strings.TrimRight(out.String(), "\n"))
		return exitOK
	case op == "forget" && resp.StatusCode/100 == 2:
		fmt.Fprintf(stdout, "forgot %s/%s: its next delivery will be forwarded\n", route, key)
		if force != nil && *force {
			// The gateway refuses the forward's commit once the claim is
			// gone: a delivery in flight is not recorded when it succeeds.
			fmt.Fprintln(stdout, "(forced: a delivery of it still in flight, if any, will not be recorded when it finishes; a copy of it will be forwarded again)")
		}
		return exitOK
	case resp.StatusCode == http.StatusNotFound:
		fmt.Fprintf(stderr, "dedupgw keys: %s/%s: not found (%s)\n", route, key, detail(body))
	case resp.StatusCode == http.StatusConflict:
		fmt.Fprintf(stderr, "dedupgw keys: %s/%s: in flight (%s)\n", route, key, strings.Replace(detail(body), "add ?force=true", "use --force", 1))
	case resp.StatusCode == http.StatusUnauthorized:
		fmt.Fprintf(stderr, "dedupgw keys: unauthorized: set DEDUPGW_ADMIN_TOKEN to the gateway's admin.token\n")
	default:
		fmt.Fprintf(stderr, "dedupgw keys: %s %s: %s (%s)\n", method, target, resp.Status, detail(body))
	}
	return exitFail
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
