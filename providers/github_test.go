package providers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

// githubSign signs body the way GitHub does.
func githubSign(secret, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(body))
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

func TestGitHubVerify(t *testing.T) {
	const (
		docsSecret = "It's a Secret to Everybody"
		docsBody   = "Hello, World!"
		docsSig    = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
		octoSecret = "mysecret"
		octoBody   = `{"foo":"bar"}`
		octoSig    = "sha256=4864d2759938a15468b5df9ade20bf161da9b4f737ea61794142f3484236bda3"
	)
	tests := []struct {
		name    string
		secrets []string
		header  string // "-" means absent
		body    string
		want    error
	}{
		{"docs vector", []string{docsSecret}, docsSig, docsBody, nil},
		{"octokit vector", []string{octoSecret}, octoSig, octoBody, nil},
		{"uppercase hex", []string{octoSecret}, "sha256=" + strings.ToUpper(octoSig[7:]), octoBody, nil},
		{"rotation", []string{"old", octoSecret}, octoSig, octoBody, nil},
		{"wrong secret", []string{"nope"}, octoSig, octoBody, ErrBadSignature},
		{"tampered body", []string{octoSecret}, octoSig, `{"foo":"baz"}`, ErrBadSignature},
		{"missing header", []string{octoSecret}, "-", octoBody, ErrNoSignature},
		{"sha1 prefix", []string{octoSecret}, "sha1=" + octoSig[7:], octoBody, ErrBadSignature},
		{"no prefix", []string{octoSecret}, octoSig[7:], octoBody, ErrBadSignature},
		{"bad hex", []string{octoSecret}, "sha256=xyz", octoBody, ErrBadSignature},
		{"short", []string{octoSecret}, "sha256=4864", octoBody, ErrBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Provider: GitHub, Secrets: tt.secrets})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			h := map[string]string{"X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}
			if tt.header != "-" {
				h["X-Hub-Signature-256"] = tt.header
			}
			err = p.Verifier.Verify(newRequest(h), []byte(tt.body))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
		})
	}
}

// TestGitHubBodyKeyCatchesReplayUnderFreshID shows the documented remedy for
// GitHub's unsigned delivery header: with keys: ["body"], a captured delivery
// replayed under a fresh X-GitHub-Delivery still gets the same key, while the
// signature keeps verifying (it covers only the body).
func TestGitHubBodyKeyCatchesReplayUnderFreshID(t *testing.T) {
	body := `{"action":"opened","number":1}`
	p, err := New(Config{Provider: GitHub, Keys: []string{"body"}, Secrets: []string{"s"}})
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	var keys []string
	for _, id := range []string{"id-original", "id-forged-fresh"} {
		r := newRequest(map[string]string{"X-GitHub-Delivery": id, "X-Hub-Signature-256": githubSign("s", body)})
		if err := p.Verifier.Verify(r, []byte(body)); err != nil {
			t.Fatalf("Verify(%s): got %v, want nil", id, err)
		}
		k, err := p.Key(r, []byte(body))
		if err != nil {
			t.Fatalf("Key(%s): got %v, want nil", id, err)
		}
		keys = append(keys, k)
	}
	if keys[0] != keys[1] {
		t.Errorf("keys under fresh IDs: got %q and %q, want equal", keys[0], keys[1])
	}
	// With the preset, the fresh ID is a fresh key: that is the limit the
	// README states.
	preset, err := New(Config{Provider: GitHub})
	if err != nil {
		t.Fatalf("New: got %v, want nil", err)
	}
	k1, _ := preset.Key(newRequest(map[string]string{"X-GitHub-Delivery": "a"}), []byte(body))
	k2, _ := preset.Key(newRequest(map[string]string{"X-GitHub-Delivery": "b"}), []byte(body))
	if k1 == k2 {
		t.Errorf("preset keys under fresh IDs: got equal %q, want different", k1)
	}
}

// FuzzGitHubSignature checks the X-Hub-Signature-256 parsing never panics and
// only ever returns a sentinel.
func FuzzGitHubSignature(f *testing.F) {
	for _, s := range []string{"sha256=4864d2759938a15468b5df9ade20bf161da9b4f737ea61794142f3484236bda3", "sha256=", "sha1=00", "=", ""} {
		f.Add(s)
	}
	v := &githubVerifier{secrets: [][]byte{[]byte("mysecret")}}
	f.Fuzz(func(t *testing.T, h string) {
		err := v.Verify(newRequest(map[string]string{"X-Hub-Signature-256": h}), []byte(`{"foo":"bar"}`))
		if err != nil && !errors.Is(err, ErrNoSignature) && !errors.Is(err, ErrBadSignature) {
			t.Fatalf("Verify(%q): got %v, want a sentinel", h, err)
		}
	})
}
