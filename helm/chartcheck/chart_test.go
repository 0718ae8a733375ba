package chartcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// gatewayUID is the numeric user the image runs as.
const gatewayUID = 65532

// valueSets are the renders every test below works on.
var valueSets = []struct {
	name      string
	chart     string // under the temp copy of helm/
	values    string // under testdata/
	release   string
	namespace string
	check     func(t *testing.T, r *rendered)
}{
	{
		name: "standalone bolt", chart: "dedupgw", values: "standalone-bolt.yaml",
		release: "hooks", namespace: "edge",
		check: func(t *testing.T, r *rendered) {
			wantKinds(t, r, map[string]int{"Deployment": 1, "Service": 1, "ConfigMap": 2, "Secret": 1, "PersistentVolumeClaim": 1, "PodDisruptionBudget": 1, "ServiceAccount": 1, "ServiceMonitor": 1})
			d := r.deployment(t, "hooks-dedupgw")
			if got := *d.Spec.Replicas; got != 1 {
				t.Errorf("replicas: got %d, want 1", got)
			}
			if got := d.Spec.Strategy.Type; got != appsv1.RecreateDeploymentStrategyType {
				t.Errorf("strategy: got %q, want Recreate (one pod owns the bolt file)", got)
			}
			pvc := r.PVCs["hooks-dedupgw-data"]
			if pvc == nil {
				t.Fatalf("no PVC hooks-dedupgw-data; got %v", keys(r.PVCs))
			}
			if got := pvc.Spec.Resources.Requests.Storage().String(); got != "2Gi" {
				t.Errorf("PVC size: got %s, want 2Gi", got)
			}
			if got := ptrString(pvc.Spec.StorageClassName); got != "fast" {
				t.Errorf("PVC storageClassName: got %q, want fast", got)
			}
			if got := pvc.Annotations["helm.sh/resource-policy"]; got != "keep" {
				t.Errorf("PVC annotation helm.sh/resource-policy: got %q, want keep (helm uninstall must not delete the keys)", got)
			}
			vol := volume(d.Spec.Template.Spec, "dedupgw-data")
			if vol == nil || vol.PersistentVolumeClaim == nil || vol.PersistentVolumeClaim.ClaimName != pvc.Name {
				t.Errorf("data volume: got %+v, want the PVC %s", vol, pvc.Name)
			}
			cfg, _ := configOf(t, r.ConfigMaps["hooks-dedupgw"])
			if cfg.Store.Backend != "bolt" {
				t.Errorf("store.backend: got %q, want bolt", cfg.Store.Backend)
			}
			if cfg.Admin.Insecure {
				t.Errorf("admin.insecure: got true, want it absent (the chart generates a token)")
			}
			c := container(t, d.Spec.Template.Spec, "dedupgw")
			checkGeneratedToken(t, r, c, "hooks-dedupgw-admin")
			if got := envFromSecrets(c); !slices.Equal(got, []string{"webhook-secrets"}) {
				t.Errorf("envFrom secrets: got %v, want [webhook-secrets]", got)
			}
			sm := r.ServiceMonitors["hooks-dedupgw"]
			if sm == nil {
				t.Fatalf("no ServiceMonitor hooks-dedupgw")
			}
			svc := r.Services["hooks-dedupgw"]
			if len(sm.Spec.Endpoints) != 1 || servicePort(svc, sm.Spec.Endpoints[0].Port) == nil || sm.Spec.Endpoints[0].Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoints: got %+v, want /metrics on a port of Service %s", sm.Spec.Endpoints, svc.Name)
			}
			if got := sm.Labels["release"]; got != "prometheus" {
				t.Errorf("ServiceMonitor label release: got %q, want prometheus", got)
			}
			dash := r.ConfigMaps["hooks-dedupgw-dashboard"]
			if dash == nil {
				t.Fatalf("no dashboard ConfigMap; got %v", keys(r.ConfigMaps))
			}
			if got := dash.Labels["grafana_dashboard"]; got != "1" {
				t.Errorf("dashboard label grafana_dashboard: got %q, want 1", got)
			}
			if !json.Valid([]byte(dash.Data["dedupgw.json"])) {
				t.Errorf("dashboard dedupgw.json is not valid JSON")
			}
		},
	},
	{
		name: "standalone redis, 3 replicas", chart: "dedupgw", values: "standalone-redis.yaml",
		release: "dedupgw", namespace: "edge",
		check: func(t *testing.T, r *rendered) {
			wantKinds(t, r, map[string]int{"Deployment": 1, "Service": 1, "ConfigMap": 1, "PodDisruptionBudget": 1, "ServiceAccount": 1})
			d := r.Deployments["dedupgw"]
			if d == nil {
				t.Fatalf("no Deployment dedupgw (release name contains the chart name); got %v", keys(r.Deployments))
			}
			if got := *d.Spec.Replicas; got != 3 {
				t.Errorf("replicas: got %d, want 3", got)
			}
			if d.Spec.Strategy.RollingUpdate == nil || d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
				t.Errorf("strategy: got %+v, want a RollingUpdate with maxUnavailable 0", d.Spec.Strategy)
			}
			if len(r.PVCs) != 0 {
				t.Errorf("PVCs: got %v, want none with redis", keys(r.PVCs))
			}
			if v := volume(d.Spec.Template.Spec, "dedupgw-data"); v != nil {
				t.Errorf("data volume: got %+v, want none with redis", v)
			}
			cfg, raw := configOf(t, r.ConfigMaps["dedupgw"])
			if cfg.Store.Backend != "redis" {
				t.Errorf("store.backend: got %q, want redis", cfg.Store.Backend)
			}
			if got := cfg.Server["read_header_timeout"]; got != "5s" {
				t.Errorf("server.read_header_timeout: got %v, want the values' 5s passed through", got)
			}
			if got := len(cfg.Store.Redis["addrs"].([]any)); got != 3 {
				t.Errorf("store.redis.addrs: got %d addresses, want 3", got)
			}
			if cfg.Store.Bolt != nil {
				t.Errorf("store.bolt rendered with the redis backend: %v", cfg.Store.Bolt)
			}
			if cfg.Admin.Insecure {
				t.Errorf("admin.insecure: got true, want it absent when a token secret is set")
			}
			if !strings.Contains(raw, "${REDIS_PASSWORD}") {
				t.Errorf("config.yaml lost the ${REDIS_PASSWORD} reference:\n%s", raw)
			}
			c := container(t, d.Spec.Template.Spec, "dedupgw")
			tok := env(c, "DEDUPGW_ADMIN_TOKEN")
			if tok == nil || tok.ValueFrom == nil || tok.ValueFrom.SecretKeyRef == nil ||
				tok.ValueFrom.SecretKeyRef.Name != "dedupgw-admin" || tok.ValueFrom.SecretKeyRef.Key != "token" {
				t.Errorf("DEDUPGW_ADMIN_TOKEN: got %+v, want secretKeyRef dedupgw-admin/token", tok)
			}
			pdb := r.PDBs["dedupgw"]
			if pdb == nil || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 2 || pdb.Spec.MaxUnavailable != nil {
				t.Errorf("PDB: got %+v, want minAvailable 2 only", pdb)
			}
			if got := len(d.Spec.Template.Spec.TopologySpreadConstraints); got != 1 {
				t.Errorf("topologySpreadConstraints: got %d, want 1", got)
			}
		},
	},
	{
		name: "sidecar example", chart: "examples/sidecar-app", values: "sidecar.yaml",
		release: "shop", namespace: "shop",
		check: func(t *testing.T, r *rendered) {
			wantKinds(t, r, map[string]int{"Deployment": 1, "Service": 1, "ConfigMap": 1})
			d := r.deployment(t, "shop-shop")
			if got := *d.Spec.Replicas; got != 3 {
				t.Errorf("replicas: got %d, want 3 (redis: any count)", got)
			}
			ps := d.Spec.Template.Spec
			if got := len(ps.Containers); got != 2 {
				t.Fatalf("containers: got %d, want the app and the sidecar", got)
			}
			app := container(t, ps, "shop")
			checkShutdownOrder(t, r, d, app, 35, 50)
			appPort := containerPort(app, "http")
			if appPort == nil || appPort.ContainerPort != 3001 {
				t.Fatalf("app port: got %+v, want http 3001 (the app keeps its own port)", appPort)
			}
			cfg, _ := configOf(t, r.ConfigMaps["shop-dedupgw-sidecar"])
			for _, rt := range cfg.Routes {
				if rt.Upstream != "http://127.0.0.1:3001" {
					t.Errorf("route %s upstream: got %q, want http://127.0.0.1:3001 (the app in the same pod)", rt.Name, rt.Upstream)
				}
			}
			svc := r.Services["shop-shop"]
			hook := servicePort(svc, "webhooks")
			if hook == nil || hook.TargetPort.StrVal != "dedupgw-http" {
				t.Errorf("Service port webhooks: got %+v, want targetPort dedupgw-http (providers call the sidecar)", hook)
			}
			direct := servicePort(svc, "http")
			if direct == nil || direct.TargetPort.StrVal != "http" {
				t.Errorf("Service port http: got %+v, want targetPort http (the app keeps its port)", direct)
			}
			if cfg.Store.Backend != "redis" {
				t.Errorf("store.backend: got %q, want redis", cfg.Store.Backend)
			}
		},
	},
	{
		name: "sidecar on bolt", chart: "examples/sidecar-app", values: "sidecar-bolt.yaml",
		release: "shop", namespace: "shop",
		check: func(t *testing.T, r *rendered) {
			wantKinds(t, r, map[string]int{"Deployment": 1, "Service": 1, "ConfigMap": 1})
			d := r.Deployments["shop-shop"]
			v := volume(d.Spec.Template.Spec, "dedupgw-data")
			if v == nil || v.EmptyDir == nil {
				t.Errorf("sidecar bolt data volume: got %+v, want an emptyDir", v)
			}
			cfg, _ := configOf(t, r.ConfigMaps["shop-dedupgw-sidecar"])
			if cfg.Store.Backend != "bolt" || !cfg.Admin.Insecure {
				t.Errorf("config: got backend %q insecure %v, want bolt and true", cfg.Store.Backend, cfg.Admin.Insecure)
			}
		},
	},
}

// TestValueSets renders every value set, decodes it strictly, runs the
// checks every gateway pod must pass, then the set's own checks.
func TestValueSets(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			out := render(t, vs.chart, vs.release, vs.namespace, "-f", filepath.Join("testdata", vs.values))
			r := decodeStrict(t, out)
			checkGatewayPods(t, r)
			vs.check(t, r)
		})
	}
}

// TestRenderFailures checks that impossible values stop the render with a
// message that names the value to change.
func TestRenderFailures(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"bolt with 3 replicas", []string{"--set", "replicaCount=3"},
			[]string{"store.backend=bolt", "replicaCount must be 1 (got 3)", "store.backend=redis"}},
		// values.schema.json catches these before any template runs.
		{"unknown backend", []string{"--set", "store.backend=mongo"},
			[]string{"/store/backend", "bolt", "redis", "memory"}},
		{"unknown mode", []string{"--set", "mode=daemonset"},
			[]string{"/mode", "standalone", "sidecar"}},
		{"misspelt top-level key", []string{"--set", "replicas=3"},
			[]string{"additional properties 'replicas' not allowed"}},
		{"port as a string", []string{"--set-string", "ports.http=8080"},
			[]string{"/ports/http"}},
		{"route without upstream", []string{"--set", "routes[0].name=a", "--set", "routes[0].path=/a"},
			[]string{"upstream"}},
		{"no routes", []string{"--set", "routes=null"},
			[]string{"routes is empty"}},
		{"misspelt key under defaults", []string{"--set", "defaults.windw=1h"},
			[]string{"/defaults", "additional properties 'windw' not allowed"}},
		{"misspelt key under a route", []string{"--set", "routes[0].name=a", "--set", "routes[0].path=/a",
			"--set", "routes[0].upstream=http://a:3000", "--set", "routes[0].upstram_timeout=60s"},
			[]string{"/routes/0", "additional properties 'upstram_timeout' not allowed"}},
		{"misspelt key under a route's signature", []string{"--set", "routes[0].name=a", "--set", "routes[0].path=/a",
			"--set", "routes[0].upstream=http://a:3000", "--set", "routes[0].signature.algo=sha1"},
			[]string{"/routes/0/signature", "additional properties 'algo' not allowed"}},
		{"misspelt key under server", []string{"--set", "server.idle=1m"},
			[]string{"/server", "additional properties 'idle' not allowed"}},
		{"misspelt key under store.redis", []string{"--set", "store.redis.pasword=x"},
			[]string{"/store/redis", "additional properties 'pasword' not allowed"}},
		{"duration as a number", []string{"--set", "defaults.upstream_timeout=30"},
			[]string{"/defaults/upstream_timeout", "want string"}},
		{"duration without a unit", []string{"--set-string", "defaults.window=24"},
			[]string{"/defaults/window", "does not match pattern"}},
		{"list as a string", []string{"--set", "routes[0].name=a", "--set", "routes[0].path=/a",
			"--set", "routes[0].upstream=http://a:3000", "--set", "routes[0].keys=body"},
			[]string{"/routes/0/keys", "want array"}},
		{"unknown policy value", []string{"--set", "defaults.on_store_error=ignore"},
			[]string{"/defaults/on_store_error", "forward", "reject"}},
		{"redis without addresses", []string{"--set", "store.backend=redis", "--set", "store.redis.addrs=null"},
			[]string{"store.backend=redis needs store.redis.addrs"}},
		// The gateway refuses these at start-up: the pod would crash-loop.
		{"upstream_timeout beyond the default lease", []string{"--set", "defaults.upstream_timeout=90s"},
			[]string{`routes[0] (route "example"): lease 60s must be longer than upstream_timeout 90s`}},
		{"a route's lease as long as its upstream_timeout", []string{"--set", "routes[0].name=a", "--set", "routes[0].path=/a",
			"--set", "routes[0].upstream=http://a:3000", "--set", "routes[0].keys={body}", "--set", "routes[0].lease=30s"},
			[]string{`routes[0] (route "a"): lease 30s must be longer than upstream_timeout 30s`}},
		{"equal durations written two ways", []string{"--set", "defaults.lease=1m", "--set", "defaults.upstream_timeout=60000ms"},
			[]string{`lease 1m must be longer than upstream_timeout 60000ms`}},
		{"a route's upstream_timeout beyond the defaults' lease", []string{"--set", "defaults.lease=2m",
			"--set", "routes[0].name=a", "--set", "routes[0].path=/a", "--set", "routes[0].upstream=http://a:3000",
			"--set", "routes[0].keys={body}", "--set", "routes[0].upstream_timeout=3m"},
			[]string{`lease 2m must be longer than upstream_timeout 3m`}},
		// A null (or an empty key in a values file) deletes the value before
		// the schema runs: without "required", replicaCount became 0 pods,
		// and ports, sizes and the image rendered 0 or nothing.
		{"replicaCount null", []string{"--set", "replicaCount=null"}, []string{"missing property 'replicaCount'"}},
		{"a port null", []string{"--set", "ports.http=null"}, []string{"/ports", "missing property 'http'"}},
		{"the service port null", []string{"--set", "service.port=null"}, []string{"/service", "missing property 'port'"}},
		{"the volume size null", []string{"--set", "persistence.size=null"}, []string{"/persistence", "missing property 'size'"}},
		{"the image repository null", []string{"--set", "image.repository=null"}, []string{"/image", "missing property 'repository'"}},
		{"a probe null", []string{"--set", "livenessProbe=null"}, []string{"missing property 'livenessProbe'"}},
		{"a pull secret as a bare name", []string{"--set", "imagePullSecrets[0]=regcred"}, []string{"/imagePullSecrets/0", "want object"}},
		{"a PDB count that is not one", []string{"--set-string", "podDisruptionBudget.maxUnavailable=one"}, []string{"/podDisruptionBudget/maxUnavailable"}},
		// These render, and then the pod crash-loops or dedups alone.
		{"memory with 2 replicas", []string{"--set", "store.backend=memory", "--set", "replicaCount=2"},
			[]string{"store.backend=memory", "replicaCount must be 1 (got 2)"}},
		{"a bolt path outside the volume", []string{"--set", "store.bolt.path=/data/dedupgw.db"},
			[]string{`store.bolt.path "/data/dedupgw.db" is outside the data volume mounted at /var/lib/dedupgw/`}},
		{"one port for both listeners", []string{"--set", "ports.admin=8080"}, []string{"ports.http and ports.admin are both 8080"}},
		{"one Service port for both", []string{"--set", "service.port=9090"}, []string{"service.port and service.adminPort are both 9090"}},
		{"a pod label the selector uses", []string{"--set", `podLabels.app\.kubernetes\.io/instance=other`},
			[]string{"podLabels.app.kubernetes.io/instance: the chart sets this label itself"}},
		{"a listen override in env", []string{"--set", "env[0].name=DEDUPGW_ADMIN_LISTEN", "--set", "env[0].value=:9999"},
			[]string{"env[0] sets DEDUPGW_ADMIN_LISTEN", "set ports.admin in the values instead"}},
		{"an upstream_timeout override in env", []string{"--set", "env[0].name=DEDUPGW_DEFAULTS_UPSTREAM_TIMEOUT", "--set", "env[0].value=5m"},
			[]string{"env[0] sets DEDUPGW_DEFAULTS_UPSTREAM_TIMEOUT", "defaults.upstream_timeout"}},
		{"a negative window", []string{"--set-string", "defaults.window=-1h"}, []string{`defaults.window: "-1h" must be greater than 0`}},
		{"a zero failed_retention", []string{"--set-string", "defaults.failed_retention=0s"}, []string{`defaults.failed_retention: "0s" must be greater than 0`}},
		{"a negative route tolerance", []string{"--set", "routes[0].name=a", "--set", "routes[0].path=/a", "--set", "routes[0].upstream=http://a:3000",
			"--set", "routes[0].keys={body}", "--set-string", "routes[0].tolerance=-5m"}, []string{`routes[0].tolerance: "-5m" must be greater than 0`}},
		{"a zero server timeout", []string{"--set-string", "server.idle_timeout=0"}, []string{`server.idle_timeout: "0" must be greater than 0`}},
		{"a negative dial timeout", []string{"--set-string", "store.redis.dial_timeout=-1s"}, []string{`store.redis.dial_timeout: "-1s" must not be negative`}},
		{"a scrape timeout beyond the interval", []string{"--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.interval=5s"},
			[]string{"serviceMonitor.scrapeTimeout 10s is longer than serviceMonitor.interval 5s"}},
		{"a rolling update on bolt", []string{"--set", "strategy.rollingUpdate.maxSurge=0"},
			[]string{"strategy.type=RollingUpdate with store.backend=bolt", "Recreate"}},
		{"a toleration value as a boolean", []string{"--set", "tolerations[0].key=k", "--set", "tolerations[0].value=true"},
			[]string{"/tolerations/0/value", "want string"}},
		{"a number as text that is no ${VAR}", []string{"--set-string", "defaults.max_body_bytes=abc"},
			[]string{"/defaults/max_body_bytes", "want integer", "does not match pattern"}},
		{"a tag in the repository", []string{"--set", "image.repository=ghcr.io/x/dedupgw:0.1.0"},
			[]string{`image.repository "ghcr.io/x/dedupgw:0.1.0" holds a tag or digest`}},
		{"a digest without its algorithm", []string{"--set", "image.digest=0123abc"}, []string{"/image/digest", "does not match pattern"}},
		{"a second probe handler", []string{"--set", "livenessProbe.httpGet.path=/live"},
			[]string{"/livenessProbe", "additional properties 'httpGet' not allowed"}},
		{"a probe timing as a string", []string{"--set-string", "readinessProbe.periodSeconds=10"},
			[]string{"/readinessProbe/periodSeconds", "want integer"}},
		{"a security context field as a string", []string{"--set-string", "securityContext.runAsUser=1000"},
			[]string{"/securityContext/runAsUser", "want integer"}},
		{"dropped capabilities as a string", []string{"--set", "securityContext.capabilities.drop=ALL"},
			[]string{"/securityContext/capabilities/drop", "want array"}},
		{"a seccomp profile type misspelt", []string{"--set", "podSecurityContext.seccompProfile.type=runtimedefault"},
			[]string{"/podSecurityContext/seccompProfile/type", "RuntimeDefault"}},
		{"a seccomp profile without its type", []string{"--set", "podSecurityContext.seccompProfile=null", "--set", "securityContext.seccompProfile.localhostProfile=p.json"},
			[]string{"/securityContext/seccompProfile", "missing property 'type'"}},
		{"supplemental groups as strings", []string{"--set-string", "podSecurityContext.supplementalGroups[0]=1000"},
			[]string{"/podSecurityContext/supplementalGroups/0", "want integer"}},
		{"an SELinux level as a number", []string{"--set", "securityContext.seLinuxOptions.level=0"},
			[]string{"/securityContext/seLinuxOptions/level", "want string"}},
		{"a misspelt security-context field", []string{"--set", "securityContext.readOnlyRootFileSystem=true"},
			[]string{"/securityContext", "additional properties 'readOnlyRootFileSystem' not allowed"}},
		{"a misspelt capabilities field", []string{"--set", "securityContext.capabilities.Drop={ALL}"},
			[]string{"/securityContext/capabilities", "additional properties 'Drop' not allowed"}},
		{"a Localhost profile without its file", []string{"--set", "securityContext.seccompProfile.type=Localhost"},
			[]string{"/securityContext/seccompProfile", "localhostProfile"}},
		{"a pull secret in sidecar mode", []string{"--set", "mode=sidecar", "--set", "imagePullSecrets[0].name=reg"},
			[]string{"imagePullSecrets is set, but in sidecar mode the chart renders no pod"}},
		{"a ServiceMonitor in sidecar mode", []string{"--set", "mode=sidecar", "--set", "serviceMonitor.enabled=true"},
			[]string{"serviceMonitor.enabled is set, but in sidecar mode"}},
		{"a NetworkPolicy in sidecar mode", []string{"--set", "mode=sidecar", "--set", "networkPolicy.enabled=true"},
			[]string{"networkPolicy.enabled is set, but in sidecar mode"}},
		{"an alert label that is not a string", []string{"--set", "prometheusRule.enabled=true", "--set", "prometheusRule.alertLabels.team.name=payments"},
			[]string{"/prometheusRule/alertLabels/team"}},
		{"a misspelt prometheusRule key", []string{"--set", "prometheusRule.alertlabels.team=payments"},
			[]string{"/prometheusRule", "additional properties 'alertlabels' not allowed"}},
		{"an unknown signature algorithm", []string{"--set", "routes[0].name=a", "--set", "routes[0].path=/a", "--set", "routes[0].upstream=http://x", "--set", "routes[0].provider=generic", "--set", "routes[0].keys[0]=body", "--set", "routes[0].signature.algorithm=md5"},
			[]string{"/routes/0/signature/algorithm"}},
		{"a structured header's separator", []string{"--set", "routes[0].name=a", "--set", "routes[0].path=/a", "--set", "routes[0].upstream=http://x", "--set", "routes[0].provider=generic", "--set", "routes[0].keys[0]=body", "--set", "routes[0].signature.separator=|"},
			[]string{"/routes/0/signature/separator"}},
		{"a NetworkPolicy peer that is not a mapping", []string{"--set", "networkPolicy.enabled=true", "--set", "networkPolicy.adminFrom[0]=monitoring"},
			[]string{"/networkPolicy/adminFrom/0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			renderFails(t, tt.args, tt.want...)
		})
	}
}

// TestChecksumFollowsConfig checks that the pod annotation changes exactly
// when config.yaml does, so `helm upgrade` rolls the pods on a config change.
func TestChecksumFollowsConfig(t *testing.T) {
	routes := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(routes, []byte(`routes:
  - name: example
    path: /webhooks/example
    upstream: http://example-app:3000
    provider: generic
    keys: ["header:Idempotency-Key", "header:Webhook-Id", "body"]
    window: 48h
`), 0o600); err != nil {
		t.Fatal(err)
	}
	annotation := func(args ...string) string {
		t.Helper()
		r := decodeStrict(t, render(t, "dedupgw", "a", "ns", args...))
		return r.Deployments["a-dedupgw"].Spec.Template.Annotations["checksum/config"]
	}
	base := annotation()
	tests := []struct {
		name     string
		args     []string
		wantSame bool
	}{
		{"same values", nil, true},
		{"unrelated value", []string{"--set", "resources.requests.cpu=100m"}, true},
		{"route window", []string{"-f", routes}, false},
		{"log level", []string{"--set", "log.level=debug"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := annotation(tt.args...)
			if (got == base) != tt.wantSame {
				t.Errorf("checksum %s vs base %s: got same=%v, want same=%v", got, base, got == base, tt.wantSame)
			}
		})
	}
}

// TestSidecarExampleManifest keeps helm/examples/sidecar-deployment.yaml (the
// worked example for kubectl users) equal to the example chart's render.
// Regenerate it with `go test -run TestSidecarExampleManifest -update`.
func TestSidecarExampleManifest(t *testing.T) {
	golden := filepath.Join("..", "examples", "sidecar-deployment.yaml")
	out := render(t, "examples/sidecar-app", "shop", "shop")
	want := append([]byte("# Generated by `helm template shop helm/examples/sidecar-app --namespace shop`\n"+
		"# (helm/chartcheck keeps it current: go test -run TestSidecarExampleManifest -update).\n"+
		"# Create the Secret shop-webhook-secrets (STRIPE_WEBHOOK_SECRET, REDIS_PASSWORD,\n"+
		"# DEDUPGW_ADMIN_TOKEN) first.\n"), out...)
	if *update {
		if err := os.WriteFile(golden, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("read %s: %v (run with -update to create it)", golden, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale: got %d bytes, want the %d-byte render; run go test -run TestSidecarExampleManifest -update", golden, len(got), len(want))
	}
	r := decodeStrict(t, got)
	checkGatewayPods(t, r)
}

// TestLint runs `helm lint --strict` on the chart and the example.
func TestLint(t *testing.T) {
	for _, chart := range []string{"dedupgw", "examples/sidecar-app"} {
		t.Run(chart, func(t *testing.T) {
			if out, err := helm("lint", "--strict", filepath.Join(charts, chart)); err != nil {
				t.Errorf("helm lint --strict %s: %v\n%s", chart, err, out)
			}
		})
	}
}

// TestRenderedConfigValidates runs every rendered config.yaml through the real
// `dedupgw validate`. It needs the gateway to build (one directory up); outside
// CI a gateway that does not build yet skips the test.
func TestRenderedConfigValidates(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "dedupgw")
	build := exec.Command("go", "build", "-o", bin, "./cmd/dedupgw")
	build.Dir = filepath.Join("..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("build the gateway: %v\n%s", err, out)
		}
		t.Skipf("the gateway does not build yet: %v\n%s", err, out)
	}
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			r := decodeStrict(t, render(t, vs.chart, vs.release, vs.namespace, "-f", filepath.Join("testdata", vs.values)))
			for _, d := range r.Deployments {
				ps := d.Spec.Template.Spec
				c := container(t, ps, "dedupgw")
				cm := r.ConfigMaps[volume(ps, "dedupgw-config").ConfigMap.Name]
				file := filepath.Join(t.TempDir(), "config.yaml")
				if err := os.WriteFile(file, []byte(cm.Data["config.yaml"]), 0o600); err != nil {
					t.Fatal(err)
				}
				cmd := exec.Command(bin, "validate", "--config", file)
				// The environment the pod would have: the container's env
				// (secret references get a placeholder) and the variables a
				// Secret would provide through envFrom.
				cmd.Env = append(os.Environ(),
					"STRIPE_WEBHOOK_SECRET=whsec_test", "REDIS_PASSWORD=secret",
					"GITHUB_WEBHOOK_SECRET=gh1", "GITHUB_WEBHOOK_SECRET_OLD=gh0",
					"SVIX_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "PADDLE_WEBHOOK_SECRET=pdl_ntfset_test",
				)
				for _, e := range c.Env {
					v := e.Value
					switch {
					case e.ValueFrom != nil:
						v = "from-a-secret"
					}
					cmd.Env = append(cmd.Env, e.Name+"="+v)
				}
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("dedupgw validate on ConfigMap %s: %v\n%s\nconfig:\n%s", cm.Name, err, out, cm.Data["config.yaml"])
				}
			}
		})
	}
}

// checkGatewayPods checks every pod that runs the gateway container: the
// security context, probes on the admin port, the ports config.yaml listens
// on, mounts, and the config checksum annotation.
func checkGatewayPods(t *testing.T, r *rendered) {
	t.Helper()
	found := 0
	for _, d := range r.Deployments {
		ps := d.Spec.Template.Spec
		idx := slices.IndexFunc(ps.Containers, func(c corev1.Container) bool { return c.Name == "dedupgw" })
		if idx < 0 {
			continue
		}
		found++
		c := &ps.Containers[idx]
		sidecar := len(ps.Containers) > 1
		httpName, adminName := "http", "admin"
		if sidecar {
			httpName, adminName = "dedupgw-http", "dedupgw-admin"
		}

		// The Go runtime's soft memory limit: 90 % of the container's.
		if lim, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && !lim.IsZero() {
			want := strconv.FormatInt(lim.Value()*9/10, 10)
			if e := env(c, "GOMEMLIMIT"); e == nil || e.Value != want {
				t.Errorf("%s: GOMEMLIMIT: got %+v, want value %s (90 %% of limits.memory %s)", d.Name, e, want, lim.String())
			}
		}

		// Selector must match the pod labels, or the Deployment is rejected.
		for k, v := range d.Spec.Selector.MatchLabels {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("%s: selector %s=%s does not match pod labels %v", d.Name, k, v, d.Spec.Template.Labels)
			}
		}

		// Security context: non-root, read-only root, no escalation, no capabilities.
		sc := c.SecurityContext
		if sc == nil {
			t.Fatalf("%s: dedupgw container has no securityContext", d.Name)
		}
		if !ptrTrue(sc.ReadOnlyRootFilesystem) {
			t.Errorf("%s: readOnlyRootFilesystem: got %v, want true", d.Name, sc.ReadOnlyRootFilesystem)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation: got %v, want false", d.Name, sc.AllowPrivilegeEscalation)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: capabilities.drop: got %+v, want ALL", d.Name, sc.Capabilities)
		}
		nonRoot := ptrTrue(sc.RunAsNonRoot) || (ps.SecurityContext != nil && ptrTrue(ps.SecurityContext.RunAsNonRoot))
		if !nonRoot {
			t.Errorf("%s: runAsNonRoot not set on the container or the pod", d.Name)
		}
		if sc.RunAsUser == nil || *sc.RunAsUser != gatewayUID {
			t.Errorf("%s: runAsUser: got %v, want %d", d.Name, sc.RunAsUser, gatewayUID)
		}
		if ps.SecurityContext == nil || ps.SecurityContext.FSGroup == nil || *ps.SecurityContext.FSGroup != gatewayUID {
			t.Errorf("%s: pod fsGroup: want %d so the gateway can write its data volume", d.Name, gatewayUID)
		}

		// DEDUPGW_* is the prefix of config overrides; service links must
		// not inject DEDUPGW_SERVICE_HOST and friends.
		if ps.EnableServiceLinks == nil || *ps.EnableServiceLinks {
			t.Errorf("%s: enableServiceLinks: got %v, want false", d.Name, ps.EnableServiceLinks)
		}

		// Config: mounted from a rendered ConfigMap, and the one serve reads.
		if want := []string{"serve", "--config", "/etc/dedupgw/config.yaml"}; !slices.Equal(c.Args, want) {
			t.Errorf("%s: args: got %v, want %v", d.Name, c.Args, want)
		}
		cfgVol := volume(ps, "dedupgw-config")
		if cfgVol == nil || cfgVol.ConfigMap == nil {
			t.Fatalf("%s: no dedupgw-config ConfigMap volume", d.Name)
		}
		cm := r.ConfigMaps[cfgVol.ConfigMap.Name]
		if cm == nil {
			t.Fatalf("%s: volume refers to ConfigMap %q, which is not rendered; got %v", d.Name, cfgVol.ConfigMap.Name, keys(r.ConfigMaps))
		}
		cfg, raw := configOf(t, cm)
		if mount := volumeMount(c, "dedupgw-config"); mount == nil || mount.MountPath != "/etc/dedupgw" || !mount.ReadOnly {
			t.Errorf("%s: config mount: got %+v, want read-only at /etc/dedupgw", d.Name, mount)
		}
		annotation := "checksum/config"
		if sidecar {
			annotation = "checksum/dedupgw-config"
		}
		if got, want := d.Spec.Template.Annotations[annotation], sha256Hex(strings.TrimSuffix(raw, "\n")); got != want {
			t.Errorf("%s: annotation %s: got %q, want sha256 of config.yaml %q", d.Name, annotation, got, want)
		}

		// Ports: named as the probes and Services expect, equal to config.yaml's.
		for _, p := range []struct{ name, listen string }{{httpName, cfg.Listen}, {adminName, cfg.Admin.Listen}} {
			cp := containerPort(c, p.name)
			_, port, err := net.SplitHostPort(p.listen)
			if err != nil {
				t.Errorf("%s: config listen address %q: %v", d.Name, p.listen, err)
				continue
			}
			if cp == nil || itoa(cp.ContainerPort) != port {
				t.Errorf("%s: container port %s: got %+v, want %s (config.yaml)", d.Name, p.name, cp, port)
			}
		}
		seen := map[string]bool{}
		for _, ctr := range ps.Containers {
			for _, p := range ctr.Ports {
				for _, k := range []string{"name:" + p.Name, "port:" + itoa(p.ContainerPort)} {
					if seen[k] {
						t.Errorf("%s: two containers use container %s", d.Name, k)
					}
					seen[k] = true
				}
			}
		}

		// Probes: liveness /healthz on the admin port; readiness /readyz
		// (the store) standalone when every route rejects on a store error,
		// else /healthz (a route failing open must stay in the Service, and
		// a sidecar's readiness is the pod's), as the readiness value
		// defaults.
		ready := "/healthz"
		if !sidecar && cfg.everyRouteRejects() {
			ready = "/readyz"
		}
		for _, p := range []struct {
			kind  string
			probe *corev1.Probe
			path  string
		}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, ready}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				t.Errorf("%s: %s probe: got %+v, want an httpGet", d.Name, p.kind, p.probe)
				continue
			}
			if p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.StrVal != adminName {
				t.Errorf("%s: %s probe: got %s on %s, want %s on %s", d.Name, p.kind, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), p.path, adminName)
			}
		}

		// The admin listener is on the pod IP for the probes: the gateway
		// refuses that without a token unless admin.insecure says so.
		if host, _, _ := net.SplitHostPort(cfg.Admin.Listen); host != "127.0.0.1" && host != "localhost" {
			if !cfg.Admin.Insecure && env(c, "DEDUPGW_ADMIN_TOKEN") == nil {
				t.Errorf("%s: admin listens on %q with neither a token nor admin.insecure", d.Name, cfg.Admin.Listen)
			}
		}

		// Every mount has a volume; bolt's file is on a writable mount.
		for _, m := range c.VolumeMounts {
			if volume(ps, m.Name) == nil {
				t.Errorf("%s: mount %s has no volume", d.Name, m.Name)
			}
		}
		if cfg.Store.Backend == "bolt" {
			path, _ := cfg.Store.Bolt["path"].(string)
			ok := false
			for _, m := range c.VolumeMounts {
				if !m.ReadOnly && strings.HasPrefix(path, m.MountPath+"/") {
					ok = true
				}
			}
			if !ok {
				t.Errorf("%s: bolt path %q is on no writable mount (the root filesystem is read-only)", d.Name, path)
			}
		}
		for _, v := range ps.Volumes {
			if v.PersistentVolumeClaim != nil && r.PVCs[v.PersistentVolumeClaim.ClaimName] == nil {
				t.Errorf("%s: volume %s claims %s, which is not rendered", d.Name, v.Name, v.PersistentVolumeClaim.ClaimName)
			}
		}

		// The kubelet must not kill the gateway mid-drain: the drain lasts up
		// to the longest upstream_timeout + 5 s.
		drain := drainSeconds(t, cfg)
		if g := ps.TerminationGracePeriodSeconds; g == nil || *g < drain+5 {
			t.Errorf("%s: terminationGracePeriodSeconds: got %v, want at least %d (drain %d s + 5)", d.Name, ptrInt64(g), drain+5, drain)
		}

		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			t.Errorf("%s: resource requests: got %v, want cpu and memory", d.Name, c.Resources.Requests)
		}
	}
	if found == 0 {
		t.Fatalf("no Deployment runs a dedupgw container; kinds: %v", r.Kinds)
	}

	// Every Service port targets a named port of the pods it selects.
	for _, svc := range r.Services {
		for _, sp := range svc.Spec.Ports {
			if sp.TargetPort.StrVal == "" {
				t.Errorf("Service %s port %s: targetPort should be a port name", svc.Name, sp.Name)
				continue
			}
			ok := false
			for _, d := range r.Deployments {
				if !selects(svc.Spec.Selector, d.Spec.Template.Labels) {
					continue
				}
				for _, ctr := range d.Spec.Template.Spec.Containers {
					if containerPort(&ctr, sp.TargetPort.StrVal) != nil {
						ok = true
					}
				}
			}
			if !ok {
				t.Errorf("Service %s port %s: targetPort %s is no container port of the selected pods", svc.Name, sp.Name, sp.TargetPort.StrVal)
			}
		}
	}
}

func wantKinds(t *testing.T, r *rendered, want map[string]int) {
	t.Helper()
	got := map[string]int{}
	for _, k := range r.Kinds {
		got[k]++
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s objects: got %d, want %d (all: %v)", k, got[k], n, got)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s objects: %d (all: %v)", k, got[k], got)
		}
	}
}

// deployment returns the rendered Deployment named name, failing t when
// there is none.
func (r *rendered) deployment(t *testing.T, name string) *appsv1.Deployment {
	t.Helper()
	d := r.Deployments[name]
	if d == nil {
		t.Fatalf("no Deployment %s; got %v", name, keys(r.Deployments))
	}
	return d
}

func container(t *testing.T, ps corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range ps.Containers {
		if ps.Containers[i].Name == name {
			return &ps.Containers[i]
		}
	}
	t.Fatalf("no container %s", name)
	return nil
}

func containerPort(c *corev1.Container, name string) *corev1.ContainerPort {
	for i := range c.Ports {
		if c.Ports[i].Name == name {
			return &c.Ports[i]
		}
	}
	return nil
}

func servicePort(svc *corev1.Service, name string) *corev1.ServicePort {
	if svc == nil {
		return nil
	}
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].Name == name {
			return &svc.Spec.Ports[i]
		}
	}
	return nil
}

func volume(ps corev1.PodSpec, name string) *corev1.Volume {
	for i := range ps.Volumes {
		if ps.Volumes[i].Name == name {
			return &ps.Volumes[i]
		}
	}
	return nil
}

func volumeMount(c *corev1.Container, name string) *corev1.VolumeMount {
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].Name == name {
			return &c.VolumeMounts[i]
		}
	}
	return nil
}

func env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func envFromSecrets(c *corev1.Container) []string {
	var names []string
	for _, e := range c.EnvFrom {
		if e.SecretRef != nil {
			names = append(names, e.SecretRef.Name)
		}
	}
	return names
}

func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

func ptrTrue(b *bool) bool { return b != nil && *b }

func ptrInt64(n *int64) any {
	if n == nil {
		return nil
	}
	return *n
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

// TestSidecarExampleRefusesASharedPort checks that the example chart refuses
// an app port the sidecar already listens on in the same pod.
func TestSidecarExampleRefusesASharedPort(t *testing.T) {
	for _, port := range []string{"8080", "9090"} {
		_, err := helm("template", "shop", filepath.Join(charts, "examples/sidecar-app"), "--set", "app.port="+port)
		if err == nil || !strings.Contains(err.Error(), "app.port "+port+" is also the dedupgw sidecar's port") {
			t.Errorf("app.port=%s: got %v, want the render refused for the shared port", port, err)
		}
	}
}

// TestSidecarExampleRoutesFollowAppPort checks that the example chart refuses
// a route that still forwards to the pod's loopback on another port than
// app.port (values.yaml cannot derive the one from the other), and renders
// once the routes follow.
func TestSidecarExampleRoutesFollowAppPort(t *testing.T) {
	chart := filepath.Join(charts, "examples/sidecar-app")
	tests := []struct {
		name      string
		port      int
		upstreams [2]string // the stripe and orders routes'
		want      string    // "" renders
	}{
		{"the example's own", 3000, [2]string{"http://127.0.0.1:3000", "http://127.0.0.1:3000"}, ""},
		{"app.port moved and the routes did not", 3001, [2]string{"http://127.0.0.1:3000", "http://127.0.0.1:3000"},
			`dedupgw.routes[0].upstream (route "stripe") is http://127.0.0.1:3000, the pod's loopback on port 3000, but the app listens on app.port 3001: point it at http://127.0.0.1:3001`},
		{"one route followed", 3001, [2]string{"http://127.0.0.1:3001", "http://127.0.0.1:3000"},
			`dedupgw.routes[1].upstream (route "orders") is http://127.0.0.1:3000,`},
		{"localhost is the loopback too", 3000, [2]string{"http://127.0.0.1:3000", "http://localhost:4000"},
			`dedupgw.routes[1].upstream (route "orders") is http://localhost:4000, the pod's loopback on port 4000, but the app listens on app.port 3000: point it at http://localhost:3000`},
		{"both routes followed", 3001, [2]string{"http://127.0.0.1:3001", "http://localhost:3001"}, ""},
		{"no port is the scheme's", 3001, [2]string{"http://127.0.0.1:3001", "http://127.0.0.1/hooks"},
			`dedupgw.routes[1].upstream (route "orders") is http://127.0.0.1/hooks, the pod's loopback on port 80, but the app listens on app.port 3001: point it at http://127.0.0.1:3001/hooks`},
		{"LOCALHOST. is localhost", 3001, [2]string{"http://LOCALHOST.:3000", "http://127.0.0.1:3001"},
			`dedupgw.routes[0].upstream (route "stripe") is http://LOCALHOST.:3000, the pod's loopback on port 3000`},
		{"a port with a leading zero is that port", 3001, [2]string{"http://127.0.0.1:03001", "http://[0:0:0:0:0:0:0:1]:3001"}, ""},
		{"a host name starting 127. is not loopback", 3001, [2]string{"http://127.0.0.1:3001", "http://127.example.com:3000"}, ""},
		{"IPv6 loopback", 3001, [2]string{"http://[::1]:3000", "http://127.0.0.1:3001"},
			`dedupgw.routes[0].upstream (route "stripe") is http://[::1]:3000, the pod's loopback on port 3000, but the app listens on app.port 3001: point it at http://[::1]:3001`},
		{"IPv6 loopback followed", 3001, [2]string{"http://[::1]:3001", "http://127.0.0.2:3001"}, ""},
		{"an app on port 80 needs none", 80, [2]string{"http://127.0.0.1", "http://localhost:80"}, ""},
		{"another host is not checked", 3001, [2]string{"http://127.0.0.1:3001", "http://billing.shop.svc:3000"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			values := filepath.Join(t.TempDir(), "values.yaml")
			yaml := fmt.Sprintf(`app:
  port: %d
dedupgw:
  routes:
    - {name: stripe, path: /webhooks/stripe, upstream: %q, provider: stripe, secrets: ["${STRIPE_WEBHOOK_SECRET}"]}
    - {name: orders, path: /hooks/orders, upstream: %q, provider: generic, keys: ["body"]}
`, tt.port, tt.upstreams[0], tt.upstreams[1])
			if err := os.WriteFile(values, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := helm("template", "shop", chart, "-f", values)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("got %v, want it rendered", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("got %v, want the render refused with %q", err, tt.want)
			}
		})
	}
}

// TestReadmeRecipesRender renders the chart with every route of the
// README's "Recipes for other providers" as its routes: the values schema
// must accept each documented scheme (a signature algorithm, a structured
// header, on_other_method), and each route must reach the config.
func TestReadmeRecipesRender(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n#### Recipes for other providers\n")
	if !ok {
		t.Fatal("README: no section \"Recipes for other providers\"")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var values strings.Builder
	values.WriteString("routes:\n")
	var names []string
	for _, block := range strings.Split(section, "```yaml\n")[1:] {
		snippet, _, _ := strings.Cut(block, "```")
		values.WriteString(snippet)
		if _, rest, ok := strings.Cut(snippet, "  - name: "); ok {
			name, _, _ := strings.Cut(rest, "\n")
			names = append(names, name)
		}
	}
	if len(names) < 10 {
		t.Fatalf("README recipes: got %d (%q), want at least 10", len(names), names)
	}
	file := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(file, []byte(values.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	r := decodeStrict(t, render(t, "dedupgw", "x", "default", "-f", file))
	var config string
	for _, cm := range r.ConfigMaps {
		config += cm.Data["config.yaml"]
	}
	for _, name := range names {
		if !strings.Contains(config, "name: "+name+"\n") {
			t.Errorf("rendered config: got no route %q, want every recipe's", name)
		}
	}
}
