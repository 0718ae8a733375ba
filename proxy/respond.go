package proxy

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

// Header names the gateway reads or writes.
const (
	// HeaderDedupStatus tells the sender what the gateway did with a delivery:
	// forwarded, duplicate, in-flight, unkeyed, rejected or store-error.
	HeaderDedupStatus = "Dedup-Status"
	// HeaderDedupKey carries "<namespace>:<key>" to the upstream, which may use
	// it as its own idempotency key; a key that is not a valid header value,
	// longer than 256 bytes or starting with "sha256:" is sent as
	// "<namespace>:sha256:<hex>" (see dedupKeyHeader). A sender's own
	// Dedup-Key is dropped.
	HeaderDedupKey = "Dedup-Key"
)

// Values of the Dedup-Status header.
const (
	statusForwarded  = "forwarded"
	statusDuplicate  = "duplicate"
	statusInFlight   = "in-flight"
	statusUnkeyed    = "unkeyed"
	statusRejected   = "rejected"
	statusStoreError = "store-error"
)

// ProblemTypePrefix prefixes the type URI of every problem the gateway
// writes, on its webhook listener and its admin API.
const ProblemTypePrefix = "urn:dedupgw:problem:"

// ProblemTypeNoRoute is the type of the problem the webhook listener
// answers a path no route takes with. The admin API never sends it, so a
// client of the admin API can tell it was pointed at the wrong listener.
const ProblemTypeNoRoute = ProblemTypePrefix + "no-route"

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Route names the matched route, when there is one.
	Route string `json:"route,omitempty"`
	// RetryAfter repeats the Retry-After header in seconds, when sent.
	RetryAfter int `json:"retry_after,omitempty"`
}

// The problems the gateway answers with. Each kind has a fixed status and title.
var (
	probBadQuery       = problem{Type: ProblemTypePrefix + "invalid-query", Title: "Query parameter not understood", Status: http.StatusBadRequest}
	probBadPath        = problem{Type: ProblemTypePrefix + "invalid-path", Title: "Request path not in canonical form", Status: http.StatusBadRequest}
	probNoRoute        = problem{Type: ProblemTypeNoRoute, Title: "No route for this path", Status: http.StatusNotFound}
	probMethod         = problem{Type: ProblemTypePrefix + "method-not-allowed", Title: "Method not allowed", Status: http.StatusMethodNotAllowed}
	probBodyTooLarge   = problem{Type: ProblemTypePrefix + "body-too-large", Title: "Request body too large", Status: http.StatusRequestEntityTooLarge}
	probBodyTimeout    = problem{Type: ProblemTypePrefix + "body-timeout", Title: "Request body not received in time", Status: http.StatusRequestTimeout}
	probBodyUnread     = problem{Type: ProblemTypePrefix + "body-unreadable", Title: "Request body could not be read", Status: http.StatusBadRequest}
	probSignature      = problem{Type: ProblemTypePrefix + "invalid-signature", Title: "Signature missing, invalid or stale", Status: http.StatusUnauthorized}
	probMissingKey     = problem{Type: ProblemTypePrefix + "missing-key", Title: "Deduplication key missing or invalid", Status: http.StatusBadRequest}
	probKeyReused      = problem{Type: ProblemTypePrefix + "key-reused", Title: "Deduplication key reused with a different payload", Status: http.StatusUnprocessableEntity}
	probInFlight       = problem{Type: ProblemTypePrefix + "in-flight", Title: "A delivery with this key is being processed", Status: http.StatusConflict}
	probStateChanged   = problem{Type: ProblemTypePrefix + "state-changed", Title: "The key is not in the state the request names", Status: http.StatusConflict}
	probStoreError     = problem{Type: ProblemTypePrefix + "store-unavailable", Title: "Dedup store unavailable", Status: http.StatusServiceUnavailable}
	probBadGateway     = problem{Type: ProblemTypePrefix + "upstream-unreachable", Title: "Upstream unreachable", Status: http.StatusBadGateway}
	probTimeout        = problem{Type: ProblemTypePrefix + "upstream-timeout", Title: "Upstream timed out", Status: http.StatusGatewayTimeout}
	probShuttingDown   = problem{Type: ProblemTypePrefix + "shutting-down", Title: "Gateway shutting down", Status: http.StatusServiceUnavailable}
	probKeyNotFound    = problem{Type: ProblemTypePrefix + "key-not-found", Title: "Key not found", Status: http.StatusNotFound}
	probNotFound       = problem{Type: ProblemTypePrefix + "not-found", Title: "Not found", Status: http.StatusNotFound}
	probUnknownRoute   = problem{Type: ProblemTypePrefix + "unknown-route", Title: "Unknown route", Status: http.StatusNotFound}
	probHostNotAllowed = problem{Type: ProblemTypePrefix + "host-not-allowed", Title: "Host not allowed", Status: http.StatusForbidden}
	probUnauthorized   = problem{Type: ProblemTypePrefix + "unauthorized", Title: "Missing or wrong bearer token", Status: http.StatusUnauthorized}
	probDraining       = problem{Type: ProblemTypePrefix + "draining", Title: "Gateway draining", Status: http.StatusServiceUnavailable, Detail: "the gateway is shutting down"}
	probNotReady       = problem{Type: ProblemTypePrefix + "not-ready", Title: "Dedup store not ready", Status: http.StatusServiceUnavailable}
)

// retryLaterSeconds is the Retry-After of store errors and shutdown answers.
const retryLaterSeconds = 5

// with returns a copy of p carrying detail and route.
func (p problem) with(route, detail string) problem {
	p.Route = route
	p.Detail = detail
	return p
}

// writeProblem writes p as application/problem+json. A positive retryAfter
// also sets the Retry-After header (seconds).
func writeProblem(w http.ResponseWriter, p problem, retryAfter int) {
	h := w.Header()
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
		p.RetryAfter = retryAfter
	}
	writeJSON(w, p.Status, "application/problem+json", p)
}

// writeJSON writes v as JSON with status and content type.
func writeJSON(w http.ResponseWriter, status int, contentType string, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only plain data is written here; cannot happen
		status = http.StatusInternalServerError
		b = []byte(`{"status":"error"}`)
	}
	h := w.Header()
	h["Content-Type"] = headerValue(contentType)
	h["Content-Length"] = []string{strconv.Itoa(len(b) + 1)}
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(status)
	_, _ = w.Write(b) // the sender may be gone; nothing left to do
	_, _ = w.Write(newline)
}

// writeJSONLine writes line, JSON already followed by its newline, as
// writeJSON writes a value: the same headers, status and bytes.
func writeJSONLine(w http.ResponseWriter, status int, line []byte) {
	h := w.Header()
	h["Content-Type"] = jsonType
	h["Content-Length"] = []string{strconv.Itoa(len(line))}
	h["X-Content-Type-Options"] = nosniff
	w.WriteHeader(status)
	_, _ = w.Write(line) // the sender may be gone; nothing left to do
}

// Header values shared by every answer: net/http only reads them, and an
// Add to one of their names appends to a full slice, so into a new array.
var (
	nosniff         = []string{"nosniff"}
	jsonType        = []string{"application/json"}
	problemJSONType = []string{"application/problem+json"}
	newline         = []byte{'\n'}

	dedupStatusValues = map[string][]string{
		statusForwarded:  {statusForwarded},
		statusDuplicate:  {statusDuplicate},
		statusInFlight:   {statusInFlight},
		statusUnkeyed:    {statusUnkeyed},
		statusRejected:   {statusRejected},
		statusStoreError: {statusStoreError},
	}
)

// setDedupStatus sets the Dedup-Status header to status, one of the status
// constants, as h.Set would, without allocating its value.
func setDedupStatus(h http.Header, status string) {
	v, ok := dedupStatusValues[status]
	if !ok {
		v = []string{status}
	}
	h[HeaderDedupStatus] = v[:1:1]
}

// headerValue returns a shared value slice for the common content types.
func headerValue(v string) []string {
	switch v {
	case "application/json":
		return jsonType
	case "application/problem+json":
		return problemJSONType
	}
	return []string{v}
}

// duplicateBody is the 200 answer to a duplicate on duplicate_response: ack.
type duplicateBody struct {
	Status    string    `json:"status"`
	Route     string    `json:"route"`
	Key       string    `json:"key"`
	FirstSeen time.Time `json:"first_seen"`
}

// writeDuplicate answers a duplicate: the stored upstream response when the
// route replays and one was stored, else the small JSON acknowledgement
// naming key (the key as the sender gave it). It returns the status written.
func writeDuplicate(w http.ResponseWriter, rt *route, key string, rec dedup.Record) int {
	if rt.DuplicateResponse == Replay && rec.Response != nil && rec.Response.Status >= 200 && rec.Response.Status < 300 {
		h := w.Header()
		for name, vals := range rec.Response.Header {
			h[http.CanonicalHeaderKey(name)] = append([]string(nil), vals...)
		}
		if _, ok := h["Content-Type"]; !ok {
			h["Content-Type"] = nil // as forwarded: no sniffed type added
		}
		setDedupStatus(h, statusDuplicate)
		h.Set("Content-Length", strconv.Itoa(len(rec.Response.Body)))
		w.WriteHeader(rec.Response.Status)
		_, _ = w.Write(rec.Response.Body)
		return rec.Response.Status
	}
	setDedupStatus(w.Header(), statusDuplicate)
	ack := duplicateBody{
		Status:    "duplicate",
		Route:     rt.Name,
		Key:       key,
		FirstSeen: rec.FirstSeen.UTC(),
	}
	if line, ok := appendDuplicateAck(nil, ack); ok {
		writeJSONLine(w, http.StatusOK, line)
	} else {
		writeJSON(w, http.StatusOK, "application/json", ack)
	}
	return http.StatusOK
}

// appendDuplicateAck appends ack as json.Marshal encodes it, followed by a
// newline, without reflection. It reports false, and json.Marshal must be
// used, when a string would need escaping (a byte outside printable ASCII,
// or one of " \ < > &) or the time has no RFC 3339 form.
func appendDuplicateAck(b []byte, ack duplicateBody) ([]byte, bool) {
	if !plainJSONString(ack.Status) || !plainJSONString(ack.Route) || !plainJSONString(ack.Key) {
		return b, false
	}
	if b == nil {
		b = make([]byte, 0, len(`{"status":"","route":"","key":"","first_seen":""}`)+
			len(ack.Status)+len(ack.Route)+len(ack.Key)+len(time.RFC3339Nano)+1)
	}
	start := len(b)
	b = append(b, `{"status":"`...)
	b = append(b, ack.Status...)
	b = append(b, `","route":"`...)
	b = append(b, ack.Route...)
	b = append(b, `","key":"`...)
	b = append(b, ack.Key...)
	b = append(b, `","first_seen":"`...)
	b, err := ack.FirstSeen.AppendText(b) // what Time.MarshalJSON quotes
	if err != nil {
		return b[:start], false
	}
	b = append(b, `"}`...)
	b = append(b, '\n')
	return b, true
}

// plainJSONString reports whether json.Marshal encodes s as s in quotes:
// printable ASCII without '"', '\\' and the HTML characters it escapes.
func plainJSONString(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// retryAfterSeconds is the Retry-After for a key whose lease ends at until:
// the whole seconds left, at least 1.
func retryAfterSeconds(now, until time.Time, lease time.Duration) int {
	left := lease
	if !until.IsZero() {
		left = until.Sub(now)
	}
	s := int(math.Ceil(left.Seconds()))
	if s < 1 {
		return 1
	}
	return s
}

// decodedReplayMin is the least a gzip answer is decompressed to for a
// sender that does not accept gzip (see replayFor); the route's
// max_replay_bytes, when larger, is the bound instead.
const decodedReplayMin = 1 << 20

// replayFor returns stored, an answer stored for replay, as the sender whose
// Accept-Encoding values are accept may take it:
//   - stored itself when it has no Content-Encoding (or identity), or the
//     sender accepts the coding, as the first sender did: the upstream saw
//     that sender's Accept-Encoding;
//   - a copy decompressed, without its Content-Encoding, when it is gzip and
//     the sender does not accept gzip (curl without --compressed, say) and
//     it decompresses to at most limit bytes (max_replay_bytes, at least
//     decodedReplayMin);
//   - nil otherwise (another coding, several, or a broken or larger gzip
//     stream): the sender gets the JSON ack, as for an answer too large to
//     store, rather than bytes it said it cannot read.
//
// A sender without Accept-Encoding is taken to accept identity only, as
// servers in practice treat it, although RFC 9110 lets it mean any coding.
// stored is never changed: a store may share it.
func replayFor(stored *dedup.Response, accept []string, limit int64) *dedup.Response {
	codings := stored.Header["Content-Encoding"]
	if len(codings) == 0 {
		return stored
	}
	var list []string
	for _, v := range codings {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				list = append(list, c)
			}
		}
	}
	if len(list) == 0 || !slices.ContainsFunc(list, func(c string) bool { return !acceptsCoding(accept, c) }) {
		return stored
	}
	if len(list) != 1 || list[0] != "gzip" && list[0] != "x-gzip" {
		return nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(stored.Body))
	if err != nil {
		return nil
	}
	limit = max(limit, decodedReplayMin)
	body, err := io.ReadAll(io.LimitReader(zr, limit+1))
	if err != nil || int64(len(body)) > limit {
		return nil
	}
	h := make(map[string][]string, len(stored.Header))
	for name, vals := range stored.Header {
		if name != "Content-Encoding" {
			h[name] = vals
		}
	}
	return &dedup.Response{Status: stored.Status, Header: h, Body: body}
}

// acceptsCoding reports whether accept, a request's Accept-Encoding values,
// admits the content coding coding (lower case): named with a non-zero
// weight, or covered by "*" with one. gzip and x-gzip are one coding. No
// value at all admits none.
func acceptsCoding(accept []string, coding string) bool {
	alias := coding
	switch coding {
	case "gzip":
		alias = "x-gzip"
	case "x-gzip":
		alias = "gzip"
	}
	star := false
	for _, v := range accept {
		for item := range strings.SplitSeq(v, ",") {
			name, params, _ := strings.Cut(item, ";")
			name = strings.TrimSpace(name)
			switch {
			case strings.EqualFold(name, coding), strings.EqualFold(name, alias):
				return !zeroWeight(params)
			case name == "*":
				star = !zeroWeight(params)
			}
		}
	}
	return star
}

// zeroWeight reports whether params, what follows a coding's ";" in
// Accept-Encoding, set its weight to zero ("q=0", "q=0.000"): not
// acceptable. A weight that does not parse counts as non-zero.
func zeroWeight(params string) bool {
	for p := range strings.SplitSeq(params, ";") {
		name, val, ok := strings.Cut(p, "=")
		if !ok || !strings.EqualFold(strings.TrimSpace(name), "q") {
			continue
		}
		q, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		return err == nil && q == 0
	}
	return false
}
