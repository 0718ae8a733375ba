package chartcheck

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
)

// drainSeconds is how long the gateway drains on SIGTERM for this config:
// the longest upstream_timeout (defaults, 30s when unset, and every route's
// own) plus 5 s, in whole seconds rounded up, read with time.ParseDuration
// as the gateway reads it.
func drainSeconds(t *testing.T, cfg gatewayConfig) int64 {
	t.Helper()
	longest := 30 * time.Second
	parse := func(key, s string) {
		if s == "" {
			return
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("config %s: %v", key, err)
		}
		longest = max(longest, d)
	}
	if cfg.Defaults.UpstreamTimeout != "" {
		longest = 0
		parse("defaults.upstream_timeout", cfg.Defaults.UpstreamTimeout)
	}
	for _, r := range cfg.Routes {
		parse("routes "+r.Name+" upstream_timeout", r.UpstreamTimeout)
	}
	return int64((longest+time.Second-1)/time.Second) + 5
}

// checkGeneratedToken checks that the gateway container reads
// DEDUPGW_ADMIN_TOKEN from the chart's own Secret, which holds a token.
func checkGeneratedToken(t *testing.T, r *rendered, c *corev1.Container, secret string) {
	t.Helper()
	tok := env(c, "DEDUPGW_ADMIN_TOKEN")
	if tok == nil || tok.ValueFrom == nil || tok.ValueFrom.SecretKeyRef == nil ||
		tok.ValueFrom.SecretKeyRef.Name != secret || tok.ValueFrom.SecretKeyRef.Key != "admin-token" {
		t.Fatalf("DEDUPGW_ADMIN_TOKEN: got %+v, want secretKeyRef %s/admin-token", tok, secret)
	}
	s := r.Secrets[secret]
	if s == nil {
		t.Fatalf("no Secret %s; got %v", secret, keys(r.Secrets))
	}
	// The strict decode has already base64-decoded data.
	if got := len(s.Data["admin-token"]); got < 32 {
		t.Errorf("Secret %s admin-token: got %d bytes, want a random token of at least 32", secret, got)
	}
}

// checkShutdownOrder checks that the app beside the sidecar sleeps in preStop
// for the gateway's whole drain, and that the grace period covers the sleep
// and the app's own stop.
func checkShutdownOrder(t *testing.T, r *rendered, d *appsv1.Deployment, app *corev1.Container, wantSleep, wantGrace int64) {
	t.Helper()
	ps := d.Spec.Template.Spec
	cfg, _ := configOf(t, r.ConfigMaps[volume(ps, "dedupgw-config").ConfigMap.Name])
	if drain := drainSeconds(t, cfg); wantSleep < drain {
		t.Fatalf("test table: want sleep %d is shorter than the drain %d", wantSleep, drain)
	}
	var sleep int64 = -1
	if app.Lifecycle != nil && app.Lifecycle.PreStop != nil && app.Lifecycle.PreStop.Sleep != nil {
		sleep = app.Lifecycle.PreStop.Sleep.Seconds
	}
	if sleep != wantSleep {
		t.Errorf("app %s preStop sleep: got %d, want %d (the gateway's drain: longest upstream_timeout + 5 s)", app.Name, sleep, wantSleep)
	}
	if g := ptrInt64(ps.TerminationGracePeriodSeconds); g != wantGrace {
		t.Errorf("terminationGracePeriodSeconds: got %v, want %d (preStop sleep + app.stopSeconds)", g, wantGrace)
	}
}

// TestTerminationGracePeriod checks that the grace period follows the longest
// upstream_timeout (defaults and routes) unless set, and that a set one
// shorter than the drain needs fails the render.
func TestTerminationGracePeriod(t *testing.T) {
	route := func(timeout string) []string {
		return []string{"--set", "routes[0].name=a", "--set", "routes[0].path=/a", "--set", "routes[0].upstream=http://a:3000",
			"--set", "routes[0].keys={body}", "--set-string", "routes[0].upstream_timeout=" + timeout,
			"--set", "routes[1].name=b", "--set", "routes[1].path=/b", "--set", "routes[1].upstream=http://a:3000",
			"--set", "routes[1].keys={body}"}
	}
	tests := []struct {
		name string
		args []string
		want int64
	}{
		{"defaults unset: 30s", nil, 45},
		{"defaults 60s", []string{"--set-string", "defaults.upstream_timeout=60s"}, 75},
		{"defaults 100s", []string{"--set-string", "defaults.upstream_timeout=100s"}, 115},
		{"defaults 2m", []string{"--set-string", "defaults.upstream_timeout=2m"}, 135},
		{"defaults 1m30s", []string{"--set-string", "defaults.upstream_timeout=1m30s"}, 105},
		{"defaults 1h", []string{"--set-string", "defaults.upstream_timeout=1h"}, 3615},
		{"defaults 1.5s rounds up", []string{"--set-string", "defaults.upstream_timeout=1.5s"}, 17},
		{"defaults 2500ms rounds up", []string{"--set-string", "defaults.upstream_timeout=2500ms"}, 18},
		{"defaults 10s below the built-in 30s", []string{"--set-string", "defaults.upstream_timeout=10s"}, 25},
		{"route 2m over unset defaults", route("2m"), 135},
		{"route 10s under unset defaults", route("10s"), 45},
		{"route 90s over defaults 60s", append(route("90s"), "--set-string", "defaults.upstream_timeout=60s", "--set-string", "defaults.lease=2m"), 105},
		{"explicit and long enough", []string{"--set-string", "defaults.upstream_timeout=2m", "--set", "terminationGracePeriodSeconds=130"}, 130},
		{"explicit with a ${VAR} timeout", []string{"--set-string", "defaults.upstream_timeout=${UPSTREAM_TIMEOUT}", "--set", "terminationGracePeriodSeconds=300"}, 300},
		{"a preStop sleep comes before the drain", []string{"--set", "preStopSleepSeconds=5"}, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A lease longer than every upstream_timeout here, or the chart
			// refuses the render as the gateway would refuse the config.
			args := append([]string{"--set-string", "defaults.lease=2h"}, tt.args...)
			r := decodeStrict(t, render(t, "dedupgw", "a", "ns", args...))
			d := r.deployment(t, "a-dedupgw")
			if got := ptrInt64(d.Spec.Template.Spec.TerminationGracePeriodSeconds); got != tt.want {
				t.Errorf("terminationGracePeriodSeconds: got %v, want %d", got, tt.want)
			}
		})
	}

	failures := []struct {
		name string
		args []string
		want []string
	}{
		{"explicit shorter than the drain", []string{"--set-string", "defaults.upstream_timeout=2m", "--set", "terminationGracePeriodSeconds=60"},
			[]string{"terminationGracePeriodSeconds=60 is too short", "up to 125 s", "at least 130"}},
		{"explicit shorter than a route's drain", append(route("100s"), "--set", "terminationGracePeriodSeconds=45"),
			[]string{"terminationGracePeriodSeconds=45 is too short", "at least 110"}},
		{"unreadable timeout, derived", []string{"--set-string", "defaults.upstream_timeout=${UPSTREAM_TIMEOUT}"},
			[]string{"defaults.upstream_timeout", `cannot read "${UPSTREAM_TIMEOUT}" as a duration`, "set terminationGracePeriodSeconds"}},
		{"negative route timeout, derived", route("-5s"),
			[]string{"routes[0].upstream_timeout", `cannot read "-5s"`}},
		{"explicit without room for the preStop sleep", []string{"--set", "preStopSleepSeconds=10", "--set", "terminationGracePeriodSeconds=45"},
			[]string{"terminationGracePeriodSeconds=45 is too short", "up to 45 s", "at least 50"}},
	}
	for _, tt := range failures {
		t.Run(tt.name, func(t *testing.T) {
			renderFails(t, tt.args, tt.want...)
		})
	}
}

// TestPreStopSleep checks that preStopSleepSeconds renders a preStop sleep
// hook on the standalone gateway container, and none by default.
func TestPreStopSleep(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int64
	}{{nil, 0}, {[]string{"--set", "preStopSleepSeconds=5"}, 5}} {
		r := decodeStrict(t, render(t, "dedupgw", "a", "ns", tt.args...))
		c := r.deployment(t, "a-dedupgw").Spec.Template.Spec.Containers[0]
		var got int64
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
			got = c.Lifecycle.PreStop.Sleep.Seconds
		}
		if got != tt.want {
			t.Errorf("%v: preStop sleep: got %d s (lifecycle %+v), want %d", tt.args, got, c.Lifecycle, tt.want)
		}
		if tt.want == 0 && c.Lifecycle != nil {
			t.Errorf("%v: got lifecycle %+v, want none", tt.args, c.Lifecycle)
		}
	}
}

// TestSidecarShutdownOrder checks that the example's app outlives the
// gateway's drain also when a route's upstream_timeout is raised.
func TestSidecarShutdownOrder(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		wantSleep int64
		wantGrace int64
	}{
		{"example values", nil, 35, 50},
		{"defaults 2m", []string{"--set-string", "dedupgw.defaults.upstream_timeout=2m", "--set-string", "dedupgw.defaults.lease=3m"}, 125, 140},
		{"slow app stop", []string{"--set", "app.stopSeconds=40"}, 35, 75},
		{"app stops at once: the gateway's own minimum", []string{"--set", "app.stopSeconds=0"}, 35, 45},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := decodeStrict(t, render(t, "examples/sidecar-app", "shop", "shop", tt.args...))
			d := r.deployment(t, "shop-shop")
			checkGatewayPods(t, r)
			checkShutdownOrder(t, r, d, container(t, d.Spec.Template.Spec, "shop"), tt.wantSleep, tt.wantGrace)
		})
	}
}

// TestAdminToken checks where the admin API token comes from: by default a
// Secret the chart generates, so /v1/keys is never open to the cluster unless
// admin.insecure=true says so.
func TestAdminToken(t *testing.T) {
	tests := []struct {
		name         string
		args         []string
		wantSecret   string // the Secret DEDUPGW_ADMIN_TOKEN comes from; "" none
		wantKey      string
		wantRendered bool // the chart renders that Secret
		wantInsecure bool
	}{
		{"default", nil, "a-dedupgw-admin", "admin-token", true, false},
		{"default with existingSecret", []string{"--set", "existingSecret=hooks"}, "a-dedupgw-admin", "admin-token", true, false},
		{"tokenSecret", []string{"--set", "admin.tokenSecret.name=mine", "--set", "admin.tokenSecret.key=tok"}, "mine", "tok", false, false},
		{"tokenSecret wins over insecure", []string{"--set", "admin.tokenSecret.name=mine", "--set", "admin.insecure=true"}, "mine", "admin-token", false, false},
		{"insecure", []string{"--set", "admin.insecure=true"}, "", "", false, true},
		{"token in env", []string{"--set", "env[0].name=DEDUPGW_ADMIN_TOKEN", "--set", "env[0].valueFrom.secretKeyRef.name=vault",
			"--set", "env[0].valueFrom.secretKeyRef.key=t"}, "vault", "t", false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := decodeStrict(t, render(t, "dedupgw", "a", "ns", tt.args...))
			checkGatewayPods(t, r)
			d := r.Deployments["a-dedupgw"]
			cfg, raw := configOf(t, r.ConfigMaps["a-dedupgw"])
			if cfg.Admin.Insecure != tt.wantInsecure {
				t.Errorf("config admin.insecure: got %v, want %v\n%s", cfg.Admin.Insecure, tt.wantInsecure, raw)
			}
			c := container(t, d.Spec.Template.Spec, "dedupgw")
			n := 0
			for _, e := range c.Env {
				if e.Name == "DEDUPGW_ADMIN_TOKEN" {
					n++
				}
			}
			if tt.wantSecret == "" {
				if n != 0 {
					t.Errorf("DEDUPGW_ADMIN_TOKEN: got %d entries, want none", n)
				}
			} else {
				tok := env(c, "DEDUPGW_ADMIN_TOKEN")
				if n != 1 || tok.ValueFrom == nil || tok.ValueFrom.SecretKeyRef == nil ||
					tok.ValueFrom.SecretKeyRef.Name != tt.wantSecret || tok.ValueFrom.SecretKeyRef.Key != tt.wantKey {
					t.Errorf("DEDUPGW_ADMIN_TOKEN: got %d entries, first %+v, want one secretKeyRef %s/%s", n, tok, tt.wantSecret, tt.wantKey)
				}
			}
			if tt.wantRendered {
				checkGeneratedToken(t, r, c, tt.wantSecret)
			} else if len(r.Secrets) != 0 {
				t.Errorf("Secrets: got %v, want none", keys(r.Secrets))
			}
		})
	}

	// The token is random, not a constant shipped with the chart.
	a := decodeStrict(t, render(t, "dedupgw", "a", "ns")).Secrets["a-dedupgw-admin"]
	b := decodeStrict(t, render(t, "dedupgw", "a", "ns")).Secrets["a-dedupgw-admin"]
	if a == nil || b == nil || string(a.Data["admin-token"]) == string(b.Data["admin-token"]) {
		t.Errorf("generated tokens of two renders: got the same (or none), want two random ones")
	}
	// The sidecar mode renders the Secret too: the app's chart has no other.
	r := decodeStrict(t, render(t, "examples/sidecar-app", "shop", "shop",
		"--set", "dedupgw.admin.tokenSecret.name=", "--set", "dedupgw.admin.insecure=false"))
	d := r.Deployments["shop-shop"]
	checkGatewayPods(t, r)
	checkGeneratedToken(t, r, container(t, d.Spec.Template.Spec, "dedupgw"), "shop-dedupgw-sidecar-admin")
	if got := base64.StdEncoding.EncodeToString(r.Secrets["shop-dedupgw-sidecar-admin"].Data["admin-token"]); got == "" {
		t.Errorf("sidecar token: got empty, want a token")
	}
}

// TestGoMemLimit checks GOMEMLIMIT is 90 % of limits.memory for the forms
// the chart reads, and that another form fails the render by name.
func TestGoMemLimit(t *testing.T) {
	tests := []struct {
		limit string
		want  string
	}{
		{"256Mi", "241591910"},
		{"1Gi", "966367641"},
		{"1.5Gi", "1449551462"},
		{"100Ki", "92160"},
		{"500M", "450000000"},
		{"2G", "1800000000"},
		{"128k", "115200"},
		{"268435456", "241591910"},
	}
	for _, tt := range tests {
		t.Run(tt.limit, func(t *testing.T) {
			r := decodeStrict(t, render(t, "dedupgw", "a", "ns", "--set-string", "resources.limits.memory="+tt.limit))
			checkGatewayPods(t, r) // also compares with resource.Quantity's reading
			c := container(t, r.Deployments["a-dedupgw"].Spec.Template.Spec, "dedupgw")
			if e := env(c, "GOMEMLIMIT"); e == nil || e.Value != tt.want {
				t.Errorf("GOMEMLIMIT for limits.memory %s: got %+v, want %s", tt.limit, e, tt.want)
			}
		})
	}
	t.Run("number in a values file", func(t *testing.T) {
		values := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(values, []byte("resources:\n  limits:\n    memory: 268435456\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		c := container(t, decodeStrict(t, render(t, "dedupgw", "a", "ns", "-f", values)).Deployments["a-dedupgw"].Spec.Template.Spec, "dedupgw")
		if e := env(c, "GOMEMLIMIT"); e == nil || e.Value != "241591910" {
			t.Errorf("GOMEMLIMIT for limits.memory 268435456: got %+v, want 241591910", e)
		}
	})
	for _, tt := range []struct {
		name string
		args []string
		want bool
	}{
		{"goMemLimit off", []string{"--set", "goMemLimit=false"}, false},
		{"set in env", []string{"--set", "env[0].name=GOMEMLIMIT", "--set", "env[0].value=100MiB"}, true},
		{"no limit", []string{"--set", "resources.limits=null"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := container(t, decodeStrict(t, render(t, "dedupgw", "a", "ns", tt.args...)).Deployments["a-dedupgw"].Spec.Template.Spec, "dedupgw")
			n := 0
			for _, e := range c.Env {
				if e.Name == "GOMEMLIMIT" {
					n++
					if e.Value == "" || e.ValueFrom != nil {
						t.Errorf("GOMEMLIMIT: got %+v, want a value", e)
					}
				}
			}
			if want := map[bool]int{false: 0, true: 1}[tt.want]; n != want {
				t.Errorf("GOMEMLIMIT entries: got %d, want %d", n, want)
			}
		})
	}
	for _, limit := range []string{"1e9", "512m", "1Gb"} {
		t.Run("unreadable "+limit, func(t *testing.T) {
			renderFails(t, []string{"--set-string", "resources.limits.memory=" + limit},
				"resources.limits.memory "+strconv.Quote(limit), "GOMEMLIMIT", "goMemLimit: false")
		})
	}
}

// TestSecurityContextsRender checks that every field the schema types in
// podSecurityContext and securityContext renders into the pod as Kubernetes
// reads it (decodeStrict refuses a field or type the API does not know).
func TestSecurityContextsRender(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`podSecurityContext:
  supplementalGroups: [2000, 3000]
  supplementalGroupsPolicy: Strict
  fsGroupChangePolicy: OnRootMismatch
  seLinuxChangePolicy: MountOption
  seLinuxOptions: {level: "s0:c123,c456"}
  appArmorProfile: {type: RuntimeDefault}
  sysctls: [{name: net.ipv4.ip_local_port_range, value: "1024 65535"}]
securityContext:
  capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}
  procMount: Default
  seccompProfile: {type: Localhost, localhostProfile: profiles/dedupgw.json}
  appArmorProfile: {type: Localhost, localhostProfile: k8s-dedupgw}
  seLinuxOptions: {type: spc_t}
  windowsOptions: {runAsUserName: ContainerUser, hostProcess: false}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := decodeStrict(t, render(t, "dedupgw", "a", "ns", "-f", values)).Deployments["a-dedupgw"].Spec.Template.Spec
	pod := spec.SecurityContext
	if pod == nil {
		t.Fatal("pod securityContext: got none")
	}
	c := container(t, spec, "dedupgw").SecurityContext
	if c == nil {
		t.Fatal("container securityContext: got none")
	}
	for _, tt := range []struct{ field, got, want string }{
		{"pod supplementalGroups", fmt.Sprint(pod.SupplementalGroups), "[2000 3000]"},
		{"pod supplementalGroupsPolicy", fmt.Sprint(deref(pod.SupplementalGroupsPolicy)), "Strict"},
		{"pod fsGroupChangePolicy", fmt.Sprint(deref(pod.FSGroupChangePolicy)), "OnRootMismatch"},
		{"pod seLinuxChangePolicy", fmt.Sprint(deref(pod.SELinuxChangePolicy)), "MountOption"},
		{"pod seLinuxOptions.level", fmt.Sprint(pod.SELinuxOptions), "&SELinuxOptions{User:,Role:,Type:,Level:s0:c123,c456,}"},
		{"pod appArmorProfile", fmt.Sprint(pod.AppArmorProfile.Type), "RuntimeDefault"},
		{"pod seccompProfile (the default, kept)", fmt.Sprint(pod.SeccompProfile.Type), "RuntimeDefault"},
		{"pod runAsUser (the default, kept)", fmt.Sprint(deref(pod.RunAsUser)), "65532"},
		{"pod sysctls", fmt.Sprint(pod.Sysctls), "[{net.ipv4.ip_local_port_range 1024 65535}]"},
		{"capabilities", fmt.Sprint(c.Capabilities.Drop, c.Capabilities.Add), "[ALL] [NET_BIND_SERVICE]"},
		{"procMount", fmt.Sprint(deref(c.ProcMount)), "Default"},
		{"seccompProfile", fmt.Sprint(c.SeccompProfile.Type, " ", deref(c.SeccompProfile.LocalhostProfile)), "Localhost profiles/dedupgw.json"},
		{"appArmorProfile", fmt.Sprint(c.AppArmorProfile.Type, " ", deref(c.AppArmorProfile.LocalhostProfile)), "Localhost k8s-dedupgw"},
		{"seLinuxOptions.type", c.SELinuxOptions.Type, "spc_t"},
		{"windowsOptions", fmt.Sprint(deref(c.WindowsOptions.RunAsUserName), " ", deref(c.WindowsOptions.HostProcess)), "ContainerUser false"},
		{"readOnlyRootFilesystem (the default, kept)", fmt.Sprint(deref(c.ReadOnlyRootFilesystem)), "true"},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: got %s, want %s", tt.field, tt.got, tt.want)
		}
	}
}

// deref returns *p, or the zero value for a nil p.
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// TestValuesRenderAsStrings checks that env values and the values of
// labels, annotations and node selectors given as numbers or booleans
// (--set env[0].value=200 for GOGC, prometheus.io/scrape: true) render as
// the strings Kubernetes requires, and that valueFrom entries pass through:
// decodeStrict decodes into the Kubernetes types, which refuse a number.
func TestValuesRenderAsStrings(t *testing.T) {
	r := decodeStrict(t, render(t, "dedupgw", "a", "ns",
		"--set", "env[0].name=GOGC", "--set", "env[0].value=200",
		"--set", "env[1].name=FLAG", "--set", "env[1].value=true",
		"--set", "env[2].name=POD", "--set", "env[2].valueFrom.fieldRef.fieldPath=metadata.name",
		"--set", `podAnnotations.prometheus\.io/scrape=true`,
		"--set", "podLabels.tier=2",
		"--set", "nodeSelector.zone=4",
		"--set", "service.annotations.n=3",
		"--set", "serviceAccount.annotations.s=6",
		"--set", "persistence.annotations.p=5",
		"--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.annotations.g=7",
		"--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.labels.release=8",
	))
	d := r.Deployments["a-dedupgw"]
	c := container(t, d.Spec.Template.Spec, "dedupgw")
	for name, want := range map[string]string{"GOGC": "200", "FLAG": "true"} {
		if e := env(c, name); e == nil || e.Value != want {
			t.Errorf("env %s: got %+v, want the string %q", name, e, want)
		}
	}
	if e := env(c, "POD"); e == nil || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("env POD: got %+v, want valueFrom.fieldRef metadata.name", e)
	}
	// A values file's numbers are float64 to Helm, and toString would write
	// 241591910 as 2.4159191e+08, which the gateway's runtime refuses as a
	// GOMEMLIMIT.
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("env:\n  - name: GOMEMLIMIT\n    value: 241591910\n  - name: RATIO\n    value: 0.5\npodAnnotations:\n  big: 1000000\n  none: null\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fd := decodeStrict(t, render(t, "dedupgw", "a", "ns", "-f", values)).Deployments["a-dedupgw"]
	fc := container(t, fd.Spec.Template.Spec, "dedupgw")
	for name, want := range map[string]string{"GOMEMLIMIT": "241591910", "RATIO": "0.5"} {
		if e := env(fc, name); e == nil || e.Value != want {
			t.Errorf("values file env %s: got %+v, want the string %q", name, e, want)
		}
	}
	if got := fd.Spec.Template.Annotations["big"]; got != "1000000" {
		t.Errorf("values file annotation big: got %q, want \"1000000\"", got)
	}
	if got, ok := fd.Spec.Template.Annotations["none"]; ok && got != "" {
		t.Errorf("values file annotation none: null: got %q, want it empty or left out", got)
	}

	for _, tt := range []struct {
		where string
		m     map[string]string
		key   string
		want  string
	}{
		{"pod annotations", d.Spec.Template.Annotations, "prometheus.io/scrape", "true"},
		{"pod labels", d.Spec.Template.Labels, "tier", "2"},
		{"node selector", d.Spec.Template.Spec.NodeSelector, "zone", "4"},
		{"service annotations", r.Services["a-dedupgw"].Annotations, "n", "3"},
		{"service account annotations", r.ServiceAccounts["a-dedupgw"].Annotations, "s", "6"},
		{"PVC annotations", r.PVCs["a-dedupgw-data"].Annotations, "p", "5"},
		{"dashboard annotations", r.ConfigMaps["a-dedupgw-dashboard"].Annotations, "g", "7"},
		{"dashboard labels", r.ConfigMaps["a-dedupgw-dashboard"].Labels, "grafana_dashboard", "1"},
		{"ServiceMonitor labels", r.ServiceMonitors["a-dedupgw"].Labels, "release", "8"},
	} {
		if got := tt.m[tt.key]; got != tt.want {
			t.Errorf("%s: got %s=%q, want %q", tt.where, tt.key, got, tt.want)
		}
	}
}

// TestPVCResourcePolicy checks that the bolt PVC survives `helm uninstall`
// by default, and that the policy can be switched off.
func TestPVCResourcePolicy(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want map[string]string
	}{
		{"default", nil, map[string]string{"helm.sh/resource-policy": "keep"}},
		{"off", []string{"--set", "persistence.resourcePolicy="}, nil},
		{"with other annotations", []string{"--set", "persistence.annotations.backup=daily"},
			map[string]string{"helm.sh/resource-policy": "keep", "backup": "daily"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := decodeStrict(t, render(t, "dedupgw", "a", "ns", tt.args...))
			pvc := r.PVCs["a-dedupgw-data"]
			if pvc == nil {
				t.Fatalf("no PVC a-dedupgw-data; got %v", keys(r.PVCs))
			}
			if len(pvc.Annotations) != len(tt.want) {
				t.Errorf("PVC annotations: got %v, want %v", pvc.Annotations, tt.want)
			}
			for k, v := range tt.want {
				if got := pvc.Annotations[k]; got != v {
					t.Errorf("PVC annotation %s: got %q, want %q", k, got, v)
				}
			}
		})
	}
	renderFails(t, []string{"--set", "persistence.resourcePolicy=delete"}, "/persistence/resourcePolicy")
}

// TestPublishedServiceKeepsAdminInside checks that a LoadBalancer or
// NodePort Service publishes the webhook port only: the admin port (/metrics,
// /readyz, /v1/keys) moves to a ClusterIP Service of its own, which the
// ServiceMonitor still finds, and the pods' ports are unchanged.
func TestPublishedServiceKeepsAdminInside(t *testing.T) {
	for _, typ := range []string{"ClusterIP", "LoadBalancer", "NodePort"} {
		for _, insecure := range []string{"false", "true"} {
			t.Run(typ+"/insecure="+insecure, func(t *testing.T) {
				r := decodeStrict(t, render(t, "dedupgw", "a", "ns", "--set", "service.type="+typ,
					"--set", "admin.insecure="+insecure, "--set", "serviceMonitor.enabled=true"))
				checkGatewayPods(t, r)
				main := r.Services["a-dedupgw"]
				if main == nil {
					t.Fatalf("no Service a-dedupgw; got %v", keys(r.Services))
				}
				if string(main.Spec.Type) != typ {
					t.Errorf("Service a-dedupgw type: got %q, want %q", main.Spec.Type, typ)
				}
				if p := servicePort(main, "http"); p == nil || p.Port != 8080 {
					t.Errorf("Service a-dedupgw: got ports %+v, want http on 8080", main.Spec.Ports)
				}
				adminSvc := main
				if typ != "ClusterIP" {
					if p := servicePort(main, "admin"); p != nil {
						t.Errorf("Service a-dedupgw (%s) publishes the admin port %d outside the cluster", typ, p.Port)
					}
					adminSvc = r.Services["a-dedupgw-admin"]
					if adminSvc == nil {
						t.Fatalf("no Service a-dedupgw-admin for the admin port; got %v", keys(r.Services))
					}
					if adminSvc.Spec.Type != "ClusterIP" {
						t.Errorf("Service a-dedupgw-admin type: got %q, want ClusterIP", adminSvc.Spec.Type)
					}
					if len(adminSvc.Spec.Ports) != 1 {
						t.Errorf("Service a-dedupgw-admin: got ports %+v, want only admin", adminSvc.Spec.Ports)
					}
				} else if len(r.Services) != 1 {
					t.Errorf("ClusterIP: got Services %v, want only a-dedupgw", keys(r.Services))
				}
				if p := servicePort(adminSvc, "admin"); p == nil || p.Port != 9090 {
					t.Errorf("Service %s: got ports %+v, want admin on 9090", adminSvc.Name, adminSvc.Spec.Ports)
				}
				sm := r.ServiceMonitors["a-dedupgw"]
				if sm == nil || len(sm.Spec.Endpoints) != 1 {
					t.Fatalf("ServiceMonitor a-dedupgw: got %+v", sm)
				}
				// The ServiceMonitor selects by labels: the Service holding its
				// port must carry them.
				if !selects(sm.Spec.Selector.MatchLabels, adminSvc.Labels) || servicePort(adminSvc, sm.Spec.Endpoints[0].Port) == nil {
					t.Errorf("ServiceMonitor %+v does not reach port %q of Service %s", sm.Spec, sm.Spec.Endpoints[0].Port, adminSvc.Name)
				}
			})
		}
	}
}

// TestLiteralSecretsRefused checks that a literal password, route secret or
// client_identity_secret fails the render (it would be stored in clear in the ConfigMap) without
// repeating the secret, while ${VAR} and ${file:PATH} references render.
func TestLiteralSecretsRefused(t *testing.T) {
	const literal = "hunter2-s3cret"
	stripe := []string{"--set", "routes[0].name=stripe", "--set", "routes[0].path=/stripe",
		"--set", "routes[0].upstream=http://shop:3000", "--set", "routes[0].provider=stripe"}
	api := []string{"--set", "routes[0].name=payments", "--set", "routes[0].path=/api/payments/*",
		"--set", "routes[0].upstream=http://shop:3000", "--set", "routes[0].provider=generic",
		"--set", "routes[0].keys[0]=header:Idempotency-Key", "--set", "routes[0].client_identity=Authorization"}
	redis := []string{"--set", "store.backend=redis"}
	tests := []struct {
		name    string
		args    []string
		wantErr []string // nil: renders
	}{
		{"redis password literal", slices.Concat(redis, []string{"--set-string", "store.redis.password=" + literal}),
			[]string{"store.redis.password", "existingSecret", "${REDIS_PASSWORD}"}},
		{"redis password reference", slices.Concat(redis, []string{"--set-string", "store.redis.password=${REDIS_PASSWORD}"}), nil},
		{"redis password empty", redis, nil},
		{"sentinel password literal", slices.Concat(redis, []string{"--set-string", "store.redis.sentinel_password=" + literal}),
			[]string{"store.redis.sentinel_password", "existingSecret", "${SENTINEL_PASSWORD}"}},
		{"sentinel password reference", slices.Concat(redis, []string{"--set", "store.redis.master_name=m", "--set-string", "store.redis.sentinel_password=${SENTINEL_PASSWORD}"}), nil},
		{"bolt: the password is not rendered", []string{"--set-string", "store.redis.password=" + literal}, nil},
		{"route secret literal", slices.Concat(stripe, []string{"--set-string", "routes[0].secrets[0]=${NEW},routes[0].secrets[1]=" + literal}),
			[]string{"routes[0].secrets[1]", `route "stripe"`, "existingSecret", "${WEBHOOK_SECRET}"}},
		{"route secret with a literal part", slices.Concat(stripe, []string{"--set-string", "routes[0].secrets[0]=whsec_${PART}"}),
			[]string{"routes[0].secrets[0]", "existingSecret"}},
		{"route secret references", slices.Concat(stripe, []string{"--set-string", "routes[0].secrets[0]=${NEW},routes[0].secrets[1]=${OLD}"}), nil},
		{"route secret file references", slices.Concat(stripe, []string{"--set-string", "routes[0].secrets[0]=${file:/var/run/secrets/dedupgw/stripe},routes[0].secrets[1]=${file:old}"}), nil},
		{"route secret with a literal part and a file", slices.Concat(stripe, []string{"--set-string", "routes[0].secrets[0]=whsec_${file:/s}"}),
			[]string{"routes[0].secrets[0]", "existingSecret", "${file:/path/to/key}"}},
		{"route secret file reference without a path", slices.Concat(stripe, []string{"--set-string", "routes[0].secrets[0]=${file:}"}),
			[]string{"routes[0].secrets[0]", "existingSecret"}},
		{"redis password file reference", slices.Concat(redis, []string{"--set-string", "store.redis.password=${file:/var/run/secrets/redis/password}"}), nil},
		{"client_identity_secret file reference", slices.Concat(api, []string{"--set-string", "routes[0].client_identity_secret=${file:/var/run/secrets/dedupgw/cis}"}), nil},
		{"client_identity_secret literal", slices.Concat(api, []string{"--set-string", "routes[0].client_identity_secret=" + literal}),
			[]string{"routes[0].client_identity_secret", `route "payments"`, "existingSecret", "${CLIENT_IDENTITY_SECRET}"}},
		{"client_identity_secret with a literal part", slices.Concat(api, []string{"--set-string", "routes[0].client_identity_secret=pepper-${PART}"}),
			[]string{"routes[0].client_identity_secret", "existingSecret"}},
		{"client_identity_secret reference", slices.Concat(api, []string{"--set-string", "routes[0].client_identity_secret=${CLIENT_IDENTITY_SECRET}"}), nil},
		{"admin token literal in env", []string{"--set", "env[0].name=DEDUPGW_ADMIN_TOKEN", "--set-string", "env[0].value=" + literal},
			[]string{"env[0] gives DEDUPGW_ADMIN_TOKEN a literal value", "valueFrom.secretKeyRef", "admin.tokenSecret.name"}},
		{"redis password literal in env", []string{"--set", "env[0].name=DEDUPGW_STORE_REDIS_PASSWORD", "--set-string", "env[0].value=" + literal},
			[]string{"env[0] gives DEDUPGW_STORE_REDIS_PASSWORD a literal value", "existingSecret"}},
		{"admin token from a Secret in env", []string{"--set", "env[0].name=DEDUPGW_ADMIN_TOKEN",
			"--set", "env[0].valueFrom.secretKeyRef.name=s", "--set", "env[0].valueFrom.secretKeyRef.key=k"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"template", "x", filepath.Join(charts, "dedupgw")}, tt.args...)
			if tt.wantErr == nil {
				out, err := helm(args...)
				if err != nil {
					t.Fatalf("render: got %v, want success", err)
				}
				if strings.Contains(string(out), literal) {
					t.Errorf("render holds the literal secret:\n%s", out)
				}
				decodeStrict(t, out)
				return
			}
			err := renderFails(t, tt.args, tt.wantErr...)
			// helm's error starts with the command line, which holds it.
			if msg := strings.Replace(err.Error(), strings.Join(args, " "), "", 1); strings.Contains(msg, literal) {
				t.Errorf("error message repeats the literal secret: %q", msg)
			}
		})
	}
}

// TestReadinessPath checks the readiness value: the store's reachability
// (/readyz) or the process's (/healthz).
func TestReadinessPath(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		// The default follows on_store_error: a route that fails open
		// must stay in the Service through a store outage.
		{"standalone default, failing open", nil, "/healthz"},
		{"standalone default, every route rejecting", []string{"--set", "defaults.on_store_error=reject"}, "/readyz"},
		{"standalone default, the route rejecting", []string{"--set-json", `routes=[{"name":"a","path":"/a","upstream":"http://a:3000","on_store_error":"reject"}]`}, "/readyz"},
		{"standalone default, one route failing open", []string{"--set", "defaults.on_store_error=reject", "--set-json",
			`routes=[{"name":"a","path":"/a","upstream":"http://a:3000"},{"name":"b","path":"/b","upstream":"http://b:3000","on_store_error":"forward"}]`}, "/healthz"},
		// The gateway takes DEDUPGW_DEFAULTS_ON_STORE_ERROR over defaults.
		{"standalone default, env fails routes open", []string{"--set", "defaults.on_store_error=reject", "--set-json",
			`env=[{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR","value":"forward"}]`}, "/healthz"},
		{"standalone default, env makes routes reject", []string{"--set-json",
			`env=[{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR","value":"reject"}]`}, "/readyz"},
		{"standalone default, env from a Secret", []string{"--set", "defaults.on_store_error=reject", "--set-json",
			`env=[{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR","valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}]`}, "/healthz"},
		// Kubernetes keeps the last of duplicate entries.
		{"standalone default, env's last entry rejects", []string{"--set-json",
			`env=[{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR","value":"forward"},{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR","value":"reject"}]`}, "/readyz"},
		{"standalone default, env's last entry fails open", []string{"--set-json",
			`env=[{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR","value":"reject"},{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR","value":"forward"}]`}, "/healthz"},
		// The gateway ignores the variable set empty or blank (and warns):
		// defaults' applies.
		{"standalone default, env without a value", []string{"--set", "defaults.on_store_error=reject", "--set-json",
			`env=[{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR"}]`}, "/readyz"},
		{"standalone default, env blank", []string{"--set", "defaults.on_store_error=reject", "--set-json",
			`env=[{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR","value":" "}]`}, "/readyz"},
		{"standalone default, env blank over forward", []string{"--set-json",
			`env=[{"name":"DEDUPGW_DEFAULTS_ON_STORE_ERROR","value":""}]`}, "/healthz"},
		{"standalone process", []string{"--set", "readiness=process", "--set", "defaults.on_store_error=reject"}, "/healthz"},
		{"standalone store", []string{"--set", "readiness=store"}, "/readyz"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A lease longer than every upstream_timeout here, or the chart
			// refuses the render as the gateway would refuse the config.
			args := append([]string{"--set-string", "defaults.lease=2h"}, tt.args...)
			r := decodeStrict(t, render(t, "dedupgw", "a", "ns", args...))
			d := r.deployment(t, "a-dedupgw")
			c := container(t, d.Spec.Template.Spec, "dedupgw")
			if got := c.ReadinessProbe.HTTPGet.Path; got != tt.want {
				t.Errorf("readiness path: got %s, want %s", got, tt.want)
			}
		})
	}
	renderFails(t, []string{"--set", "readiness=always"}, "/readiness")

	// In sidecar mode the gateway's readiness is the pod's: /healthz even
	// when every route rejects on a store error, unless asked for.
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"sidecar, every route rejecting", []string{"--set", "dedupgw.defaults.on_store_error=reject"}, "/healthz"},
		{"sidecar, store asked for", []string{"--set", "dedupgw.readiness=store"}, "/readyz"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := decodeStrict(t, render(t, "examples/sidecar-app", "shop", "shop", tt.args...))
			c := container(t, r.deployment(t, "shop-shop").Spec.Template.Spec, "dedupgw")
			if got := c.ReadinessProbe.HTTPGet.Path; got != tt.want {
				t.Errorf("readiness path: got %s, want %s", got, tt.want)
			}
		})
	}
}

// TestPDBCounts checks that 0 is a count, not "unset" (it rendered 1), and
// that a percentage renders as one.
func TestPDBCounts(t *testing.T) {
	redis := []string{"--set", "store.backend=redis", "--set", "store.redis.addrs[0]=r:6379", "--set", "replicaCount=2"}
	tests := []struct {
		name     string
		args     []string
		min, max string // want, as IntOrString's String(); "" for unset
	}{
		{"default", nil, "", "1"},
		{"maxUnavailable 0", []string{"--set", "podDisruptionBudget.maxUnavailable=0"}, "", "0"},
		{"minAvailable 0, over the default maxUnavailable", []string{"--set", "podDisruptionBudget.minAvailable=0"}, "0", ""},
		{"minAvailable 1", []string{"--set", "podDisruptionBudget.minAvailable=1"}, "1", ""},
		{"a percentage", []string{"--set-string", "podDisruptionBudget.maxUnavailable=50%"}, "", "50%"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pdb := decodeStrict(t, render(t, "dedupgw", "a", "ns", append(redis, tt.args...)...)).PDBs["a-dedupgw"]
			if pdb == nil {
				t.Fatal("got no PodDisruptionBudget")
			}
			str := func(v *intstr.IntOrString) string {
				if v == nil {
					return ""
				}
				return v.String()
			}
			if got := str(pdb.Spec.MinAvailable); got != tt.min {
				t.Errorf("minAvailable: got %q, want %q", got, tt.min)
			}
			if got := str(pdb.Spec.MaxUnavailable); got != tt.max {
				t.Errorf("maxUnavailable: got %q, want %q", got, tt.max)
			}
		})
	}
}

// TestVersionLabel checks that a tag a label cannot hold (too long, or with
// a character labels refuse) still renders a valid app.kubernetes.io/version.
func TestVersionLabel(t *testing.T) {
	for _, tag := range []string{"0.1.0", "v1.2.3-build." + strings.Repeat("x", 80) + "-", "sha+meta"} {
		d := decodeStrict(t, render(t, "dedupgw", "a", "ns", "--set-string", "image.tag="+tag)).Deployments["a-dedupgw"]
		got := d.Labels["app.kubernetes.io/version"]
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 || got == "" {
			t.Errorf("tag %q: got version label %q, want a valid one: %v", tag, got, errs)
		}
		if !strings.HasSuffix(container(t, d.Spec.Template.Spec, "dedupgw").Image, ":"+tag) {
			t.Errorf("tag %q: got image %q, want the tag unchanged", tag, container(t, d.Spec.Template.Spec, "dedupgw").Image)
		}
	}
}

// TestNamesYAMLWouldType checks that a release name, namespace or other name
// YAML would read as a boolean or a number ("no", "123") renders as the
// string Kubernetes requires.
func TestNamesYAMLWouldType(t *testing.T) {
	for _, name := range []string{"no", "on", "123"} {
		r := decodeStrict(t, render(t, "dedupgw", name, name, "--set", "serviceMonitor.enabled=true",
			"--set-string", "priorityClassName=1000", "--set-string", "serviceAccount.name=true"))
		d := r.Deployments[name+"-dedupgw"]
		if d == nil {
			t.Fatalf("release %q: got no Deployment %s-dedupgw", name, name)
		}
		if got := d.Spec.Selector.MatchLabels["app.kubernetes.io/instance"]; got != name {
			t.Errorf("release %q: got instance label %q, want %q", name, got, name)
		}
		if got := d.Spec.Template.Spec.PriorityClassName; got != "1000" {
			t.Errorf("release %q: got priorityClassName %q, want \"1000\"", name, got)
		}
		if got := d.Spec.Template.Spec.ServiceAccountName; got != "true" {
			t.Errorf("release %q: got serviceAccountName %q, want \"true\"", name, got)
		}
		if sm := r.ServiceMonitors[name+"-dedupgw"]; sm == nil || len(sm.Spec.NamespaceSelector.MatchNames) != 1 || sm.Spec.NamespaceSelector.MatchNames[0] != name {
			t.Errorf("release %q: got ServiceMonitor %+v, want namespace %q selected", name, sm, name)
		}
	}
}

// TestVarRefsForNumbers checks that the config's integer and boolean keys
// take a ${VAR} reference, as the gateway does (it expands them at start).
func TestVarRefsForNumbers(t *testing.T) {
	r := decodeStrict(t, render(t, "dedupgw", "a", "ns",
		"--set", "store.backend=redis", "--set", "store.redis.addrs[0]=r:6379",
		"--set-string", "defaults.max_body_bytes=${MAX_BODY}", "--set-string", "store.redis.tls=${REDIS_TLS}",
		"--set-string", "store.redis.db=${REDIS_DB}", "--set-string", "store.redis.wait_replicas=${WAIT}"))
	_, raw := configOf(t, r.ConfigMaps["a-dedupgw"])
	for _, want := range []string{"max_body_bytes: ${MAX_BODY}", "tls: ${REDIS_TLS}", "db: ${REDIS_DB}", "wait_replicas: ${WAIT}"} {
		if !strings.Contains(raw, want) {
			t.Errorf("got config.yaml\n%s\nwant it to hold %q", raw, want)
		}
	}
}

// TestNetworkPolicy checks networkPolicy: off by default; on, it selects the
// gateway's pods and admits the webhook port from webhookFrom (anyone when
// empty) and the admin port only from adminFrom (no one when empty).
func TestNetworkPolicy(t *testing.T) {
	if r := decodeStrict(t, render(t, "dedupgw", "a", "ns")); len(r.NetworkPolicies) != 0 {
		t.Errorf("default values: got NetworkPolicies %v, want none", keys(r.NetworkPolicies))
	}
	tests := []struct {
		name                string
		args                []string
		wantWebhookFrom     int // peers of the webhook rule; 0: from anyone
		wantAdminFrom       int // peers of the admin rule; 0: no admin rule
		wantAdminNamespaces string
	}{
		{"no peers", nil, 0, 0, ""},
		{"Prometheus's namespace", []string{"--set", "networkPolicy.adminFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring"}, 0, 1, "monitoring"},
		{"an ingress controller's namespace and Prometheus", []string{
			"--set", "networkPolicy.webhookFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=ingress-nginx",
			"--set", "networkPolicy.adminFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
		}, 1, 1, "monitoring"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--set", "networkPolicy.enabled=true"}, tt.args...)
			r := decodeStrict(t, render(t, "dedupgw", "a", "ns", args...))
			np := r.NetworkPolicies["a-dedupgw"]
			if np == nil {
				t.Fatalf("no NetworkPolicy a-dedupgw; got %v", keys(r.NetworkPolicies))
			}
			d := r.deployment(t, "a-dedupgw")
			if !selects(np.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) {
				t.Errorf("podSelector %v does not select the gateway's pods %v", np.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels)
			}
			if got := np.Spec.PolicyTypes; !slices.Equal(got, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
				t.Errorf("policyTypes: got %v, want [Ingress] (egress is left to the cluster)", got)
			}
			c := container(t, d.Spec.Template.Spec, "dedupgw")
			port := func(rule networkingv1.NetworkPolicyIngressRule) int32 {
				if len(rule.Ports) != 1 || rule.Ports[0].Port == nil {
					t.Fatalf("rule ports: got %+v, want one named port", rule.Ports)
				}
				for _, p := range c.Ports {
					if p.Name == rule.Ports[0].Port.String() {
						return p.ContainerPort
					}
				}
				t.Fatalf("rule port %q is no port of the gateway container (%+v)", rule.Ports[0].Port.String(), c.Ports)
				return 0
			}
			wantRules := 1
			if tt.wantAdminFrom > 0 {
				wantRules = 2
			}
			if len(np.Spec.Ingress) != wantRules {
				t.Fatalf("ingress rules: got %d (%+v), want %d", len(np.Spec.Ingress), np.Spec.Ingress, wantRules)
			}
			webhook := np.Spec.Ingress[0]
			if got := port(webhook); got != 8080 {
				t.Errorf("first rule's port: got %d, want the webhook port 8080", got)
			}
			if got := len(webhook.From); got != tt.wantWebhookFrom {
				t.Errorf("webhook rule: got %d peers (%+v), want %d", got, webhook.From, tt.wantWebhookFrom)
			}
			if tt.wantAdminFrom == 0 {
				return
			}
			admin := np.Spec.Ingress[1]
			if got := port(admin); got != 9090 {
				t.Errorf("second rule's port: got %d, want the admin port 9090", got)
			}
			if len(admin.From) != tt.wantAdminFrom || admin.From[0].NamespaceSelector == nil ||
				admin.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != tt.wantAdminNamespaces {
				t.Errorf("admin rule: got peers %+v, want the namespace %s", admin.From, tt.wantAdminNamespaces)
			}
		})
	}
}
