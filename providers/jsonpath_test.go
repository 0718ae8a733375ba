package providers

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

func TestLookupJSON(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		path   string
		want   string
		wantOK bool
	}{
		{"top-level string", `{"id":"evt_1"}`, "id", "evt_1", true},
		{"nested", `{"data":{"object":{"id":"cus_1"}}}`, "data.object.id", "cus_1", true},
		{"number as written", `{"id":12345678901234567890.50}`, "id", "12345678901234567890.50", true},
		{"negative exponent", `{"id":-1E-5}`, "id", "-1E-5", true},
		{"escaped value decoded", `{"id":"a\u0062\"c"}`, "id", `ab"c`, true},
		{"escaped key matches", `{"\u0069d":"x"}`, "id", "x", true},
		{"array index", `{"items":[{"id":"a"},{"id":"b"}]}`, "items.1.id", "b", true},
		{"array index out of range", `{"items":[{"id":"a"}]}`, "items.3.id", "", false},
		{"leading zero is not an index", `{"items":["a","b"]}`, "items.01", "", false},
		{"index into object by name", `{"m":{"0":"zero"}}`, "m.0", "zero", true},
		{"missing", `{"idx":"x"}`, "id", "", false},
		{"null absent", `{"id":null}`, "id", "", false},
		{"bool absent", `{"id":true}`, "id", "", false},
		{"object absent", `{"id":{"a":1}}`, "id", "", false},
		{"array absent", `{"id":[1]}`, "id", "", false},
		{"empty string", `{"id":""}`, "id", "", true},
		{"last duplicate wins", `{"id":"a","id":"b"}`, "id", "b", true},
		{"last duplicate wins when absent", `{"id":"a","id":null}`, "id", "", false},
		{"replaced parent", `{"data":{"id":"a"},"data":{"x":1}}`, "data.id", "", false},
		{"path through scalar", `{"data":"s"}`, "data.id", "", false},
		{"top-level array", `[{"id":"a"}]`, "0.id", "a", true},
		{"invalid json after match", `{"id":"a",}`, "id", "", false},
		{"not json", `id=a`, "id", "", false},
		{"invalid utf8 elsewhere", "{\"id\":\"a\",\"x\":\"\xff\"}", "id", "", false},
		{"depth bomb", `{"id":"a","x":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`, "id", "", false},
		{"whitespace", " {\n \"id\" :\t\"a\" } ", "id", "a", true},
		{"empty path", `{"":"a"}`, "", "", false},
		{"empty segment", `{"a":{"":{"b":"x"}}}`, "a..b", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := LookupJSON([]byte(tt.body), tt.path)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("LookupJSON(%q, %q): got (%q, %v), want (%q, %v)", tt.body, tt.path, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

// FuzzLookupJSON checks that the lookup never panics and agrees with
// encoding/json (UseNumber) on every document both accept.
func FuzzLookupJSON(f *testing.F) {
	seeds := []struct{ body, path string }{
		{`{"id":"evt_1"}`, "id"},
		{`{"data":{"object":{"id":"cus_1"}}}`, "data.object.id"},
		{`{"items":[{"id":1.5}]}`, "items.0.id"},
		{`{"id":"a","id":{"x":1}}`, "id"},
		{`{"\u0069d":"\ud83d\ude00"}`, "id"},
		{strings.Repeat(`{"a":`, 200), "a.a"},
	}
	for _, s := range seeds {
		f.Add([]byte(s.body), s.path)
	}
	f.Fuzz(func(t *testing.T, body []byte, path string) {
		got, ok := LookupJSON(body, path)
		if !ok {
			if got != "" {
				t.Fatalf("LookupJSON(%q, %q): got %q with ok false, want empty", body, path, got)
			}
		}
		if _, err := Canonical(body); err != nil {
			if ok {
				t.Fatalf("LookupJSON(%q, %q): found %q in a body Canonical rejects (%v)", body, path, got, err)
			}
			return
		}
		want, wantOK := lookupStdlib(body, path)
		if got != want || ok != wantOK {
			t.Fatalf("LookupJSON(%q, %q): got (%q, %v), want (%q, %v) as encoding/json", body, path, got, ok, want, wantOK)
		}
	})
}

// lookupStdlib is the reference: decode with encoding/json and walk.
func lookupStdlib(body []byte, path string) (string, bool) {
	if path == "" {
		return "", false
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return "", false
	}
	for _, seg := range strings.Split(path, ".") {
		if seg == "" {
			return "", false
		}
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[seg]; !ok {
				return "", false
			}
		case []any:
			i, err := strconv.Atoi(seg)
			if err != nil || strconv.Itoa(i) != seg || i < 0 || i >= len(x) {
				return "", false
			}
			v = x[i]
		default:
			return "", false
		}
	}
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return string(x), true
	}
	return "", false
}

func BenchmarkLookupJSON(b *testing.B) {
	body := []byte(stripeVectorBody)
	p, err := parseJSONPath("data.object.id")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, ok, _ := p.lookup(body); !ok {
			b.Fatal("not found")
		}
	}
}

// BenchmarkLookupJSONStdlib is the baseline: unmarshal into map[string]any.
func BenchmarkLookupJSONStdlib(b *testing.B) {
	body := []byte(stripeVectorBody)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, ok := lookupStdlib(body, "data.object.id"); !ok {
			b.Fatal("not found")
		}
	}
}
