package proxy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupgw/dedupgw/dedup/boltstore"
	"github.com/dedupgw/dedupgw/dedup/memstore"
)

// TestDashboardQueriesKnownMetrics keeps the Grafana dashboard the Helm chart
// ships honest: every dedupgw_* series one of its panels queries must be a
// metric the gateway or the bolt store registers, so a renamed metric cannot
// leave an empty panel behind.
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

	reg := prometheus.NewRegistry()
	store := memstore.New(memstore.Options{})
	defer store.Close()
	gw, err := New(Config{Routes: []Route{genericRoute("orders", "/hooks/orders", "http://127.0.0.1:1")}}, store, Options{Registerer: reg, Backend: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
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
	known := map[string]bool{}
	byRoute := map[string]bool{} // metrics with a route label
	for _, mf := range families {
		name := mf.GetName()
		hasRoute := false
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				hasRoute = hasRoute || l.GetName() == "route"
			}
		}
		// Histograms are queried through their _bucket, _sum and _count series.
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			known[name+suffix] = true
			byRoute[name+suffix] = hasRoute
		}
	}

	metricName := regexp.MustCompile(`dedupgw_[a-z_]+`)
	queried := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, name := range metricName.FindAllString(tg.Expr, -1) {
				queried++
				if byRoute[name] && !strings.Contains(tg.Expr, name+`{route=~"$route"`) {
					t.Errorf("panel %q queries %s without route=~\"$route\" first in its selector, so the dashboard's route filter does not apply: %s", p.Title, name, tg.Expr)
				}
				if !known[name] {
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
