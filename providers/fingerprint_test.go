package providers

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestCanonicalWithout(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		exclude []string
		want    string
	}{
		{"no exclusions is Canonical", `{"b":1, "a":2}`, nil, `{"a":2,"b":1}`},
		{"drops one member", `{"amount":100,"ts":"2026-01-01T00:00:00Z","currency":"eur"}`, []string{"ts"}, `{"amount":100,"currency":"eur"}`},
		{"drops several", `{"a":1,"b":2,"c":3}`, []string{"c", "a"}, `{"b":2}`},
		{"drops the first member", `{"a":1,"b":2}`, []string{"a"}, `{"b":2}`},
		{"drops the last member", `{"a":1,"b":2}`, []string{"b"}, `{"a":1}`},
		{"drops every member", `{"a":1,"b":2}`, []string{"a", "b"}, `{}`},
		{"drops a repeated name", `{"ts":1,"x":0,"ts":2}`, []string{"ts"}, `{"x":0}`},
		{"escaped name matches decoded", `{"\u0074s":1,"x":0}`, []string{"ts"}, `{"x":0}`},
		{"case sensitive", `{"TS":1,"ts":2}`, []string{"ts"}, `{"TS":1}`},
		{"nested members stay", `{"ts":1,"data":{"ts":2}}`, []string{"ts"}, `{"data":{"ts":2}}`},
		{"object values skipped whole", `{"a":{"b":[1,{"c":"}"}]},"z":"\"q"}`, []string{"a"}, `{"z":"\"q"}`},
		{"absent name", `{"a":1}`, []string{"zz"}, `{"a":1}`},
		{"empty object", `{ }`, []string{"a"}, `{}`},
		{"array top level unchanged", `[{"ts":1}]`, []string{"ts"}, `[{"ts":1}]`},
		{"scalar top level unchanged", ` "ts" `, []string{"ts"}, `"ts"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalWithout([]byte(tt.in), tt.exclude)
			if err != nil {
				t.Fatalf("CanonicalWithout(%q, %q): got error %v, want nil", tt.in, tt.exclude, err)
			}
			if string(got) != tt.want {
				t.Errorf("CanonicalWithout(%q, %q): got %s, want %s", tt.in, tt.exclude, got, tt.want)
			}
		})
	}
}

func TestCanonicalWithoutRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"not json", `ts=1&a=2`, ErrJSONSyntax},
		{"truncated", `{"ts":1`, ErrJSONSyntax},
		{"empty", ``, ErrJSONSyntax},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := CanonicalWithout([]byte(tt.in), []string{"ts"})
			if !errors.Is(err, tt.want) {
				t.Errorf("CanonicalWithout(%q): got error %v, want %v", tt.in, err, tt.want)
			}
		})
	}
}

// FuzzCanonicalWithout checks that the result is canonical and decodes to the
// input's value with the excluded top-level member removed.
func FuzzCanonicalWithout(f *testing.F) {
	for _, s := range []struct{ body, name string }{
		{`{"b":1,"ts":"x","a":[true,null]}`, "ts"},
		{`{"\u0074s":1,"ts":2,"x":{"ts":3}}`, "ts"},
		{`[{"ts":1}]`, "ts"},
		{`{"a":"\"}","b":{"a":1}}`, "a"},
		{`{}`, ""},
	} {
		f.Add([]byte(s.body), s.name)
	}
	f.Fuzz(func(t *testing.T, body []byte, name string) {
		got, err := CanonicalWithout(body, []string{name})
		if err != nil {
			if _, cerr := Canonical(body); cerr == nil {
				t.Fatalf("CanonicalWithout(%q, %q): got %v, but Canonical accepts it", body, name, err)
			}
			return
		}
		again, err := Canonical(got)
		if err != nil || !bytes.Equal(again, got) {
			t.Fatalf("CanonicalWithout(%q, %q) = %q is not canonical: Canonical gives %q (%v)", body, name, got, again, err)
		}
		want, errWant := decodeUseNumber(body)
		have, errHave := decodeUseNumber(got)
		if errWant != nil || errHave != nil {
			t.Fatalf("decoding: got errors %v and %v, want none", errWant, errHave)
		}
		if m, ok := want.(map[string]any); ok {
			delete(m, name)
		}
		if !reflect.DeepEqual(want, have) {
			t.Fatalf("CanonicalWithout(%q, %q) = %q: got value %#v, want %#v", body, name, got, have, want)
		}
	})
}
