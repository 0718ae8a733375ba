package providers

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestCanonical(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"sorted keys", `{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{"whitespace", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\":{ } } ", `{"a":[1,2],"b":{}}`},
		{"nested sort", `{"z":{"y":1,"x":2},"a":[{"d":1,"c":2}]}`, `{"a":[{"c":2,"d":1}],"z":{"x":2,"y":1}}`},
		{"numbers as written", `{"n":[1.0,1e3,-0,0.5E-2,12345678901234567890123]}`, `{"n":[1.0,1e3,-0,0.5E-2,12345678901234567890123]}`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"scalar", ` "x" `, `"x"`},
		{"escapes decoded", `"\u0041\/\u00e9\ud83d\ude00"`, `"A/é😀"`},
		{"escapes kept", `"\"\\\n\t\u0001\u001f\b\f\r"`, `"\"\\\n\t\u0001\u001f\b\f\r"`},
		{"unicode kept", `"é 😀  <>&"`, `"é 😀  <>&"`},
		{"duplicate keys keep order", `{"b":0,"a":1,"a":2}`, `{"a":1,"a":2,"b":0}`},
		{"escaped key sorts by encoding", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"empty containers", `[{},[],""]`, `[{},[],""]`},
		{"prefix keys", `{"ab":1,"a":2,"a!":3}`, `{"a":2,"a!":3,"ab":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonical([]byte(tt.in))
			if err != nil {
				t.Fatalf("Canonical(%q): got error %v, want nil", tt.in, err)
			}
			if string(got) != tt.want {
				t.Errorf("Canonical(%q): got %s, want %s", tt.in, got, tt.want)
			}
			again, err := Canonical(got)
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("Canonical not idempotent: got %s (%v), want %s", again, err, got)
			}
		})
	}
}

func TestCanonicalRejects(t *testing.T) {
	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	deepObj := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	atLimit := strings.Repeat("[", MaxJSONDepth) + strings.Repeat("]", MaxJSONDepth)
	overLimit := "[" + atLimit + "]"
	tests := []struct {
		name string
		in   string
		want error
	}{
		{"empty", ``, ErrJSONSyntax},
		{"space only", `   `, ErrJSONSyntax},
		{"trailing garbage", `{} x`, ErrJSONSyntax},
		{"two values", `1 2`, ErrJSONSyntax},
		{"trailing comma", `[1,]`, ErrJSONSyntax},
		{"object trailing comma", `{"a":1,}`, ErrJSONSyntax},
		{"unquoted key", `{a:1}`, ErrJSONSyntax},
		{"leading zero", `01`, ErrJSONSyntax},
		{"bare minus", `-`, ErrJSONSyntax},
		{"dot no digits", `1.`, ErrJSONSyntax},
		{"exp no digits", `1e+`, ErrJSONSyntax},
		{"plus sign", `+1`, ErrJSONSyntax},
		{"bad literal", `tru`, ErrJSONSyntax},
		{"raw control char", "\"a\x01\"", ErrJSONSyntax},
		{"bad escape", `"\x"`, ErrJSONSyntax},
		{"short unicode escape", `"\u12"`, ErrJSONSyntax},
		{"lone high surrogate", `"\ud800"`, ErrJSONSyntax},
		{"lone low surrogate", `"\udc00"`, ErrJSONSyntax},
		{"high then non-low", `"\ud800\u0041"`, ErrJSONSyntax},
		{"invalid utf8", "\"\xff\"", ErrJSONSyntax},
		{"truncated utf8", "\"\xe2\x82\"", ErrJSONSyntax},
		{"unterminated string", `"abc`, ErrJSONSyntax},
		{"unterminated object", `{"a":1`, ErrJSONSyntax},
		{"10000 deep arrays", deep, ErrJSONDepth},
		{"10000 deep objects", deepObj, ErrJSONDepth},
		{"one past the limit", overLimit, ErrJSONDepth},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonical([]byte(tt.in))
			if !errors.Is(err, tt.want) {
				t.Errorf("Canonical: got (%q, %v), want error %v", got, err, tt.want)
			}
		})
	}
	if _, err := Canonical([]byte(atLimit)); err != nil {
		t.Errorf("Canonical at MaxJSONDepth: got %v, want nil", err)
	}
}

func TestBodyKey(t *testing.T) {
	same := []string{
		`{"id":"evt_1","data":{"object":{"id":"cus_1","amount":100}}}`,
		"{\n  \"data\": {\"object\": {\"amount\": 100, \"id\": \"cus_1\"}},\n  \"id\": \"evt_1\"\n}\n",
		`{"data":{"object":{"id":"cus\u005f1","amount":100}},"id":"evt_1"}`,
	}
	want := BodyKey([]byte(same[0]))
	if len(want) != 64 {
		t.Fatalf("BodyKey length: got %d, want 64", len(want))
	}
	for _, s := range same[1:] {
		if got := BodyKey([]byte(s)); got != want {
			t.Errorf("BodyKey(%q): got %s, want %s", s, got, want)
		}
	}
	differ := []string{
		`{"id":"evt_1","data":{"object":{"id":"cus_1","amount":100.0}}}`,
		`{"id":"evt_2","data":{"object":{"id":"cus_1","amount":100}}}`,
		`not json {"id":"evt_1"}`,
	}
	for _, s := range differ {
		if got := BodyKey([]byte(s)); got == want {
			t.Errorf("BodyKey(%q): got %s, want a different key", s, got)
		}
	}
	// Non-JSON bodies hash their raw bytes: different spacing differs.
	if a, b := BodyKey([]byte("a b")), BodyKey([]byte("a  b")); a == b {
		t.Errorf("BodyKey of two raw bodies: got equal %s, want different", a)
	}
	// A depth bomb hashes as raw bytes instead of failing.
	bomb := []byte(strings.Repeat("[", 10000))
	if got := BodyKey(bomb); len(got) != 64 {
		t.Errorf("BodyKey(depth bomb): got %q, want a 64-char hex key", got)
	}
}

// FuzzCanonical checks that Canonical never panics, is idempotent, agrees with
// encoding/json on the value, and maps re-spaced, re-ordered JSON to one form.
func FuzzCanonical(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,null,"x"]}`, `"\u00e9\ud83d\ude00"`, `[1.5e10,-0]`,
		`{"a":{"b":{"c":{}}}}`, "\"\xff\"", `{"a":1,"a":2}`, `[[[[[[[[`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := Canonical(body)
		if err != nil {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("Canonical accepted %q, which encoding/json rejects", body)
		}
		again, err := Canonical(got)
		if err != nil || !bytes.Equal(again, got) {
			t.Fatalf("Canonical(%q) not idempotent: %q then %q (%v)", body, got, again, err)
		}
		want, errWant := decodeUseNumber(body)
		have, errHave := decodeUseNumber(got)
		if errWant != nil || errHave != nil || !reflect.DeepEqual(want, have) {
			t.Fatalf("Canonical(%q) = %q changes the value: got %#v, want %#v", body, got, have, want)
		}
		if v, ok := want.(map[string]any); ok && len(v) > 0 {
			// Re-encoding the decoded value (other spacing, keys sorted by
			// encoding/json) must reach the same canonical form when the
			// document holds no duplicate keys.
			re, err := json.MarshalIndent(v, "", "  ")
			if err == nil && !hasDuplicateKeys(body) {
				c2, err := Canonical(re)
				if err != nil || !bytes.Equal(c2, got) {
					t.Fatalf("re-encoded %q: got %q (%v), want %q", re, c2, err, got)
				}
			}
		}
	})
}

func decodeUseNumber(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

// hasDuplicateKeys reports whether any object in the document repeats a key.
func hasDuplicateKeys(b []byte) bool {
	d := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		obj    bool
		seen   map[string]bool
		expect bool // next string token is a key
	}
	var stack []*frame
	for {
		tok, err := d.Token()
		if err != nil {
			return false
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{', '[':
				if top != nil && top.obj {
					top.expect = true
				}
				stack = append(stack, &frame{obj: v == '{', seen: map[string]bool{}, expect: true})
			default:
				stack = stack[:len(stack)-1]
			}
			continue
		case string:
			if top != nil && top.obj && top.expect {
				if top.seen[v] {
					return true
				}
				top.seen[v] = true
				top.expect = false
				continue
			}
		}
		if top != nil && top.obj {
			top.expect = true
		}
	}
}

func BenchmarkCanonical(b *testing.B) {
	body := []byte(stripeVectorBody)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Canonical(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBodyKey(b *testing.B) {
	body := []byte(stripeVectorBody)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		BodyKey(body)
	}
}

func BenchmarkBodyKeyDepthBomb(b *testing.B) {
	body := []byte(strings.Repeat("[", 10000))
	b.ReportAllocs()
	for b.Loop() {
		BodyKey(body)
	}
}

// BenchmarkCanonicalStdlib is the baseline: decode into any, re-encode with
// encoding/json (which sorts map keys).
func BenchmarkCanonicalStdlib(b *testing.B) {
	body := []byte(stripeVectorBody)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		v, err := decodeUseNumber(body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := json.Marshal(v); err != nil {
			b.Fatal(err)
		}
	}
}
