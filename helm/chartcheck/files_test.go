package chartcheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// secretMountValues mounts the Secret webhook-secrets as a directory (no
// subPath: a subPath mount is never updated, so a rotated secret would not
// reach the gateway) and has a route read its secret from it with
// ${file:...}. prefix is "" for the dedupgw chart, "dedupgw." for the
// sidecar example's values.
func secretMountValues(t *testing.T, prefix string) string {
	t.Helper()
	indent := ""
	if prefix != "" {
		indent = "  "
	}
	text := `extraVolumes:
  - name: webhook-secrets
    secret:
      secretName: webhook-secrets
extraVolumeMounts:
  - name: webhook-secrets
    mountPath: /var/run/secrets/dedupgw
    readOnly: true
routes:
  - name: stripe
    path: /webhooks/stripe
    upstream: http://127.0.0.1:3001
    provider: stripe
    window: 72h
    secrets: ["${file:/var/run/secrets/dedupgw/stripe}", "${file:/var/run/secrets/dedupgw/stripe-old}"]
`
	if prefix != "" {
		lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
		for i, l := range lines {
			lines[i] = indent + l
		}
		text = "dedupgw:\n" + strings.Join(lines, "\n") + "\n"
	}
	path := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

var (
	gatewayOnce sync.Once
	gatewayBin  string
	gatewayErr  error
	gatewayOut  []byte
)

// gateway builds the dedupgw binary once (one directory up) and returns
// its path; outside CI a gateway that does not build skips the test.
func gateway(t *testing.T) string {
	t.Helper()
	gatewayOnce.Do(func() {
		dir, err := os.MkdirTemp("", "chartcheck-gw-")
		if err != nil {
			gatewayErr = err
			return
		}
		gatewayBin = filepath.Join(dir, "dedupgw")
		build := exec.Command("go", "build", "-o", gatewayBin, "./cmd/dedupgw")
		build.Dir = filepath.Join("..", "..")
		gatewayOut, gatewayErr = build.CombinedOutput()
	})
	if gatewayErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("build the gateway: %v\n%s", gatewayErr, gatewayOut)
		}
		t.Skipf("the gateway does not build yet: %v\n%s", gatewayErr, gatewayOut)
	}
	return gatewayBin
}

// TestSecretFilesMounted renders a Secret mounted as a volume and a route
// secret read from it with ${file:...}, standalone and as a sidecar: the
// pod has the volume, the gateway container the mount (without subPath),
// the literal-secret check lets the reference through, and the rendered
// config validates with the files where the mount puts them.
func TestSecretFilesMounted(t *testing.T) {
	tests := []struct {
		name, chart, release, prefix, deployment, configMap string
	}{
		{"standalone", "dedupgw", "hooks", "", "hooks-dedupgw", "hooks-dedupgw"},
		{"sidecar", "examples/sidecar-app", "shop", "dedupgw.", "shop-shop", "shop-dedupgw-sidecar"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := []string{"-f", secretMountValues(t, tt.prefix)}
			if tt.prefix != "" {
				args = append([]string{"-f", filepath.Join("testdata", "sidecar.yaml")}, args...)
			}
			r := decodeStrict(t, render(t, tt.chart, tt.release, "edge", args...))
			checkGatewayPods(t, r)
			d := r.deployment(t, tt.deployment)
			ps := d.Spec.Template.Spec
			v := volume(ps, "webhook-secrets")
			if v == nil || v.Secret == nil || v.Secret.SecretName != "webhook-secrets" {
				t.Fatalf("volume webhook-secrets: got %+v, want the Secret webhook-secrets", v)
			}
			c := container(t, ps, "dedupgw")
			m := volumeMount(c, "webhook-secrets")
			if m == nil || m.MountPath != "/var/run/secrets/dedupgw" || !m.ReadOnly || m.SubPath != "" {
				t.Errorf("mount webhook-secrets: got %+v, want read-only at /var/run/secrets/dedupgw without subPath", m)
			}
			for _, o := range ps.Containers {
				if o.Name != "dedupgw" && volumeMount(&o, "webhook-secrets") != nil {
					t.Errorf("container %s: got the gateway's secret mount, want it on the gateway only", o.Name)
				}
			}
			cm := r.ConfigMaps[tt.configMap]
			if cm == nil {
				t.Fatalf("no ConfigMap %s; got %v", tt.configMap, keys(r.ConfigMaps))
			}
			raw := cm.Data["config.yaml"]
			if !strings.Contains(raw, "${file:/var/run/secrets/dedupgw/stripe}") {
				t.Fatalf("config.yaml lost the ${file:...} reference:\n%s", raw)
			}

			// Validate it as the pod would read it: the Secret's keys as
			// files in the mounted directory.
			mount := t.TempDir()
			for name, v := range map[string]string{"stripe": "whsec_new\n", "stripe-old": "whsec_old\n"} {
				if err := os.WriteFile(filepath.Join(mount, name), []byte(v), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			file := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(file, []byte(strings.ReplaceAll(raw, "/var/run/secrets/dedupgw", mount)), 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(gateway(t), "validate", "--config", file)
			cmd.Env = append(os.Environ(), "REDIS_PASSWORD=secret", "DEDUPGW_ADMIN_TOKEN=from-a-secret")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("dedupgw validate: %v\n%s\nconfig:\n%s", err, out, raw)
			} else if strings.Contains(string(out), "whsec_") {
				t.Errorf("dedupgw validate shows a secret from a file:\n%s", out)
			}
		})
	}
}

// TestExtraVolumesRender checks what extraVolumes and extraVolumeMounts
// may not do: take a name or a path of the chart's own.
func TestExtraVolumesRender(t *testing.T) {
	secretVol := []string{"--set", "extraVolumes[0].secret.secretName=s"}
	tests := []struct {
		name string
		args []string
		want []string // nil: renders
	}{
		{"another name", append([]string{"--set", "extraVolumes[0].name=s"}, secretVol...), nil},
		{"the config volume's name", append([]string{"--set", "extraVolumes[0].name=dedupgw-config"}, secretVol...),
			[]string{`extraVolumes[0].name "dedupgw-config" is a volume of the chart's own`}},
		{"the data volume's name", append([]string{"--set", "extraVolumes[0].name=dedupgw-data"}, secretVol...),
			[]string{`extraVolumes[0].name "dedupgw-data"`}},
		{"a mount in the config directory", []string{"--set", "extraVolumeMounts[0].name=s", "--set", "extraVolumeMounts[0].mountPath=/etc/dedupgw/secrets"},
			[]string{`extraVolumeMounts[0].mountPath "/etc/dedupgw/secrets" is in /etc/dedupgw`, "/var/run/secrets/dedupgw"}},
		{"a mount over the data directory", []string{"--set", "extraVolumeMounts[0].name=s", "--set", "extraVolumeMounts[0].mountPath=/var/lib/dedupgw/"},
			[]string{`extraVolumeMounts[0].mountPath "/var/lib/dedupgw" is in /var/lib/dedupgw`}},
		{"a mount without a path", []string{"--set", "extraVolumeMounts[0].name=s"},
			[]string{"/extraVolumeMounts/0", "mountPath"}},
		{"a volume without a name", secretVol,
			[]string{"/extraVolumes/0", "name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.want != nil {
				renderFails(t, tt.args, tt.want...)
				return
			}
			decodeStrict(t, render(t, "dedupgw", "x", "default", tt.args...))
		})
	}
}
