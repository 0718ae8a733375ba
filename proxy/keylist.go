package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

// keyList is the JSON body of GET /v1/keys/{route}: one page of keys, each
// as GET /v1/keys/{route}/{key} shows it, and the cursor of the next page
// ("" on the last).
type keyList struct {
	Keys []keyRecord `json:"keys"`
	Next string      `json:"next"`
}

// listParams are the query parameters GET /v1/keys/{route} takes; any
// other is refused, so a misspelt filter ("stat=failed") cannot widen a
// listing (and a bulk forget built on it) to every key.
var listParams = []string{"state", "since", "until", "limit", "cursor"}

// listKeys answers GET /v1/keys/{route}:
//
//	state=S     processing, processed or failed; repeated or comma-separated
//	            for several; absent means every state
//	since=T     keys at or after T, until=T keys before T: T is RFC 3339
//	            (2026-12-01T10:00:00Z) or a Go duration meaning that long
//	            ago (1h, 90m); a settled key is placed by completed_at, one
//	            in flight by first_seen
//	limit=N     at most N keys (1 to 1000, default 100)
//	cursor=C    the "next" of the previous page
//
// A page may hold fewer keys than the limit, even none, before the last
// one: follow "next" until it is "". A bad value answers 400 invalid-query
// naming the parameter.
func (a *admin) listKeys(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("route")
	rt := a.g.routes.Load().byName[name]
	if rt == nil {
		writeProblem(w, probUnknownRoute.with(name, "no route has this name"), 0)
		return
	}
	opts, err := parseListQuery(r.URL.Query(), a.g.now())
	if err != nil {
		writeProblem(w, probBadQuery.with(rt.Name, err.Error()), 0)
		return
	}
	page, err := a.store.List(r.Context(), rt.Namespace, opts)
	switch {
	case errors.Is(err, dedup.ErrBadCursor):
		writeProblem(w, probBadQuery.with(rt.Name, "cursor: "+strings.TrimPrefix(err.Error(), "dedup: ")+"; pass the \"next\" of the previous page, with the same route, or start without a cursor"), 0)
		return
	case err != nil:
		a.log.Warn("keys API: list failed", zap.String("route", rt.Name), zap.Error(err))
		writeProblem(w, probStoreError.with(rt.Name, "the dedup store did not answer"), retryLaterSeconds)
		return
	}
	out := keyList{Keys: make([]keyRecord, 0, len(page.Entries)), Next: page.Next}
	for _, e := range page.Entries {
		out.Keys = append(out.Keys, keyRecord{Route: rt.Name, Namespace: rt.Namespace, Key: e.ID, Record: e.Record})
	}
	writeJSON(w, http.StatusOK, "application/json", out)
}

// parseListQuery turns GET /v1/keys/{route}'s query into ListOptions; now
// resolves durations. Its errors name the parameter.
func parseListQuery(q url.Values, now time.Time) (dedup.ListOptions, error) {
	var opts dedup.ListOptions
	for name := range q {
		if !slices.Contains(listParams, name) {
			return opts, fmt.Errorf("%s: unknown parameter; the listing takes %s", clipForLog(name), strings.Join(listParams, ", "))
		}
	}
	for _, v := range q["state"] {
		for s := range strings.SplitSeq(v, ",") {
			st := dedup.State(strings.TrimSpace(s))
			switch st {
			case dedup.StateProcessing, dedup.StateProcessed, dedup.StateFailed:
			default:
				return opts, fmt.Errorf("state=%s: want processing, processed or failed", clipForLog(s))
			}
			if !slices.Contains(opts.States, st) {
				opts.States = append(opts.States, st)
			}
		}
	}
	var err error
	if opts.Since, err = parseListTime(q, "since", now); err != nil {
		return opts, err
	}
	if opts.Until, err = parseListTime(q, "until", now); err != nil {
		return opts, err
	}
	if !opts.Since.IsZero() && !opts.Until.IsZero() && !opts.Since.Before(opts.Until) {
		return opts, fmt.Errorf("since=%s, until=%s: since must be before until", opts.Since.Format(time.RFC3339Nano), opts.Until.Format(time.RFC3339Nano))
	}
	if v, ok := single(q, "limit"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > dedup.MaxListLimit {
			return opts, fmt.Errorf("limit=%s: want a whole number from 1 to %d", clipForLog(v), dedup.MaxListLimit)
		}
		opts.Limit = n
	}
	opts.Cursor, _ = single(q, "cursor")
	for _, name := range []string{"since", "until", "limit", "cursor"} {
		if len(q[name]) > 1 {
			return opts, fmt.Errorf("%s: given %d times, want once", name, len(q[name]))
		}
	}
	return opts, nil
}

// single returns the query's value of name, ok false when absent or empty.
func single(q url.Values, name string) (string, bool) {
	v := q.Get(name)
	return v, v != ""
}

// parseListTime reads since or until: RFC 3339, or a positive Go duration
// meaning that long before now. Absent means the zero time.
func parseListTime(q url.Values, name string, now time.Time) (time.Time, error) {
	v, ok := single(q, name)
	if !ok {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%s=%s: want an RFC 3339 time (2026-12-01T10:00:00Z) or a positive duration meaning that long ago (1h, 90m)", name, clipForLog(v))
}
