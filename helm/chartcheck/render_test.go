package chartcheck

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite helm/examples/sidecar-deployment.yaml from the example chart")

// charts is the temporary copy of helm/dedupgw and helm/examples/sidecar-app
// (with its dependency built) that every test renders; the work tree is never
// written to, except by -update.
var charts string

// helmBin is the helm binary the tests run.
var helmBin string

func TestMain(m *testing.M) {
	flag.Parse()
	code, err := setup()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chartcheck:", err)
		os.Exit(1)
	}
	if code < 0 {
		os.Exit(0)
	}
	code = m.Run()
	os.RemoveAll(charts)
	os.Exit(code)
}

// setup finds helm and prepares the charts. It returns -1 when helm is
// missing outside CI (the tests are skipped), and an error in CI.
func setup() (int, error) {
	var err error
	helmBin, err = findHelm()
	if err != nil {
		if os.Getenv("CI") == "true" {
			return 0, err
		}
		fmt.Fprintf(os.Stderr, "chartcheck: SKIP all: %v (run .ci/helm-check.sh, which installs it)\n", err)
		return -1, nil
	}
	charts, err = os.MkdirTemp("", "chartcheck-")
	if err != nil {
		return 0, fmt.Errorf("make temp dir: %w", err)
	}
	for _, d := range []string{"dedupgw", "examples/sidecar-app"} {
		if err := copyDir(filepath.Join("..", d), filepath.Join(charts, d)); err != nil {
			return 0, fmt.Errorf("copy chart %s: %w", d, err)
		}
	}
	if _, err := helm("dependency", "update", "--skip-refresh", filepath.Join(charts, "examples/sidecar-app")); err != nil {
		return 0, fmt.Errorf("build the example's dependency: %w", err)
	}
	return 0, nil
}

// findHelm returns $HELM, helm on PATH, or $(go env GOPATH)/bin/helm.
func findHelm() (string, error) {
	if h := os.Getenv("HELM"); h != "" {
		return h, nil
	}
	if h, err := exec.LookPath("helm"); err == nil {
		return h, nil
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		h := filepath.Join(strings.TrimSpace(string(out)), "bin", "helm")
		if _, err := os.Stat(h); err == nil {
			return h, nil
		}
	}
	return "", errors.New("no helm binary ($HELM, PATH, $GOPATH/bin)")
}

// helm runs the helm binary with its caches in the temp dir and returns stdout.
// The error carries stderr.
func helm(args ...string) ([]byte, error) {
	cmd := exec.Command(helmBin, args...)
	home := filepath.Join(charts, ".helm")
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			if d.Name() == "charts" && path != src {
				return filepath.SkipDir // a stale local dependency build
			}
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}

// rendered is one `helm template` output, decoded strictly into API types.
type rendered struct {
	Deployments     map[string]*appsv1.Deployment
	Services        map[string]*corev1.Service
	ConfigMaps      map[string]*corev1.ConfigMap
	PVCs            map[string]*corev1.PersistentVolumeClaim
	PDBs            map[string]*policyv1.PodDisruptionBudget
	ServiceAccounts map[string]*corev1.ServiceAccount
	Secrets         map[string]*corev1.Secret
	ServiceMonitors map[string]*serviceMonitor
	NetworkPolicies map[string]*networkingv1.NetworkPolicy
	PrometheusRules map[string]*prometheusRule
	Kinds           []string
}

// serviceMonitor is the subset of monitoring.coreos.com/v1 ServiceMonitor that
// the chart renders. Decoding strictly into it catches misspelt fields; the
// full CRD type lives in prometheus-operator, a large module this check does
// not pull in.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			MatchNames []string `json:"matchNames,omitempty"`
			Any        bool     `json:"any,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// prometheusRule is monitoring.coreos.com/v1 PrometheusRule as the chart
// renders it, decoded strictly; TestPrometheusRule also hands its spec to
// Prometheus's own rule-file parser.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for,omitempty"`
				Labels      map[string]string `json:"labels,omitempty"`
				Annotations map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	} `json:"spec"`
}

// decodeStrict splits a multi-document stream and decodes every document into
// the API type of its kind with yaml.UnmarshalStrict: unknown fields, wrong
// types and duplicate keys fail, and so does a kind the check does not know.
func decodeStrict(t *testing.T, stream []byte) *rendered {
	t.Helper()
	r, err := decode(stream)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// decode is decodeStrict returning its first error.
func decode(stream []byte) (*rendered, error) {
	r := &rendered{
		Deployments:     map[string]*appsv1.Deployment{},
		Services:        map[string]*corev1.Service{},
		ConfigMaps:      map[string]*corev1.ConfigMap{},
		PVCs:            map[string]*corev1.PersistentVolumeClaim{},
		PDBs:            map[string]*policyv1.PodDisruptionBudget{},
		ServiceAccounts: map[string]*corev1.ServiceAccount{},
		Secrets:         map[string]*corev1.Secret{},
		ServiceMonitors: map[string]*serviceMonitor{},
		NetworkPolicies: map[string]*networkingv1.NetworkPolicy{},
		PrometheusRules: map[string]*prometheusRule{},
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("split rendered YAML: %w", err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("read kind of document: %w\n%s", err, doc)
		}
		if tm.Kind == "" && tm.APIVersion == "" {
			continue // only comments
		}
		gvk := tm.APIVersion + "/" + tm.Kind
		r.Kinds = append(r.Kinds, tm.Kind)
		var obj interface{ GetName() string }
		switch gvk {
		case "apps/v1/Deployment":
			o := &appsv1.Deployment{}
			err = strict(doc, o)
			r.Deployments[o.Name] = o
			obj = o
		case "v1/Service":
			o := &corev1.Service{}
			err = strict(doc, o)
			r.Services[o.Name] = o
			obj = o
		case "v1/ConfigMap":
			o := &corev1.ConfigMap{}
			err = strict(doc, o)
			r.ConfigMaps[o.Name] = o
			obj = o
		case "v1/PersistentVolumeClaim":
			o := &corev1.PersistentVolumeClaim{}
			err = strict(doc, o)
			r.PVCs[o.Name] = o
			obj = o
		case "policy/v1/PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			err = strict(doc, o)
			r.PDBs[o.Name] = o
			obj = o
		case "v1/ServiceAccount":
			o := &corev1.ServiceAccount{}
			err = strict(doc, o)
			r.ServiceAccounts[o.Name] = o
			obj = o
		case "v1/Secret":
			o := &corev1.Secret{}
			err = strict(doc, o)
			r.Secrets[o.Name] = o
			obj = o
		case "networking.k8s.io/v1/NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			err = strict(doc, o)
			r.NetworkPolicies[o.Name] = o
			obj = o
		case "monitoring.coreos.com/v1/ServiceMonitor":
			o := &serviceMonitor{}
			err = strict(doc, o)
			r.ServiceMonitors[o.Name] = o
			obj = o
		case "monitoring.coreos.com/v1/PrometheusRule":
			o := &prometheusRule{}
			err = strict(doc, o)
			r.PrometheusRules[o.Name] = o
			obj = o
		default:
			return nil, fmt.Errorf("rendered %s, which this check cannot decode: add its API type", gvk)
		}
		if err != nil {
			return nil, err
		}
		if obj.GetName() == "" {
			return nil, fmt.Errorf("a %s has no metadata.name", gvk)
		}
	}
	return r, nil
}

// strict decodes doc into into with yaml.UnmarshalStrict (unknown fields,
// wrong types, duplicate keys), then again with the API server's own
// case-sensitive JSON decoder: encoding/json, under UnmarshalStrict, takes
// "targetport" for targetPort, which the API server would drop.
func strict(doc []byte, into any) error {
	if err := yaml.UnmarshalStrict(doc, into); err != nil {
		return fmt.Errorf("strict decode into %T: %w\ndocument:\n%s", into, err, doc)
	}
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("convert to JSON: %w", err)
	}
	strictErrs, err := kjson.UnmarshalStrict(js, into, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err == nil && len(strictErrs) > 0 {
		err = errors.Join(strictErrs...)
	}
	if err != nil {
		return fmt.Errorf("case-sensitive strict decode into %T: %w\ndocument:\n%s", into, err, doc)
	}
	return nil
}

// gatewayConfig is the part of the gateway's config.yaml the checks read.
type gatewayConfig struct {
	Listen string `json:"listen"`
	Admin  struct {
		Listen   string `json:"listen"`
		Insecure bool   `json:"insecure"`
	} `json:"admin"`
	Server map[string]any `json:"server"`
	Store  struct {
		Backend string         `json:"backend"`
		Bolt    map[string]any `json:"bolt"`
		Redis   map[string]any `json:"redis"`
	} `json:"store"`
	Defaults struct {
		UpstreamTimeout string `json:"upstream_timeout"`
		OnStoreError    string `json:"on_store_error"`
	} `json:"defaults"`
	Routes []struct {
		Name            string `json:"name"`
		Upstream        string `json:"upstream"`
		UpstreamTimeout string `json:"upstream_timeout"`
		OnStoreError    string `json:"on_store_error"`
	} `json:"routes"`
}

// everyRouteRejects reports whether every route of c has on_store_error:
// reject, its own or its defaults'.
func (c gatewayConfig) everyRouteRejects() bool {
	for _, r := range c.Routes {
		v := r.OnStoreError
		if v == "" {
			v = c.Defaults.OnStoreError
		}
		if !strings.EqualFold(v, "reject") {
			return false
		}
	}
	return true
}

// configOf parses the config.yaml held by a ConfigMap.
func configOf(t *testing.T, cm *corev1.ConfigMap) (gatewayConfig, string) {
	t.Helper()
	raw, ok := cm.Data["config.yaml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no config.yaml; keys: %v", cm.Name, keys(cm.Data))
	}
	var c gatewayConfig
	if err := yaml.Unmarshal([]byte(raw), &c); err != nil {
		t.Fatalf("ConfigMap %s: config.yaml is not YAML: %v\n%s", cm.Name, err, raw)
	}
	return c, raw
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// render runs helm template on a chart copy with a values file from testdata.
func render(t *testing.T, chart, release, namespace string, args ...string) []byte {
	t.Helper()
	all := append([]string{"template", release, filepath.Join(charts, chart), "--namespace", namespace}, args...)
	out, err := helm(all...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// renderFails renders the dedupgw chart (release "x") with args, fails t
// unless helm refuses with an error holding every string of want, and
// returns that error.
func renderFails(t *testing.T, args []string, want ...string) error {
	t.Helper()
	out, err := helm(append([]string{"template", "x", filepath.Join(charts, "dedupgw")}, args...)...)
	if err == nil {
		t.Fatalf("render succeeded, want an error containing %q; output:\n%s", want, out)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error: got %q, want it to contain %q", err, w)
		}
	}
	return err
}

// TestDecodeRejects shows that the strict decode is strict: each document
// here is a small mistake a template could make.
func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{"unknown field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\nspec:\n  replica: 1\n", `unknown field "replica"`},
		{"wrong type", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\nspec:\n  replicas: three\n", "cannot unmarshal string"},
		{"misplaced field", "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec:\n  ports:\n    - port: 80\n      targetport: http\n", `unknown field "spec.ports[0].targetport"`},
		{"duplicate key", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {a: x, a: y}\n", `key "a" already set`},
		{"unknown kind", "apiVersion: batch/v1\nkind: Job\nmetadata: {name: a}\n", "cannot decode"},
		{"ServiceMonitor typo", "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: a}\nspec:\n  endpoints:\n    - port: admin\n      intervall: 30s\n", `unknown field "intervall"`},
		{"no name", "apiVersion: v1\nkind: ServiceAccount\nmetadata: {}\n", "no metadata.name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decode([]byte("---\n# Source: x\n" + tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got error %v, want one containing %q", err, tt.want)
			}
		})
	}
	if _, err := decode([]byte("---\n# only a comment\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: ok}\n")); err != nil {
		t.Errorf("valid stream: got error %v, want none", err)
	}
}
