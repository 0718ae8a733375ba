package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dedupgw/dedupgw/proxy"
)

// listPageLimit is the page size the keys commands ask the listing for.
const listPageLimit = 1000

// listFilters are the flags "keys list" and a bulk "keys forget" share;
// their values go to GET /v1/keys/{route} as they are, which checks them.
type listFilters struct {
	state, since, until string
	// limit is the most keys to list, 0 for all.
	limit int
}

// any reports whether a filter is set.
func (f listFilters) any() bool { return f.state != "" || f.since != "" || f.until != "" }

// resolved returns f with a since or until given as a duration (a
// positive Go duration, as the gateway reads one) turned into the RFC 3339
// time that long before now. The gateway would resolve a duration on each
// page anew, so an until of 24h would move later while a long listing (or
// bulk forget) runs and take in keys newer than asked; resolved once, every
// page asks for the same instants. Anything else is left for the gateway
// to check.
func (f listFilters) resolved(now time.Time) listFilters {
	for _, v := range []*string{&f.since, &f.until} {
		if d, err := time.ParseDuration(*v); err == nil && d > 0 {
			*v = now.Add(-d).UTC().Format(time.RFC3339Nano)
		}
	}
	return f
}

// query is the listing's query for cursor.
func (f listFilters) query(cursor string) string {
	q := url.Values{}
	if f.state != "" {
		q.Set("state", f.state)
	}
	if f.since != "" {
		q.Set("since", f.since)
	}
	if f.until != "" {
		q.Set("until", f.until)
	}
	page := listPageLimit
	if f.limit > 0 {
		page = min(f.limit, listPageLimit)
	}
	q.Set("limit", strconv.Itoa(page))
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	return q.Encode()
}

// listedKey is one key of a listing: its JSON object as the API sent it,
// and the fields the bulk forget reads.
type listedKey struct {
	raw            json.RawMessage
	Key            string `json:"key"`
	State          string `json:"state"`
	MaybeProcessed bool   `json:"maybe_processed"`
}

// bulkForget holds the flags of "keys forget" beside the filters.
type bulkForget struct {
	// force forgets keys listed in flight; a single forget sends it too.
	force bool
	// yes forgets the keys listed; without it they are only printed.
	yes bool
	// maybeProcessed forgets keys marked maybe_processed too.
	maybeProcessed bool
}

// adminCall sends one request to the admin API with the token from the
// environment and returns the status and at most limit bytes of the body.
func adminCall(method, target string, limit int64) (int, []byte, error) {
	req, err := http.NewRequest(method, target, nil)
	if err != nil {
		return 0, nil, err
	}
	if tok := adminToken(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	client := &http.Client{Timeout: keysTimeout}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return 0, nil, fmt.Errorf("read answer: %w", err)
	}
	if webhookListener(resp.Header, body) {
		return 0, nil, fmt.Errorf("%s answered as the gateway's webhook listener, not its admin API: point --admin (or %s) at admin.listen, by default http://127.0.0.1:9090", target, envAdminURL)
	}
	if resp.StatusCode == http.StatusNotFound && !gatewayProblem(body) {
		return 0, nil, fmt.Errorf("%s answered %d %s, but not as dedupgw's admin API (whose errors are problem documents of type %s…): is --admin (or %s) the gateway's admin.listen, by default http://127.0.0.1:9090?",
			target, resp.StatusCode, http.StatusText(resp.StatusCode), proxy.ProblemTypePrefix, envAdminURL)
	}
	return resp.StatusCode, body, nil
}

// gatewayProblem reports whether body is a problem document the gateway
// wrote: every 404 of its admin API is one, so another server's (an
// application's, at a wrong --admin) is not taken for "key not found".
// Other statuses pass as they are: they are printed with their body, and a
// server in front of the admin API (an authenticating proxy) or net/http
// itself (431 for a key too long for a request line) answers them in
// plain text.
func gatewayProblem(body []byte) bool {
	return strings.HasPrefix(problemType(body), proxy.ProblemTypePrefix)
}

// problemType returns the type of the problem document body, or "" when
// body is not one.
func problemType(body []byte) string {
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	return p.Type
}

// adminToken returns DEDUPGW_ADMIN_TOKEN without the white space around it:
// a token read from a file or a Secret often ends in a newline, which no
// header can carry (the gateway trims its admin.token the same way).
func adminToken() string {
	return strings.TrimSpace(os.Getenv("DEDUPGW_ADMIN_TOKEN"))
}

// webhookListener reports whether an answer came from the gateway's
// webhook listener: a route's answer carries Dedup-Status, and a path no
// route takes gets the no-route problem, which the admin API never sends.
func webhookListener(h http.Header, body []byte) bool {
	if h.Get(proxy.HeaderDedupStatus) != "" {
		return true
	}
	return problemType(body) == proxy.ProblemTypeNoRoute
}

// listKeys follows the listing of route page by page, calling fn with each
// key. It prints why it stopped to stderr and returns the exit code:
// exitUsage when the gateway refused a filter (400), exitFail for anything
// else that went wrong.
func listKeys(base, route string, f listFilters, stderr io.Writer, fn func(listedKey) error) int {
	cursor := ""
	seen := 0
	for {
		target := base + "/v1/keys/" + pathSegment(route) + "?" + f.query(cursor)
		code, body, err := adminCall(http.MethodGet, target, 64<<20)
		if err != nil {
			fmt.Fprintf(stderr, "dedupgw keys: %v\n", err)
			return exitFail
		}
		switch code {
		case http.StatusOK:
		case http.StatusBadRequest:
			fmt.Fprintf(stderr, "dedupgw keys: %s\n", detail(body))
			return exitUsage
		case http.StatusNotFound:
			fmt.Fprintf(stderr, "dedupgw keys: %s: not found (%s)\n", route, detail(body))
			return exitFail
		case http.StatusUnauthorized:
			fmt.Fprint(stderr, msgUnauthorized())
			return exitFail
		default:
			fmt.Fprintf(stderr, "dedupgw keys: GET %s: %d (%s)\n", target, code, detail(body))
			return exitFail
		}
		var page struct {
			Keys []json.RawMessage `json:"keys"`
			Next string            `json:"next"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			fmt.Fprintf(stderr, "dedupgw keys: GET %s: not a listing: %v\n", target, err)
			return exitFail
		}
		for _, raw := range page.Keys {
			k := listedKey{raw: raw}
			if err := json.Unmarshal(raw, &k); err != nil {
				fmt.Fprintf(stderr, "dedupgw keys: GET %s: not a key: %v\n", target, err)
				return exitFail
			}
			if err := fn(k); err != nil {
				fmt.Fprintf(stderr, "dedupgw keys: %v\n", err)
				return exitFail
			}
			if seen++; seen == f.limit {
				return exitOK
			}
		}
		if page.Next == "" {
			return exitOK
		}
		cursor = page.Next
	}
}

// cmdKeysList prints every key of route that passes f as JSON Lines.
func cmdKeysList(base, route string, f listFilters, stdout, stderr io.Writer) int {
	return listKeys(base, route, f, stderr, func(k listedKey) error {
		_, err := fmt.Fprintf(stdout, "%s\n", k.raw)
		return err
	})
}

// cmdKeysForgetMany forgets every key of route that passes f: it lists
// them first, and without bulk.yes only prints the keys it would forget
// (JSON Lines) and what it would do. Keys in flight are skipped unless
// bulk.force, and keys marked maybe_processed (the application may have
// processed them: a replay would process them again) unless
// bulk.maybeProcessed; each key is forgotten only in the state it was
// listed in, and unmarked keys only while unmarked. It exits 0 when every
// listed key was forgotten or had gone meanwhile, 1 when any was skipped,
// kept, had changed state or failed.
func cmdKeysForgetMany(base, route string, f listFilters, bulk bulkForget, stdout, stderr io.Writer) int {
	var keys []listedKey
	if code := listKeys(base, route, f, stderr, func(k listedKey) error {
		keys = append(keys, k)
		return nil
	}); code != exitOK {
		return code
	}
	// Why a listed key is left alone: "" when it is to be forgotten.
	leave := func(k listedKey) string {
		switch {
		case k.State == "processing" && !bulk.force:
			return "in flight"
		case k.MaybeProcessed && !bulk.maybeProcessed:
			return "maybe processed"
		}
		return ""
	}
	inFlight, inFlightMarked, maybe := 0, 0, 0
	for _, k := range keys {
		switch leave(k) {
		case "in flight":
			inFlight++
			if k.MaybeProcessed && !bulk.maybeProcessed {
				inFlightMarked++
			}
		case "maybe processed":
			maybe++
		}
	}
	if !bulk.yes {
		forced, marked := 0, 0
		for _, k := range keys {
			if leave(k) == "" {
				fmt.Fprintf(stdout, "%s\n", k.raw) // what --yes would forget
				if k.State == "processing" {
					forced++
				}
				if k.MaybeProcessed {
					marked++
				}
			}
		}
		plan := fmt.Sprintf("would forget %d", len(keys)-inFlight-maybe)
		if forced > 0 {
			plan += fmt.Sprintf(", %d of them in flight (--force)", forced)
		}
		if marked > 0 {
			plan += fmt.Sprintf(", %d of them maybe processed (--include-maybe-processed)", marked)
		}
		switch {
		case inFlightMarked > 0:
			plan += fmt.Sprintf(" and skip %d in flight (add --force to forget those too; %d of them are marked maybe_processed and need --include-maybe-processed as well)", inFlight, inFlightMarked)
		case inFlight > 0:
			plan += fmt.Sprintf(" and skip %d in flight (add --force to forget those too)", inFlight)
		}
		if maybe > 0 {
			plan += fmt.Sprintf(" and keep %d maybe processed: the application may have processed them, check them there (keys list … | jq 'select(.maybe_processed)'; add --include-maybe-processed to forget those too)", maybe)
		}
		fmt.Fprintf(stderr, "dedupgw keys forget: listed %d key(s) of route %s: %s. Nothing was forgotten: run again with --yes.\n", len(keys), route, plan)
		return exitOK
	}
	var forgotten, forcedForgotten, skipped, kept, changed, gone, failed int
	for _, k := range keys {
		switch leave(k) {
		case "in flight":
			skipped++
			hint := "use --force"
			if k.MaybeProcessed && !bulk.maybeProcessed {
				hint = "use --force; it is marked maybe_processed too: --include-maybe-processed"
			}
			fmt.Fprintf(stdout, "skipped %s/%s: in flight (%s)\n", route, k.Key, hint)
			continue
		case "maybe processed":
			kept++
			fmt.Fprintf(stdout, "kept %s/%s: maybe processed (check it in the application; use --include-maybe-processed)\n", route, k.Key)
			continue
		}
		// Forgotten only in the state listed: a key settled otherwise since
		// (a failed one processed by its retry) is left alone, and so is
		// one a retry's cut forward marked maybe_processed since.
		target := base + "/v1/keys/" + pathSegment(route) + "/" + pathSegment(k.Key) + "?state=" + url.QueryEscape(k.State)
		if k.State == "processing" { // and --force: forced only as listed
			target += "&force=true"
		}
		if !bulk.maybeProcessed {
			target += "&keep_maybe_processed=true"
		}
		code, body, err := adminCall(http.MethodDelete, target, 1<<20)
		switch {
		case err != nil:
			failed++
			fmt.Fprintf(stderr, "dedupgw keys: %s/%s: %v\n", route, k.Key, err)
		case code/100 == 2:
			forgotten++
			if k.State == "processing" {
				forcedForgotten++
			}
			fmt.Fprintf(stdout, "forgot %s/%s\n", route, k.Key)
		case code == http.StatusNotFound:
			gone++
			fmt.Fprintf(stdout, "not found anymore %s/%s\n", route, k.Key)
		case code == http.StatusConflict && strings.Contains(string(body), "state-changed"):
			changed++
			fmt.Fprintf(stdout, "left %s/%s: changed since the listing (%s)\n", route, k.Key, detail(body))
		case code == http.StatusConflict:
			skipped++
			fmt.Fprintf(stdout, "skipped %s/%s: in flight since the listing (use --force)\n", route, k.Key)
		case code == http.StatusUnauthorized:
			fmt.Fprint(stderr, msgUnauthorized())
			return exitFail
		default:
			failed++
			fmt.Fprintf(stderr, "dedupgw keys: DELETE %s: %d (%s)\n", target, code, detail(body))
		}
	}
	summary := fmt.Sprintf("forgotten %d, skipped %d (in flight), changed since the listing %d, not found anymore %d", forgotten, skipped, changed, gone)
	if kept > 0 {
		summary += fmt.Sprintf(", kept %d (maybe processed)", kept)
	}
	if failed > 0 {
		summary += fmt.Sprintf(", failed %d", failed)
	}
	fmt.Fprintln(stdout, summary)
	if forcedForgotten > 0 {
		fmt.Fprintln(stdout, "(forced: a delivery in flight, if any, will not be recorded when it finishes; a copy of it will be forwarded again)")
	}
	if skipped > 0 || kept > 0 || changed > 0 || failed > 0 {
		return exitFail
	}
	return exitOK
}

// checkListArgs reports a usage problem of "keys list" or a bulk "keys
// forget", or "" when there is none.
func checkListArgs(f listFilters) string {
	if f.limit < 0 {
		return fmt.Sprintf("--limit %d: want a number of keys, or 0 for all", f.limit)
	}
	for s := range strings.SplitSeq(f.state, ",") {
		switch strings.TrimSpace(s) {
		case "", "processing", "processed", "failed":
		default:
			return fmt.Sprintf("--state %s: want processing, processed or failed (comma-separated for several)", s)
		}
	}
	return ""
}
