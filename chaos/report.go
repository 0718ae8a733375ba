package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// FaultKind names a fault the suite injects.
type FaultKind string

// The faults the suite injects.
const (
	// FaultKill is kill -9 of a replica, restarted at once on the same store.
	FaultKill FaultKind = "kill-9"
	// FaultTerm is SIGTERM during traffic (graceful drain), then a restart.
	FaultTerm FaultKind = "sigterm"
	// FaultRedisStop stops Redis and starts it again after a while.
	FaultRedisStop FaultKind = "redis-stop"
	// FaultRedisSlow delays every chunk between the gateways and Redis.
	FaultRedisSlow FaultKind = "redis-slow"
)

// Fault is one injected fault as it happened.
type Fault struct {
	Kind FaultKind
	// Replica is the replica's Name for kill and term, empty for Redis.
	Replica string
	// Addr is the replica's delivery address (X-Forwarded-Host upstream).
	Addr string
	// Incarnation is the replica's process that a kill or term ended (see
	// IncarnationPlaceholder); 0 when unknown.
	Incarnation int
	// Start is when the fault began (signal sent, Redis stopped, delay set);
	// End when it was over (replica healthy again, Redis answering, delay
	// removed).
	Start, End time.Time
	// Drain is how long a SIGTERM'd replica took to exit.
	Drain time.Duration
	// Err is set when the fault could not be injected or recovered from
	// cleanly (a replica that did not drain, did not restart…).
	Err error
}

// Cause explains a duplicate the upstream processed.
type Cause string

// Causes of forwarded duplicates. CauseCrash, CauseStoreDown and
// CauseTimeoutCut are documented limits (DESIGN.md and README "Honest
// limits").
const (
	// CauseCrash: the replica that forwarded an earlier copy was killed
	// between the upstream's 2xx and its commit, so the key stayed
	// processing until its lease expired (or, with bolt, until the restart).
	CauseCrash Cause = "crash"
	// CauseStoreDown: a copy was forwarded while the store was unreachable
	// (fail open), or its commit could not be written, and the gateway said
	// so (Dedup-Status: store-error, or a log line for the key).
	CauseStoreDown Cause = "store-down"
	// CauseLeaseOverrun: the gateway logged that the key's lease ended
	// before an attempt's commit (a stalled host or a store slower than
	// lease − upstream_timeout), so another copy could claim the key. The
	// gateway detects it, but DESIGN.md does not list it as a limit.
	CauseLeaseOverrun Cause = "lease-overrun"
	// CauseTimeoutCut: the earlier processing happened while the gateway
	// was cutting that copy's forward at its deadline (upstream_timeout, or
	// the lease bound after a slow claim): the copy was answered 504 and
	// its key released although the application had processed it, so a
	// retry was forwarded again. A documented limit (README "Honest
	// limits": a timed-out forward may still have been processed).
	CauseTimeoutCut Cause = "timeout-cut"
	// CauseUnexplained: none of the above. Every one is a bug.
	CauseUnexplained Cause = "unexplained"
)

// Duplicate is one extra time the upstream processed an event.
type Duplicate struct {
	ID    string
	Cause Cause
	// First and This are the earlier processing and this one.
	First, This Processing
	// Note says which fault explains it, or what was nearest.
	Note string
}

// LogLine is the part of a gateway's JSON log line the suite reads.
type LogLine struct {
	Replica string
	TS      time.Time
	Level   string
	Msg     string
	Route   string
	Key     string
	Outcome string
	Raw     map[string]any
}

// GatewayLog is what a replica's log says.
type GatewayLog struct {
	Lines []LogLine
	// Outcomes counts delivery lines by outcome.
	Outcomes map[string]int
	// Levels counts lines by level.
	Levels map[string]int
	// Trouble holds lines that should not be there: anything that is not a
	// JSON log line (panics, data races, a library printing on its own: the
	// configured format is json), and dpanic/panic/fatal lines. At most
	// maxTrouble lines are kept; NonJSON counts them all.
	Trouble []string
	NonJSON int
}

// maxTrouble bounds the trouble lines kept per log.
const maxTrouble = 10

// ParseLog reads a gateway log written by Gateway (zap JSON lines plus
// anything the process printed outside the logger).
func ParseLog(replica string, r io.Reader) (*GatewayLog, error) {
	gl := &GatewayLog{Outcomes: map[string]int{}, Levels: map[string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) != nil {
			gl.NonJSON++
			if len(gl.Trouble) < maxTrouble {
				gl.Trouble = append(gl.Trouble, replica+": not a JSON log line: "+line)
			}
			continue
		}
		if _, ok := m["chaos"]; ok {
			continue
		}
		l := LogLine{Replica: replica, Raw: m}
		l.TS = parseTS(m["ts"])
		l.Level, _ = m["level"].(string)
		l.Msg, _ = m["msg"].(string)
		l.Route, _ = m["route"].(string)
		l.Key, _ = m["key"].(string)
		l.Outcome, _ = m["outcome"].(string)
		gl.Levels[l.Level]++
		if l.Outcome != "" {
			gl.Outcomes[l.Outcome]++
		}
		if (l.Level == "dpanic" || l.Level == "panic" || l.Level == "fatal") && len(gl.Trouble) < maxTrouble {
			gl.Trouble = append(gl.Trouble, replica+": "+line)
		}
		gl.Lines = append(gl.Lines, l)
	}
	return gl, sc.Err()
}

// parseTS accepts zap's epoch seconds (float) and ISO 8601 strings.
func parseTS(v any) time.Time {
	switch ts := v.(type) {
	case float64:
		sec := int64(ts)
		return time.Unix(sec, int64((ts-float64(sec))*1e9))
	case string:
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.000Z0700"} {
			if t, err := time.Parse(layout, ts); err == nil {
				return t
			}
		}
		if f, err := strconv.ParseFloat(ts, 64); err == nil {
			return parseTS(f)
		}
	}
	return time.Time{}
}

// ReadLogFile parses the log file at path.
func ReadLogFile(replica, path string) (*GatewayLog, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open gateway log: %w", err)
	}
	defer f.Close()
	return ParseLog(replica, f)
}

// KeyState is the final state of one key as /v1/keys reported it.
type KeyState struct {
	// State is processing, processed, failed, or "absent" for a 404.
	State      string
	LeaseUntil time.Time
}

// Report is the outcome of one run: the figures of the summary table and the
// evidence behind them.
type Report struct {
	Name     string
	Backend  string
	Replicas int
	Duration time.Duration

	Events         int
	Deliveries     int // HTTP attempts
	Retries        int
	DuplicatesSent int // provider copies beyond the first of each event
	Lost           []string
	Duplicates     []Duplicate
	P50, P99       time.Duration
	Faults         []Fault
	// StoreErrorAnswers counts answers with Dedup-Status: store-error.
	StoreErrorAnswers int
	// DedupStatuses counts answers by Dedup-Status.
	DedupStatuses map[string]int
	// Statuses counts answers by HTTP status; 0 counts transport errors.
	Statuses map[int]int
	// Stuck lists keys still processing after every delivery ended and one
	// lease passed.
	Stuck []string
	// KeyStates counts final key states.
	KeyStates map[string]int
	App       AppStats
	// Logs counts delivery log lines by outcome, over all replicas.
	LogOutcomes map[string]int
	// Gauges describes each replica's goroutines and descriptors, fresh and
	// after the run.
	Gauges []string
	// Trouble are crash-looking lines from the gateways' output and exits
	// nobody asked for.
	Trouble []string
}

// ByCause counts duplicates per cause.
func (r *Report) ByCause() map[Cause]int {
	m := map[Cause]int{}
	for _, d := range r.Duplicates {
		m[d.Cause]++
	}
	return m
}

// FaultErrors lists faults that did not go as planned.
func (r *Report) FaultErrors() []string {
	var out []string
	for _, f := range r.Faults {
		if f.Err != nil {
			out = append(out, fmt.Sprintf("%s %s: %v", f.Kind, f.Replica, f.Err))
		}
	}
	return out
}

// Analysis holds the raw material Analyze turns into a Report.
type Analysis struct {
	Events    []*Event
	Processed map[string][]Processing
	Faults    []Fault
	Logs      []*GatewayLog
	// UpstreamTimeout and Lease are the run's settings; they size the
	// windows in which a fault can explain a duplicate.
	UpstreamTimeout, Lease time.Duration
}

// Analyze fills the figures of r from a.
func Analyze(r *Report, a Analysis) {
	r.Events = len(a.Events)
	r.DedupStatuses = map[string]int{}
	r.Statuses = map[int]int{}
	r.LogOutcomes = map[string]int{}
	var lat []time.Duration
	storeErr := map[string]bool{}
	// acked is when each event first got a 2xx "forwarded" answer. The
	// gateway commits before it answers, so from then on the key is
	// processed in the store, and no crash can explain a re-processing.
	acked := map[string]time.Time{}
	// cut lists each event's attempts the gateway answered 504 after
	// forwarding them: forwards cut at their deadline.
	cut := map[string][]Attempt{}
	for _, ev := range a.Events {
		r.Deliveries += len(ev.Attempts)
		r.Retries += ev.Retries
		r.DuplicatesSent += ev.Copies - 1
		for _, at := range ev.Attempts {
			r.Statuses[at.Answer.Status]++
			if at.Answer.Status == 504 && at.Answer.DedupStatus == "forwarded" {
				cut[ev.ID] = append(cut[ev.ID], at)
			}
			if at.Answer.Status != 0 {
				lat = append(lat, at.Latency)
			}
			if at.Answer.Status/100 == 2 && at.Answer.DedupStatus == "forwarded" {
				end := at.At.Add(at.Latency)
				if t, ok := acked[ev.ID]; !ok || end.Before(t) {
					acked[ev.ID] = end
				}
			}
			if s := at.Answer.DedupStatus; s != "" {
				r.DedupStatuses[s]++
				if s == "store-error" {
					r.StoreErrorAnswers++
					storeErr[ev.ID] = true
				}
			}
		}
		if len(a.Processed[ev.ID]) == 0 {
			r.Lost = append(r.Lost, ev.ID)
		}
	}
	r.P50, r.P99 = percentile(lat, 0.50), percentile(lat, 0.99)

	// Log evidence: a store-error outcome, or any warning or error that
	// names the key (a failed commit, say).
	logged := map[string]bool{}
	overrun := map[string]bool{}
	for _, gl := range a.Logs {
		for k, n := range gl.Outcomes {
			r.LogOutcomes[k] += n
		}
		r.Trouble = append(r.Trouble, gl.Trouble...)
		for _, l := range gl.Lines {
			if l.Key == "" {
				continue
			}
			if storeTrouble(l) {
				logged[keyID(l.Key)] = true
			}
			if leaseOverrun(l) {
				overrun[keyID(l.Key)] = true
			}
		}
	}

	ids := make([]string, 0, len(a.Processed))
	for id := range a.Processed {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		ps := a.Processed[id]
		for j := 1; j < len(ps); j++ {
			d := Duplicate{ID: id, First: ps[j-1], This: ps[j]}
			d.Cause, d.Note = explain(ps[:j+1], a, storeErr[id] || logged[id], acked[id])
			if d.Cause == CauseUnexplained && overrun[id] {
				d.Cause = CauseLeaseOverrun
				d.Note = "the gateway logged a lease that ended before the commit; " + d.Note
			}
			if d.Cause == CauseUnexplained {
				for _, at := range cut[id] {
					if cutExplains(at, d.First, d.This) {
						d.Cause = CauseTimeoutCut
						d.Note = fmt.Sprintf("the copy sent at %s was processed at %s and answered 504 after %s (its forward cut at its deadline); ",
							clock(at.At), clock(d.First.At), at.Latency.Round(time.Millisecond)) + d.Note
						break
					}
				}
			}
			r.Duplicates = append(r.Duplicates, d)
		}
	}
}

// cutExplains reports whether at, an attempt answered 504 after its forward
// was cut, explains processing this after first: first happened during at
// through the replica at went to, and this came once at's key was released
// (the release precedes the 504, so a little before the answer arrived).
func cutExplains(at Attempt, first, this Processing) bool {
	end := at.At.Add(at.Latency)
	if first.At.Before(at.At) || first.At.After(end) || this.At.Before(end.Add(-cutReleaseSlack)) {
		return false
	}
	u, err := url.Parse(at.Answer.Target)
	return err == nil && (first.Via == "" || u.Host == first.Via)
}

// cutReleaseSlack is how long before a cut copy's 504 reached its sender
// another copy may already have claimed the released key.
const cutReleaseSlack = 20 * time.Millisecond

// storeTrouble reports whether a log line says the store failed for its key:
// a store_error outcome, or a warning or error about the store, a commit, a
// release or a lease. Upstream failures are not store trouble.
func storeTrouble(l LogLine) bool {
	if l.Outcome == "store_error" {
		return true
	}
	if l.Level != "warn" && l.Level != "error" {
		return false
	}
	m := strings.ToLower(l.Msg)
	for _, w := range []string{"store", "commit", "release", "lease"} {
		if strings.Contains(m, w) {
			return true
		}
	}
	return false
}

// leaseOverrun reports whether a log line says an attempt's lease ended
// before its commit or release.
func leaseOverrun(l LogLine) bool {
	m := strings.ToLower(l.Msg)
	return strings.Contains(m, "lease expired before") || strings.Contains(m, "lease lost before")
}

// keyID strips a "namespace:" prefix from a logged key, if it has one (the
// simulator's IDs never contain a colon).
func keyID(k string) string {
	if i := strings.LastIndexByte(k, ':'); i >= 0 {
		return k[i+1:]
	}
	return k
}

// explain finds the documented cause of the last processing in ps given the
// earlier ones.
// acked, when not zero, is when the sender got its first 2xx "forwarded"
// answer for the event.
func explain(ps []Processing, a Analysis, storeEvidence bool, acked time.Time) (Cause, string) {
	this := ps[len(ps)-1]
	earlier := ps[:len(ps)-1]
	if !acked.IsZero() && this.At.After(acked) {
		// The commit was done before that answer: only a store that lost
		// it, or fail-open, can explain forwarding the event again.
		if c, note, ok := explainStore(ps, a, storeEvidence); ok {
			return c, note
		}
		return CauseUnexplained, fmt.Sprintf("the sender was answered 2xx forwarded at %s (the commit precedes the answer), yet the upstream processed the event again at %s via %s",
			clock(acked), clock(this.At), this.Via)
	}
	// A crash between an earlier copy's 2xx and its commit: the replica that
	// forwarded it was killed just after the upstream answered.
	for _, f := range a.Faults {
		if f.Kind != FaultKill {
			continue
		}
		for _, p := range earlier {
			if p.Via != "" && f.Addr != "" && p.Via != f.Addr {
				continue
			}
			// Killed at most 2 s after the upstream's 2xx, before the
			// commit that follows it within milliseconds. When the
			// request names the process that forwarded it, that process
			// must be the one killed, and the application may have
			// processed it any time after the kill (a loaded machine
			// schedules it late); otherwise allow 100 ms for that.
			after := f.Start.Before(p.At.Add(2 * time.Second))
			var during bool
			if p.Incarnation > 0 && f.Incarnation > 0 {
				during = p.Incarnation == f.Incarnation
			} else {
				during = !f.Start.Before(p.At.Add(-100 * time.Millisecond))
			}
			if during && after {
				return CauseCrash, fmt.Sprintf("%s of %s at %s, %s after the upstream's 2xx via %s",
					f.Kind, f.Replica, clock(f.Start), f.Start.Sub(p.At).Round(time.Millisecond), p.Via)
			}
		}
	}
	if c, note, ok := explainStore(ps, a, storeEvidence); ok {
		return c, note
	}
	near := "no fault near"
	best := time.Duration(1<<63 - 1)
	for _, f := range a.Faults {
		if d := absDur(this.At.Sub(f.Start)); d < best {
			best = d
			near = fmt.Sprintf("nearest fault: %s %s at %s (%s away)", f.Kind, f.Replica, clock(f.Start), d.Round(time.Millisecond))
		}
	}
	return CauseUnexplained, fmt.Sprintf("first via %s at %s, again via %s at %s; %s",
		earlier[len(earlier)-1].Via, clock(earlier[len(earlier)-1].At), this.Via, clock(this.At), near)
}

// explainStore matches processings to a store outage or slowdown: a copy
// forwarded while the store was down (fail open), or an earlier copy's commit
// that fell into it. It needs the gateway to have said so, in an answer or a
// log line; ok is false when no store fault is near.
func explainStore(ps []Processing, a Analysis, storeEvidence bool) (Cause, string, bool) {
	for _, f := range a.Faults {
		if f.Kind != FaultRedisStop && f.Kind != FaultRedisSlow {
			continue
		}
		from := f.Start.Add(-a.UpstreamTimeout - 500*time.Millisecond)
		to := f.End.Add(time.Second)
		for _, p := range ps {
			if p.At.After(from) && p.At.Before(to) {
				if storeEvidence {
					return CauseStoreDown, fmt.Sprintf("%s %s–%s, store error answered or logged",
						f.Kind, clock(f.Start), clock(f.End)), true
				}
				return CauseUnexplained, fmt.Sprintf("during %s %s–%s but no store error answered or logged",
					f.Kind, clock(f.Start), clock(f.End)), true
			}
		}
	}
	return "", "", false
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func clock(t time.Time) string { return t.Format("15:04:05.000") }

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * q)
	return s[i]
}

// FaultSummary is "kill-9×2 sigterm×1 …" in a fixed order.
func (r *Report) FaultSummary() string {
	n := map[FaultKind]int{}
	for _, f := range r.Faults {
		n[f.Kind]++
	}
	var parts []string
	for _, k := range []FaultKind{FaultKill, FaultTerm, FaultRedisStop, FaultRedisSlow} {
		if n[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s×%d", k, n[k]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// WriteTable writes the summary table of reports, one column per run.
func WriteTable(w io.Writer, reports ...*Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight|tabwriter.Debug)
	row := func(label string, f func(r *Report) string) {
		fmt.Fprintf(tw, "%s\t", label)
		for _, r := range reports {
			fmt.Fprintf(tw, " %s\t", f(r))
		}
		fmt.Fprintln(tw)
	}
	itoa := strconv.Itoa
	row("run", func(r *Report) string { return r.Name })
	row("backend × replicas", func(r *Report) string { return fmt.Sprintf("%s × %d", r.Backend, r.Replicas) })
	row("events", func(r *Report) string { return itoa(r.Events) })
	row("deliveries (HTTP attempts)", func(r *Report) string { return itoa(r.Deliveries) })
	row("retries", func(r *Report) string { return itoa(r.Retries) })
	row("duplicates sent", func(r *Report) string { return itoa(r.DuplicatesSent) })
	row("duplicates forwarded", func(r *Report) string { return itoa(len(r.Duplicates)) })
	for _, c := range []Cause{CauseCrash, CauseStoreDown, CauseTimeoutCut, CauseLeaseOverrun, CauseUnexplained} {
		row("  · "+string(c), func(r *Report) string { return itoa(r.ByCause()[c]) })
	}
	row("events lost", func(r *Report) string { return itoa(len(r.Lost)) })
	row("keys stuck processing", func(r *Report) string { return itoa(len(r.Stuck)) })
	row("p50 / p99 latency", func(r *Report) string {
		return fmt.Sprintf("%s / %s", r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond))
	})
	row("store-error answers", func(r *Report) string { return itoa(r.StoreErrorAnswers) })
	row("upstream 5xx/slow/resets", func(r *Report) string {
		return fmt.Sprintf("%d/%d/%d", r.App.Failed5xx, r.App.SlowAbandoned+r.App.SlowCompleted, r.App.Resets)
	})
	row("faults injected", func(r *Report) string { return r.FaultSummary() })
	row("wall time", func(r *Report) string { return r.Duration.Round(100 * time.Millisecond).String() })
	return tw.Flush()
}

// Details returns a multi-line account of everything a reader needs to chase
// a failed invariant: faults with times, duplicates with causes, lost events.
func (r *Report) Details() string {
	var b strings.Builder
	fmt.Fprintf(&b, "run %s: answers by status %v, by Dedup-Status %v, log outcomes %v, final key states %v\n",
		r.Name, r.Statuses, r.DedupStatuses, r.LogOutcomes, r.KeyStates)
	fmt.Fprintf(&b, "upstream: %+v\n", r.App)
	if len(r.Gauges) > 0 {
		fmt.Fprintf(&b, "gateway process: %s\n", strings.Join(r.Gauges, "; "))
	}
	for _, f := range r.Faults {
		fmt.Fprintf(&b, "fault %-10s %-3s %s → %s", f.Kind, f.Replica, clock(f.Start), clock(f.End))
		if f.Drain > 0 {
			fmt.Fprintf(&b, " drain %s", f.Drain.Round(time.Millisecond))
		}
		if f.Err != nil {
			fmt.Fprintf(&b, " ERROR %v", f.Err)
		}
		b.WriteByte('\n')
	}
	for i, d := range r.Duplicates {
		if i == 20 {
			fmt.Fprintf(&b, "… %d more duplicates\n", len(r.Duplicates)-i)
			break
		}
		fmt.Fprintf(&b, "duplicate %s [%s]: %s\n", d.ID, d.Cause, d.Note)
	}
	if len(r.Lost) > 0 {
		fmt.Fprintf(&b, "lost: %s\n", head(r.Lost, 20))
	}
	if len(r.Stuck) > 0 {
		fmt.Fprintf(&b, "stuck processing: %s\n", head(r.Stuck, 20))
	}
	for i, t := range r.Trouble {
		if i == 20 {
			break
		}
		fmt.Fprintf(&b, "trouble: %s\n", t)
	}
	return b.String()
}

func head(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, " ")
	}
	return strings.Join(s[:n], " ") + fmt.Sprintf(" … (%d in all)", len(s))
}
