package providers

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestParseKeys(t *testing.T) {
	bodyJSON := `{"id":"evt_1","data":{"object":{"id":"obj_1"}},"n":42,"empty":"","flag":true}`
	tests := []struct {
		name    string
		keys    []string
		url     string
		headers map[string]string
		body    string
		want    string
		wantErr error
	}{
		{"header", []string{"header:Idempotency-Key"}, "/", map[string]string{"Idempotency-Key": "k1"}, "", "k1", nil},
		{"header case-insensitive", []string{"header:x-github-delivery"}, "/", map[string]string{"X-GitHub-Delivery": "d1"}, "", "d1", nil},
		{"json", []string{"json:data.object.id"}, "/", nil, bodyJSON, "obj_1", nil},
		{"json number", []string{"json:n"}, "/", nil, bodyJSON, "42", nil},
		{"query", []string{"query:event"}, "/?event=q1", nil, "", "q1", nil},
		{"first non-empty wins", []string{"header:X-Id", "json:id", "body"}, "/", map[string]string{"X-Id": "h1"}, bodyJSON, "h1", nil},
		{"empty header is absent", []string{"header:X-Id", "json:id"}, "/", map[string]string{"X-Id": ""}, bodyJSON, "evt_1", nil},
		{"empty json string is absent", []string{"json:empty", "query:e"}, "/?e=q", nil, bodyJSON, "q", nil},
		{"json bool is absent", []string{"json:flag", "json:id"}, "/", nil, bodyJSON, "evt_1", nil},
		{"empty query is absent", []string{"query:e", "json:id"}, "/?e=", nil, bodyJSON, "evt_1", nil},
		{"body", []string{"body"}, "/", nil, `{"b":1,"a":2}`, BodyKey([]byte(`{"a":2,"b":1}`)), nil},
		{"body non-json", []string{"body"}, "/", nil, "a=1&b=2", BodyKey([]byte("a=1&b=2")), nil},
		{"empty body is absent", []string{"body"}, "/", nil, "", "", ErrNoKey},
		{"none found", []string{"header:X-Id", "json:id", "query:id"}, "/", nil, `{}`, "", ErrNoKey},
		{"json on non-json body", []string{"json:id"}, "/", nil, `id=1`, "", ErrJSONSyntax},
		{"json on truncated json", []string{"json:id"}, "/", nil, `{"id":"evt_bad",`, "", ErrJSONSyntax},
		{"json on truncated json, then a header", []string{"json:id", "header:X-Id"}, "/", map[string]string{"X-Id": "h1"}, `{"id":"evt_bad",`, "h1", nil},
		{"json on valid json without the path", []string{"json:id"}, "/", nil, `[1,2]`, "", ErrNoKey},
		{"json on an empty body", []string{"json:id"}, "/", nil, ``, "", ErrNoKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kf, err := ParseKeys(tt.keys)
			if err != nil {
				t.Fatalf("ParseKeys(%q): got %v, want nil", tt.keys, err)
			}
			r := httptest.NewRequest(http.MethodPost, tt.url, strings.NewReader(tt.body))
			for k, v := range tt.headers {
				r.Header.Set(k, v)
			}
			got, err := kf(r, []byte(tt.body))
			if got != tt.want || !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Errorf("key: got (%q, %v), want (%q, %v)", got, err, tt.want, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrNoKey) {
				t.Errorf("key error: got %v, want it to wrap ErrNoKey as well", err)
			}
			if tt.wantErr == ErrNoKey && errors.Is(err, ErrJSONSyntax) {
				t.Errorf("key error: got %v, want no JSON syntax error (the body is JSON or empty)", err)
			}
		})
	}
}

func TestParseKeysErrors(t *testing.T) {
	tests := []struct {
		keys []string
		want string
	}{
		{[]string{"header:X-Id", "foo:bar"}, `keys[1]: unknown source "foo:bar"`},
		{[]string{"bodyx"}, `keys[0]: unknown source "bodyx"`},
		{[]string{"Header:X-Id"}, `keys[0]: unknown source "Header:X-Id"`},
		{[]string{"header:"}, `keys[0]: invalid header name in source "header:"`},
		{[]string{"header:X Id"}, `keys[0]: invalid header name in source "header:X Id"`},
		{[]string{"query:"}, `keys[0]: empty query parameter name in source "query:"`},
		{[]string{"json:"}, `keys[0]: invalid json path (want dotted names like data.object.id) in source "json:"`},
		{[]string{"json:a..b"}, `keys[0]: invalid json path (want dotted names like data.object.id) in source "json:a..b"`},
		{[]string{""}, `keys[0]: unknown source ""`},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			_, err := ParseKeys(tt.keys)
			var kse *KeySourceError
			if !errors.As(err, &kse) || err.Error() != tt.want {
				t.Fatalf("ParseKeys(%q): got %v, want %s", tt.keys, err, tt.want)
			}
			if err := ValidateKeys(tt.keys); err == nil || err.Error() != tt.want {
				t.Errorf("ValidateKeys(%q): got %v, want %s", tt.keys, err, tt.want)
			}
			wrapped := fmt.Errorf("routes[%d].%w", 2, err)
			if !strings.HasPrefix(wrapped.Error(), "routes[2].keys[") {
				t.Errorf("wrapped: got %q, want prefix routes[2].keys[", wrapped)
			}
		})
	}
	if _, err := ParseKeys(nil); err == nil {
		t.Errorf("ParseKeys(nil): got nil error, want one")
	}
	if err := ValidateKeys(nil); err != nil {
		t.Errorf("ValidateKeys(nil): got %v, want nil", err)
	}
}

// TestHeaderKeyRepeated: a header: source's header repeated with different
// values makes the request ambiguous (the application may read the other
// one), and no later source is tried; repeated with one value it is that
// value.
func TestHeaderKeyRepeated(t *testing.T) {
	kf, err := ParseKeys([]string{"header:X-Id", "query:id"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		values   []string
		url      string
		want     string
		wantErrs []error
	}{
		{"once", []string{"a"}, "/", "a", nil},
		{"twice, the same", []string{"a", "a"}, "/", "a", nil},
		{"twice, different", []string{"a", "b"}, "/", "", []error{ErrNoKey, ErrAmbiguousKey}},
		{"different, and a next source", []string{"a", "b", "a"}, "/?id=q", "", []error{ErrNoKey, ErrAmbiguousKey}}, // no fall-through
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, tt.url, nil)
			for _, v := range tt.values {
				r.Header.Add("X-Id", v)
			}
			got, err := kf(r, nil)
			if got != tt.want || (err == nil) != (len(tt.wantErrs) == 0) {
				t.Fatalf("key: got (%q, %v), want %q and errors %v", got, err, tt.want, tt.wantErrs)
			}
			for _, want := range tt.wantErrs {
				if !errors.Is(err, want) {
					t.Errorf("key error: got %v, want it to wrap %v", err, want)
				}
			}
		})
	}
}

// TestIdempotencyKeyStructuredString: an Idempotency-Key sent as the IETF
// draft writes it, a Structured Field string, is the key it holds, so that
// clients quoting it and clients not quoting it agree; other headers and
// malformed strings are taken as they are.
func TestIdempotencyKeyStructuredString(t *testing.T) {
	tests := []struct {
		source, header, value string
		want                  string
	}{
		{"header:Idempotency-Key", "Idempotency-Key", `"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"header:Idempotency-Key", "Idempotency-Key", `8e03978e-40d5-43e8-bc93-6894a57f9324`, "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{"header:idempotency-key", "Idempotency-Key", `"k-1"`, "k-1"},
		{"header:Idempotency-Key", "Idempotency-Key", `"a \"quoted\" \\ key"`, `a "quoted" \ key`},
		{"header:Idempotency-Key", "Idempotency-Key", `"unterminated`, `"unterminated`},
		{"header:Idempotency-Key", "Idempotency-Key", `"bad \x escape"`, `"bad \x escape"`},
		{"header:Idempotency-Key", "Idempotency-Key", `"inner " quote"`, `"inner " quote"`},
		{"header:Idempotency-Key", "Idempotency-Key", `"ü"`, `"ü"`},
		{"header:Idempotency-Key", "Idempotency-Key", `"`, `"`},
		{"header:X-Id", "X-Id", `"k-1"`, `"k-1"`}, // only the draft's header is a Structured Field
	}
	for _, tt := range tests {
		t.Run(tt.source+" "+tt.value, func(t *testing.T) {
			kf, err := ParseKeys([]string{tt.source})
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Header.Set(tt.header, tt.value)
			if got, err := kf(r, nil); got != tt.want || err != nil {
				t.Errorf("key: got (%q, %v), want (%q, nil)", got, err, tt.want)
			}
		})
	}
	// Quoted and bare, one key is one key.
	r0 := httptest.NewRequest(http.MethodPost, "/", nil)
	r0.Header.Add("Idempotency-Key", `"k-1"`)
	r0.Header.Add("Idempotency-Key", "k-1")
	if kf, _ := ParseKeys([]string{"header:Idempotency-Key"}); kf != nil {
		if got, err := kf(r0, nil); got != "k-1" || err != nil {
			t.Errorf(`key of "k-1" and k-1: got (%q, %v), want ("k-1", nil)`, got, err)
		}
	}
	// An empty string holds no key.
	kf, _ := ParseKeys([]string{"header:Idempotency-Key"})
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set("Idempotency-Key", `""`)
	if got, err := kf(r, nil); got != "" || !errors.Is(err, ErrNoKey) {
		t.Errorf(`key of "": got (%q, %v), want ("", ErrNoKey)`, got, err)
	}
}

// FuzzUnquoteSFString: a string unquoteSFString accepts is one RFC 8941
// sf-string, which quoting its result again gives back byte for byte.
func FuzzUnquoteSFString(f *testing.F) {
	for _, s := range []string{`"k-1"`, `""`, `"a \"b\" \\ c"`, `"bad \x"`, `"`, `k`, `"ü"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, ok := unquoteSFString(v)
		if !ok {
			return
		}
		again := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(got) + `"`
		if again != v {
			t.Errorf("unquoteSFString(%q) = %q, which quotes back as %q", v, got, again)
		}
	})
}

// TestHeaderValue: a header is its one value, normalized when asked, and
// ambiguous when its lines differ.
func TestHeaderValue(t *testing.T) {
	tests := []struct {
		lines     []string
		normalize func(string) string
		want      string
		wantOK    bool
	}{
		{nil, nil, "", true},
		{[]string{"a"}, nil, "a", true},
		{[]string{"a", "a"}, nil, "a", true},
		{[]string{"a", "b"}, nil, "", false},
		{[]string{`"a"`, "a"}, nil, "", false},
		{[]string{`"a"`, "a"}, sfStringValue, "a", true},
	}
	for _, tt := range tests {
		h := http.Header{}
		for _, l := range tt.lines {
			h.Add("X-Id", l)
		}
		if got, ok := HeaderValue(h, "X-Id", tt.normalize); got != tt.want || ok != tt.wantOK {
			t.Errorf("HeaderValue(%q): got (%q, %v), want (%q, %v)", tt.lines, got, ok, tt.want, tt.wantOK)
		}
	}
}
