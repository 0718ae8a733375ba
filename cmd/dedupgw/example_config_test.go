package main

import (
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dedupgw/dedupgw/providers"
	"github.com/dedupgw/dedupgw/proxy"
)

const examplePath = "../../config.example.yaml"

// exampleSecrets are the variables the example's secrets: lines name, with
// values each provider accepts.
var exampleSecrets = map[string]string{
	"STRIPE_WEBHOOK_SECRET":     "whsec_stripe_example",
	"SHOPIFY_WEBHOOK_SECRET":    "shopify-example",
	"GITHUB_WEBHOOK_SECRET":     "github-example",
	"STANDARD_WEBHOOKS_SECRET":  "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
	"SLACK_SIGNING_SECRET":      "slack-example",
	"ORDERS_WEBHOOK_SECRET":     "orders-example",
	"ORDERS_WEBHOOK_SECRET_OLD": "orders-example-old",
	"CLIENT_IDENTITY_SECRET":    "client-identity-example-secret",
}

// TestExampleConfig checks config.example.yaml both ways a user meets it:
// as shipped (secrets commented out, no environment: the quick start) and
// with its secrets: and client_identity_secret: lines enabled and their
// variables set. Both must pass validate, including building the gateway's
// routes.
func TestExampleConfig(t *testing.T) {
	text, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	enabled := strings.ReplaceAll(string(text), "# secrets:", "secrets:")
	if enabled == string(text) {
		t.Fatal("example has no commented secrets: lines to enable")
	}
	keyed := strings.ReplaceAll(enabled, "# client_identity_secret:", "client_identity_secret:")
	if keyed == enabled {
		t.Fatal("example has no commented client_identity_secret: line to enable")
	}
	tests := []struct {
		name            string
		text            string
		env             map[string]string
		wantSecrets     int // routes with secrets
		wantScopeSecret int // routes with a client_identity_secret
	}{
		{"as shipped, no environment", string(text), nil, 0, 0},
		{"secrets enabled and set", keyed, exampleSecrets, 6, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := loadConfig(writeConfig(t, tt.text), envMap(tt.env))
			if err != nil {
				t.Fatalf("got %v, want a valid config", err)
			}
			if err := tryGateway(f); err != nil {
				t.Fatalf("building the gateway: got %v, want nil", err)
			}
			providersSeen := map[string]bool{}
			withSecrets, withScopeSecret := 0, 0
			for _, r := range f.GatewayConfig().Routes {
				providersSeen[r.Provider.Provider] = true
				if len(r.Provider.Secrets) > 0 {
					withSecrets++
				}
				if r.ClientIdentitySecret != "" {
					withScopeSecret++
				}
				// A route that refuses a reused key moves money: the
				// example shows it failing closed, not forwarding every
				// retry unchecked while the store is down.
				if r.OnFingerprintMismatch == proxy.Reject && r.OnStoreError != proxy.Reject {
					t.Errorf("route %s: got on_store_error %q beside on_fingerprint_mismatch reject, want %q", r.Name, r.OnStoreError, proxy.Reject)
				}
			}
			for _, p := range []string{providers.Stripe, providers.Shopify, providers.GitHub, providers.StandardWebhooks, providers.Slack, providers.Generic} {
				if !providersSeen[p] {
					t.Errorf("example routes: got no %s route, want one per provider", p)
				}
			}
			if withSecrets != tt.wantSecrets {
				t.Errorf("routes with secrets: got %d, want %d", withSecrets, tt.wantSecrets)
			}
			if withScopeSecret != tt.wantScopeSecret {
				t.Errorf("routes with a client_identity_secret: got %d, want %d", withScopeSecret, tt.wantScopeSecret)
			}
		})
	}

	t.Run("secrets enabled but unset", func(t *testing.T) {
		_, err := loadConfig(writeConfig(t, keyed), nil)
		if err == nil || !strings.Contains(err.Error(), "environment variable STRIPE_WEBHOOK_SECRET is not set") {
			t.Errorf("got %v, want the unset STRIPE_WEBHOOK_SECRET named", err)
		}
	})
}

// TestExampleDocumentsEveryKey checks that every key of the schema appears
// in config.example.yaml (set or in a comment).
func TestExampleDocumentsEveryKey(t *testing.T) {
	text, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			sf := t.Field(i)
			name, opt, _ := strings.Cut(sf.Tag.Get("config"), ",")
			if !sf.IsExported() {
				continue
			}
			if name != "" && !slices.Contains(names, name) {
				names = append(names, name)
			}
			ft := sf.Type
			for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct && ft != durationType || opt == "squash" {
				walk(ft)
			}
		}
	}
	walk(reflect.TypeFor[File]())
	for _, name := range names {
		if !regexp.MustCompile(`(?m)^[\s#-]*`+regexp.QuoteMeta(name)+`:`).Match(text) &&
			!regexp.MustCompile(`(?m)^#\s+`+regexp.QuoteMeta(name)+`\s`).Match(text) {
			t.Errorf("config.example.yaml: got no %q key, want every key documented", name)
		}
	}
	if len(names) < 50 {
		t.Errorf("schema keys: got %d, want the whole schema walked (>= 50)", len(names))
	}
}

// TestQuickStartServes starts the example as the README's quick start does
// (its bolt file in a temporary directory) and checks it is ready.
func TestQuickStartServes(t *testing.T) {
	dir := t.TempDir()
	text, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, text, 0o600); err != nil {
		t.Fatal(err)
	}
	g := startGatewayIn(t, dir, cfg, "DEDUPGW_LISTEN=127.0.0.1:0", "DEDUPGW_ADMIN_LISTEN=127.0.0.1:0")
	resp, err := client.Get(g.adminURL("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/readyz: got %d, want 200", resp.StatusCode)
	}
	if _, err := os.Stat(filepath.Join(dir, "dedupgw.db")); err != nil {
		t.Errorf("bolt file: got %v, want dedupgw.db in the working directory", err)
	}
}

// TestWorkedExampleKeys checks the README's worked example against
// config.example.yaml: each curl whose answer shows a duplicate's key,
// sent to the example route it names, gives that key. The orders route
// keys on what its signature covers, not on a header a sender picks.
func TestWorkedExampleKeys(t *testing.T) {
	section := readmeSection(t, "## A worked example with curl")
	f, err := loadConfig(examplePath, envMap(nil))
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]providers.Config{}
	for _, r := range f.GatewayConfig().Routes {
		routes[r.Path] = r.Provider
	}
	curl := regexp.MustCompile(`(?m)^\$ (?:sleep \S+; )?curl -si localhost:8080(\S+)((?: -H '[^']*')*) -d '([^']*)'\n`)
	header := regexp.MustCompile(`-H '([^:]+): ([^']*)'`)
	ackKey := regexp.MustCompile(`"status":"duplicate","route":"[^"]*","key":"([^"]*)"`)
	checked := 0
	for _, m := range curl.FindAllStringSubmatchIndex(section, -1) {
		path, headers, body := section[m[2]:m[3]], section[m[4]:m[5]], section[m[6]:m[7]]
		answer, _, _ := strings.Cut(section[m[1]:], "\n$ ")
		want := ackKey.FindStringSubmatch(answer)
		if want == nil {
			continue
		}
		cfg, ok := routes[path]
		if !ok {
			t.Errorf("curl to %s: got no example route with that path", path)
			continue
		}
		p, err := providers.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("POST", path, strings.NewReader(body))
		for _, h := range header.FindAllStringSubmatch(headers, -1) {
			r.Header.Add(h[1], h[2])
		}
		got, err := p.Key(r, []byte(body))
		if err != nil || got != want[1] {
			t.Errorf("curl to %s%s -d %s: got key %q (%v), want %q as the README's answer shows", path, headers, body, got, err, want[1])
		}
		checked++
	}
	if checked < 2 {
		t.Errorf("duplicate answers checked: got %d, want the orders and stripe ones (>= 2)", checked)
	}
}

// readmeSection returns the README's section under heading (as written,
// "## Title"), up to the next heading of its level or above (a "# "
// comment line in a code block does not end it).
func readmeSection(t *testing.T, heading string) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README: got no %q section", heading)
	}
	level := len(heading) - len(strings.TrimLeft(heading, "#"))
	if i := regexp.MustCompile(fmt.Sprintf(`\n#{2,%d} `, level)).FindStringIndex(section); i != nil {
		section = section[:i[0]]
	}
	return section
}
