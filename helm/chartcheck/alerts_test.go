package chartcheck

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
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

// TestAlertRuleFile: the rule file the chart ships loads into Prometheus as
// it is, for users without the Operator, and every alert carries a severity
// and a runbook.
func TestAlertRuleFile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "dedupgw", "alerts", "dedupgw.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	groups := parseRules(t, "alerts/dedupgw.rules.yaml", raw)
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
	raw, err := os.ReadFile(filepath.Join("..", "dedupgw", "alerts", "dedupgw.rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	shipped := parseRules(t, "alerts/dedupgw.rules.yaml", raw)

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
