package proxy

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/dedupgw/dedupgw/dedup/boltstore"
	"github.com/dedupgw/dedupgw/dedup/memstore"
)

// TestDashboardQueriesKnownMetrics keeps the Grafana dashboard the Helm chart
// ships honest: every dedupgw_* series one of its panels queries must be a
// metric the gateway or the bolt store registers, so a renamed metric cannot
// leave an empty panel behind, and filters by namespace and job.
func TestDashboardQueriesKnownMetrics(t *testing.T) {
	raw, err := os.ReadFile("../helm/dedupgw/dashboards/dedupgw.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not valid JSON: %v", err)
	}

	known, byRoute := gatherMetrics(t)

	metricName := regexp.MustCompile(`dedupgw_[a-z_]+`)
	// Every selector filters by the dashboard's namespace and job, so two
	// deployments one Prometheus scrapes are not summed together.
	selector := regexp.MustCompile(`\b(dedupgw_[a-z_]+|process_[a-z_]+|go_[a-z_]+)(\{[^}]*\})?`)
	queried := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				if !strings.Contains(m[2], `namespace=~"$namespace"`) || !strings.Contains(m[2], `job=~"$job"`) {
					t.Errorf("panel %q: got selector %s, want it to filter by namespace=~\"$namespace\" and job=~\"$job\"", p.Title, m[0])
				}
			}
			for _, name := range metricName.FindAllString(tg.Expr, -1) {
				queried++
				if byRoute[name] && !strings.Contains(tg.Expr, name+`{route=~"$route"`) {
					t.Errorf("panel %q queries %s without route=~\"$route\" first in its selector, so the dashboard's route filter does not apply: %s", p.Title, name, tg.Expr)
				}
				if known[name] == nil {
					names := make([]string, 0, len(known))
					for k := range known {
						names = append(names, k)
					}
					sort.Strings(names)
					t.Errorf("panel %q queries %s, which the gateway does not export; got metrics %v", p.Title, name, names)
				}
			}
		}
	}
	if queried == 0 {
		t.Fatal("got no dedupgw_* metric in any panel query, want the dashboard to chart the gateway")
	}
}

// series is what a registry exports: every metric name (a histogram's
// _bucket, _sum and _count too), with each label's values.
type series map[string]map[string]map[string]bool

// gatherMetrics returns what a gateway on one route ("orders") and a bolt
// store register before any delivery, and which of those metrics carry a
// route label.
func gatherMetrics(t *testing.T) (known series, byRoute map[string]bool) {
	t.Helper()
	reg := prometheus.NewRegistry()
	store := memstore.New(memstore.Options{})
	defer store.Close()
	gw, err := New(Config{Routes: []Route{genericRoute("orders", "/hooks/orders", "http://127.0.0.1:1")}}, store, Options{Registerer: reg, Backend: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	// dedupgw_store_up has a series once the store answered a ping.
	gw.storeAnswered(gw.pings.Add(1), nil)
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), "dedupgw.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer bolt.Close()
	reg.MustRegister(bolt.Collectors()...)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	known, byRoute = series{}, map[string]bool{}
	for _, mf := range families {
		name := mf.GetName()
		labels := map[string]map[string]bool{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] == nil {
					labels[l.GetName()] = map[string]bool{}
				}
				labels[l.GetName()][l.GetValue()] = true
			}
		}
		// Histograms are queried through their _bucket, _sum and _count series.
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			known[name+suffix] = labels
			byRoute[name+suffix] = labels["route"] != nil
		}
	}
	return known, byRoute
}

// TestAlertRulesQueryKnownMetrics keeps the alert rules the Helm chart
// ships honest, as TestDashboardQueriesKnownMetrics does the dashboard:
// every dedupgw_* series an alert queries is exported, with the label
// values its matchers name (outcome="store_error" must be an outcome), it
// groups only by labels its metrics carry (or the scrape's namespace, job
// and instance), and README's "Alerts worth having" shows the same
// expression, so the documented alert is the shipped one.
func TestAlertRulesQueryKnownMetrics(t *testing.T) {
	raw, err := os.ReadFile("../helm/dedupgw/alerts/dedupgw.rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatalf("rule file is not valid YAML: %v", err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	known, _ := gatherMetrics(t)

	selector := regexp.MustCompile(`(dedupgw_[a-z_]+)(\{[^}]*\})?`)
	matcher := regexp.MustCompile(`([a-z_]+)=~?"([^"]*)"`)
	grouping := regexp.MustCompile(`by \(([^)]*)\)`)
	alerts := 0
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			alerts++
			var names []string
			for _, m := range selector.FindAllStringSubmatch(r.Expr, -1) {
				name := m[1]
				labels := known[name]
				if labels == nil {
					t.Errorf("alert %s queries %s, which the gateway does not export", r.Alert, name)
					continue
				}
				names = append(names, name)
				for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
					if !labels[lm[1]][lm[2]] {
						t.Errorf("alert %s selects %s{%s=%q}: got values %v for that label, want it among them", r.Alert, name, lm[1], lm[2], labels[lm[1]])
					}
				}
			}
			if len(names) == 0 {
				t.Errorf("alert %s queries no dedupgw_* metric: %s", r.Alert, r.Expr)
			}
			// Every aggregation of one alert keeps the same labels: the two
			// sides of a ratio grouped apart match no series, and the alert
			// never fires.
			var groupings []string
			for _, by := range grouping.FindAllStringSubmatch(r.Expr, -1) {
				if groupings = append(groupings, by[1]); by[1] != groupings[0] {
					t.Errorf("alert %s groups by (%s) and by (%s): got aggregations that keep different labels, want the same in each", r.Alert, groupings[0], by[1])
				}
				for label := range strings.SplitSeq(by[1], ",") {
					label = strings.TrimSpace(label)
					if label == "namespace" || label == "job" || label == "instance" {
						continue
					}
					for _, name := range names {
						if known[name][label] == nil {
							t.Errorf("alert %s groups by %s, which %s does not carry", r.Alert, label, name)
						}
					}
				}
			}
			if !bytes.Contains(readme, []byte("`"+r.Expr+"`")) {
				t.Errorf("alert %s: README's alerts table does not show its expression `%s`", r.Alert, r.Expr)
			}
		}
	}
	if alerts == 0 {
		t.Fatal("got no alert in the rule file")
	}
	// README counts the alerts its table shares with the file ("holds the
	// first twelve"): an alert added without the count left it one short.
	words := map[string]int{"ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16}
	counted := regexp.MustCompile(`holds the first ([a-z]+) as a Prometheus rule file`).FindSubmatch(readme)
	if counted == nil {
		t.Fatal(`README's "Alerts worth having" does not say how many alerts the rule file holds ("holds the first … as a Prometheus rule file")`)
	}
	if got := words[string(counted[1])]; got != alerts {
		t.Errorf("README says the rule file holds the first %q alerts: got %d, want %d, the rules in the file", counted[1], got, alerts)
	}
}
