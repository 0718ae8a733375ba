package chartcheck

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"sigs.k8s.io/yaml"
)

// parseRules validates a Prometheus rule file as Prometheus loads it (what
// promtool check rules does): strict YAML, PromQL that parses, templates in
// labels and annotations that parse.
func parseRules(t *testing.T, what string, content []byte) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.Parse(content, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, err := range errs {
		t.Errorf("%s: got rule error %v, want none", what, err)
	}
	if groups == nil || len(groups.Groups) == 0 {
		t.Fatalf("%s: got no rule group", what)
	}
	return groups
}

// shippedRules reads and checks (parseRules) the rule file the chart ships.
func shippedRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "dedupgw", "alerts", "dedupgw.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return parseRules(t, "alerts/dedupgw.rules.yaml", raw)
}

// TestAlertRuleFile: the rule file the chart ships loads into Prometheus as
// it is, for users without the Operator, and every alert carries a severity
// and a runbook.
func TestAlertRuleFile(t *testing.T) {
	groups := shippedRules(t)
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("got a recording rule %q, want alerts only", r.Record)
			}
			if !slices.Contains([]string{"info", "warning", "critical"}, r.Labels["severity"]) {
				t.Errorf("alert %s: got severity %q, want info, warning or critical", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["runbook_url"] == "" {
				t.Errorf("alert %s: got annotations %v, want a summary and a runbook_url", r.Alert, r.Annotations)
			}
		}
	}
}

// TestPrometheusRule: prometheusRule.enabled renders the shipped rule file
// as a PrometheusRule, in both modes, whose spec Prometheus accepts; its
// labels select it for the Operator, alertLabels reach every alert without
// overriding an alert's own severity, and nothing renders by default.
func TestPrometheusRule(t *testing.T) {
	if r := decodeStrict(t, render(t, "dedupgw", "a", "ns")); len(r.PrometheusRules) != 0 {
		t.Errorf("default values: got PrometheusRules %v, want none", keys(r.PrometheusRules))
	}
	shipped := shippedRules(t)

	for _, mode := range []string{"standalone", "sidecar"} {
		t.Run(mode, func(t *testing.T) {
			r := decodeStrict(t, render(t, "dedupgw", "a", "ns", "--set", "mode="+mode,
				"--set", "prometheusRule.enabled=true",
				"--set", "prometheusRule.labels.release=prometheus",
				"--set", "prometheusRule.alertLabels.team=payments",
				"--set", "prometheusRule.alertLabels.tier=1",
				"--set", "prometheusRule.alertLabels.severity=page"))
			pr := r.PrometheusRules["a-dedupgw"]
			if pr == nil {
				t.Fatalf("no PrometheusRule a-dedupgw; got %v", keys(r.PrometheusRules))
			}
			if got := pr.Labels["release"]; got != "prometheus" {
				t.Errorf("label release: got %q, want prometheus", got)
			}
			spec, err := yaml.Marshal(pr.Spec)
			if err != nil {
				t.Fatal(err)
			}
			rendered := parseRules(t, "the PrometheusRule's spec", spec)
			if len(rendered.Groups) != len(shipped.Groups) {
				t.Fatalf("got %d groups, want the file's %d", len(rendered.Groups), len(shipped.Groups))
			}
			for i, g := range rendered.Groups {
				want := shipped.Groups[i]
				if len(g.Rules) != len(want.Rules) {
					t.Fatalf("group %s: got %d rules, want the file's %d", g.Name, len(g.Rules), len(want.Rules))
				}
				for j, rule := range g.Rules {
					w := want.Rules[j]
					if rule.Alert != w.Alert || rule.Expr != w.Expr || rule.For != w.For {
						t.Errorf("rule %d: got %s %q for %v, want the file's %s %q for %v", j, rule.Alert, rule.Expr, rule.For, w.Alert, w.Expr, w.For)
					}
					if got := rule.Labels["severity"]; got != w.Labels["severity"] {
						t.Errorf("alert %s: got severity %q, want its own %q (alertLabels must not override it)", rule.Alert, got, w.Labels["severity"])
					}
					if rule.Labels["team"] != "payments" || rule.Labels["tier"] != "1" {
						t.Errorf("alert %s: got labels %v, want team=payments and tier=\"1\" from alertLabels", rule.Alert, rule.Labels)
					}
					if rule.Annotations["description"] != w.Annotations["description"] {
						t.Errorf("alert %s: got description %q, want the file's %q (left to Prometheus's templating, not Helm's)", rule.Alert, rule.Annotations["description"], w.Annotations["description"])
					}
				}
			}
		})
	}
}

// TestAlertsFireWhenTheyShould evaluates each shipped alert's expression
// (the `for` aside) with Prometheus's own engine over series shaped like
// the gateway's, twenty minutes of them a minute apart: once where the
// alert must fire, once where a neighbouring series (another outcome,
// reason or op, or a counter standing still) must leave it quiet. A
// selector that names the wrong label value, or an aggregation that drops
// a label the other side keeps, fails here though it parses.
func TestAlertsFireWhenTheyShould(t *testing.T) {
	exprs := map[string]string{}
	for _, g := range shippedRules(t).Groups {
		for _, r := range g.Rules {
			exprs[r.Alert] = r.Expr
		}
	}
	// s is one series of the scraped target, name and label pairs, whose
	// value at minute i (0 to 20) is at(i).
	type s struct {
		labels []string
		at     func(i int) float64
	}
	rising := func(by float64) func(int) float64 { return func(i int) float64 { return by * float64(i) } }
	flat := func(v float64) func(int) float64 { return func(int) float64 { return v } }
	step := func(from int) func(int) float64 { // 0, then 1 from minute from on
		return func(i int) float64 {
			if i >= from {
				return 1
			}
			return 0
		}
	}
	tests := []struct {
		alert       string
		fire, quiet []s
	}{
		{"DedupgwStoreErrors",
			[]s{{[]string{"__name__", "dedupgw_store_errors_total", "backend", "redis", "op", "claim"}, rising(5)}},
			[]s{{[]string{"__name__", "dedupgw_store_errors_total", "backend", "redis", "op", "claim"}, flat(3)}}},
		{"DedupgwFailOpenForwards",
			[]s{{[]string{"__name__", "dedupgw_deliveries_total", "route", "orders", "outcome", "store_error"}, rising(10)}},
			[]s{{[]string{"__name__", "dedupgw_deliveries_total", "route", "orders", "outcome", "forwarded"}, rising(10)},
				{[]string{"__name__", "dedupgw_deliveries_total", "route", "orders", "outcome", "store_error"}, flat(4)}}},
		{"DedupgwUpstreamFailing",
			[]s{{[]string{"__name__", "dedupgw_releases_total", "route", "orders", "reason", "upstream_status"}, rising(20)},
				{[]string{"__name__", "dedupgw_deliveries_total", "route", "orders", "outcome", "forwarded"}, rising(100)},
				{[]string{"__name__", "dedupgw_deliveries_total", "route", "orders", "outcome", "duplicate"}, rising(900)}},
			[]s{{[]string{"__name__", "dedupgw_releases_total", "route", "orders", "reason", "upstream_status"}, rising(5)},
				{[]string{"__name__", "dedupgw_deliveries_total", "route", "orders", "outcome", "forwarded"}, rising(100)}}},
		{"DedupgwUpstreamTimeouts",
			[]s{{[]string{"__name__", "dedupgw_releases_total", "route", "orders", "reason", "timeout"}, rising(2)}},
			[]s{{[]string{"__name__", "dedupgw_releases_total", "route", "orders", "reason", "upstream_status"}, rising(2)},
				{[]string{"__name__", "dedupgw_releases_total", "route", "orders", "reason", "timeout"}, flat(3)}}},
		{"DedupgwShutdownReleases",
			[]s{{[]string{"__name__", "dedupgw_releases_total", "route", "orders", "reason", "shutdown"}, step(10)}},
			[]s{{[]string{"__name__", "dedupgw_releases_total", "route", "orders", "reason", "timeout"}, rising(1)},
				{[]string{"__name__", "dedupgw_releases_total", "route", "orders", "reason", "shutdown"}, flat(0)}}},
		{"DedupgwLostCommits",
			[]s{{[]string{"__name__", "dedupgw_leases_lost_total", "route", "orders", "op", "commit"}, step(15)}},
			[]s{{[]string{"__name__", "dedupgw_leases_lost_total", "route", "orders", "op", "release"}, rising(1)},
				{[]string{"__name__", "dedupgw_leases_lost_total", "route", "orders", "op", "commit"}, flat(2)}}},
		{"DedupgwLeaseTakeovers",
			[]s{{[]string{"__name__", "dedupgw_lease_takeovers_total", "route", "orders"}, step(15)}},
			[]s{{[]string{"__name__", "dedupgw_lease_takeovers_total", "route", "orders"}, flat(2)}}},
		{"DedupgwCommitsFailing",
			[]s{{[]string{"__name__", "dedupgw_store_errors_total", "backend", "redis", "op", "commit"}, step(15)}},
			[]s{{[]string{"__name__", "dedupgw_store_errors_total", "backend", "redis", "op", "claim"}, rising(5)},
				{[]string{"__name__", "dedupgw_store_errors_total", "backend", "redis", "op", "commit"}, flat(2)}}},
		{"DedupgwSignaturesRejected",
			[]s{{[]string{"__name__", "dedupgw_deliveries_total", "route", "stripe", "outcome", "rejected_signature"}, rising(30)},
				{[]string{"__name__", "dedupgw_deliveries_total", "route", "stripe", "outcome", "forwarded"}, rising(2)}},
			[]s{{[]string{"__name__", "dedupgw_deliveries_total", "route", "stripe", "outcome", "rejected_signature"}, rising(3)},
				{[]string{"__name__", "dedupgw_deliveries_total", "route", "stripe", "outcome", "forwarded"}, rising(30)}}},
		{"DedupgwReloadFailed",
			[]s{{[]string{"__name__", "dedupgw_config_reloads_total", "result", "failure"}, step(15)}},
			[]s{{[]string{"__name__", "dedupgw_config_reloads_total", "result", "success"}, step(15)},
				{[]string{"__name__", "dedupgw_config_reloads_total", "result", "failure"}, step(2)}}},
		{"DedupgwBoltCheckpointsFailing",
			[]s{{[]string{"__name__", "dedupgw_bolt_checkpoint_failures_total"}, rising(1)}},
			[]s{{[]string{"__name__", "dedupgw_bolt_checkpoint_failures_total"}, flat(7)}}},
		{"DedupgwBoltJournalFilling",
			[]s{{[]string{"__name__", "dedupgw_bolt_journal_backlog_bytes"}, flat(3_000_000)},
				{[]string{"__name__", "dedupgw_bolt_journal_backlog_limit_bytes"}, flat(4 << 20)}},
			[]s{{[]string{"__name__", "dedupgw_bolt_journal_backlog_bytes"}, flat(1_000_000)},
				{[]string{"__name__", "dedupgw_bolt_journal_backlog_limit_bytes"}, flat(4 << 20)}}},
	}
	if len(tests) != len(exprs) {
		t.Errorf("got scenarios for %d alerts, want one for each of the file's %d", len(tests), len(exprs))
	}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute})
	t.Cleanup(func() { _ = engine.Close() })
	start := time.Unix(1_796_000_000, 0)
	eval := func(t *testing.T, expr string, loaded []s) promql.Vector {
		t.Helper()
		var all []storage.Series
		for _, ls := range loaded {
			lset := labels.FromStrings(append([]string{"namespace", "shop", "job", "hooks-dedupgw", "instance", "10.0.0.7:9090"}, ls.labels...)...)
			var samples []chunks.Sample
			for i := 0; i <= 20; i++ {
				samples = append(samples, floatSample{t: start.Add(time.Duration(i) * time.Minute).UnixMilli(), f: ls.at(i)})
			}
			all = append(all, storage.NewListSeries(lset, samples))
		}
		q := &storage.MockQueryable{MockQuerier: &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			var out []storage.Series
			for _, sr := range all {
				if matchAll(sr.Labels(), ms) {
					out = append(out, sr)
				}
			}
			slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
			return &seriesSet{list: out, i: -1}
		}}}
		qry, err := engine.NewInstantQuery(context.Background(), q, nil, expr, start.Add(20*time.Minute))
		if err != nil {
			t.Fatalf("query %s: %v", expr, err)
		}
		defer qry.Close()
		res := qry.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("evaluate %s: %v", expr, res.Err)
		}
		v, err := res.Vector()
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	for _, tt := range tests {
		t.Run(tt.alert, func(t *testing.T) {
			expr, ok := exprs[tt.alert]
			if !ok {
				t.Fatalf("alert %s: not in the rule file", tt.alert)
			}
			fired := eval(t, expr, tt.fire)
			if len(fired) != 1 {
				t.Fatalf("where it should fire: got %v, want one series (%s)", fired, expr)
			}
			for _, l := range []string{"namespace", "job"} {
				if fired[0].Metric.Get(l) == "" {
					t.Errorf("firing series %v: got no %s label, want it kept (two deployments must alert apart)", fired[0].Metric, l)
				}
			}
			if quiet := eval(t, expr, tt.quiet); len(quiet) != 0 {
				t.Errorf("where it should stay quiet: got %v, want nothing (%s)", quiet, expr)
			}
		})
	}
}

// matchAll reports whether lset satisfies every matcher.
func matchAll(lset labels.Labels, ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches(lset.Get(m.Name)) {
			return false
		}
	}
	return true
}

// seriesSet is a storage.SeriesSet over a slice.
type seriesSet struct {
	list []storage.Series
	i    int
}

func (ss *seriesSet) Next() bool                        { ss.i++; return ss.i < len(ss.list) }
func (ss *seriesSet) At() storage.Series                { return ss.list[ss.i] }
func (ss *seriesSet) Err() error                        { return nil }
func (ss *seriesSet) Warnings() annotations.Annotations { return nil }

// floatSample is a float chunks.Sample.
type floatSample struct {
	t int64
	f float64
}

func (s floatSample) T() int64                      { return s.t }
func (s floatSample) ST() int64                     { return 0 }
func (s floatSample) F() float64                    { return s.f }
func (s floatSample) H() *histogram.Histogram       { return nil }
func (s floatSample) FH() *histogram.FloatHistogram { return nil }
func (s floatSample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s floatSample) Copy() chunks.Sample           { return s }
