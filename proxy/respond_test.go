package proxy

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

// marshalAck is the duplicate ack as writeJSON encodes it: json.Marshal and
// a newline.
func marshalAck(t testing.TB, ack duplicateBody) []byte {
	t.Helper()
	b, err := json.Marshal(ack)
	if err != nil {
		t.Fatalf("json.Marshal(%+v): %v", ack, err)
	}
	return append(b, '\n')
}

// TestAppendDuplicateAck: the ack encoded without reflection is byte for
// byte json.Marshal's, and keys or times json.Marshal would escape or
// refuse are left to it.
func TestAppendDuplicateAck(t *testing.T) {
	first := time.Date(2026, 11, 30, 10, 0, 0, 123456789, time.UTC)
	tests := []struct {
		key   string
		first time.Time
		plain bool
	}{
		{"evt_1", first, true},
		{"", first, true},
		{"4f1c:k1", first, true},
		{"a b~!#$%'()*+,-./:;=?@[]^_`{|}", first, true},
		{"whole second", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), true},
		{"zero time", time.Time{}, true},
		{`quote"`, first, false},
		{`back\slash`, first, false},
		{"<script>", first, false},
		{"a&b", first, false},
		{"tab\there", first, false},
		{"newline\n", first, false},
		{"del\x7f", first, false},
		{"utf8-é", first, false},
		{"invalid-\xff", first, false},
		{"line\u2028sep", first, false},
		{"year 10000", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), false},
		{"year -1", time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), false},
	}
	for _, tt := range tests {
		ack := duplicateBody{Status: "duplicate", Route: "orders", Key: tt.key, FirstSeen: tt.first}
		got, ok := appendDuplicateAck(nil, ack)
		if ok != tt.plain {
			t.Errorf("key %q, first seen %v: got ok %v, want %v", tt.key, tt.first, ok, tt.plain)
		}
		if !ok {
			continue
		}
		if want := marshalAck(t, ack); !bytes.Equal(got, want) {
			t.Errorf("key %q:\ngot  %s\nwant %s", tt.key, got, want)
		}
	}
}

// TestWriteDuplicateAck: the ack answer, headers included, is what writeJSON
// writes, whether or not the key takes the fast path.
func TestWriteDuplicateAck(t *testing.T) {
	rt := &route{Route: Route{Name: "orders", DuplicateResponse: Ack}}
	first := time.Date(2026, 11, 30, 10, 0, 0, 5, time.Local)
	for _, key := range []string{"evt_1", "<evt&2>", "evt\n3"} {
		rec := httptest.NewRecorder()
		if got := writeDuplicate(rec, rt, key, dedup.Record{FirstSeen: first}); got != http.StatusOK {
			t.Errorf("key %q: got status %d, want 200", key, got)
		}
		want := httptest.NewRecorder()
		want.Header().Set(HeaderDedupStatus, statusDuplicate)
		writeJSON(want, http.StatusOK, "application/json", duplicateBody{Status: "duplicate", Route: "orders", Key: key, FirstSeen: first.UTC()})
		if rec.Code != want.Code || !bytes.Equal(rec.Body.Bytes(), want.Body.Bytes()) {
			t.Errorf("key %q: got %d %s, want %d %s", key, rec.Code, rec.Body, want.Code, want.Body)
		}
		if g, w := rec.Header(), want.Header(); len(g) != len(w) {
			t.Errorf("key %q: got headers %v, want %v", key, g, w)
		} else {
			for name := range w {
				if strings.Join(g[name], ",") != strings.Join(w[name], ",") {
					t.Errorf("key %q: header %s: got %q, want %q", key, name, g[name], w[name])
				}
			}
		}
	}
}

// TestSetDedupStatus: the shared header values behave as Header.Set's own:
// an Add to the header after it does not change the next answer's.
func TestSetDedupStatus(t *testing.T) {
	h := http.Header{}
	setDedupStatus(h, statusForwarded)
	h.Add(HeaderDedupStatus, "extra")
	if got := h.Values(HeaderDedupStatus); len(got) != 2 || got[0] != statusForwarded || got[1] != "extra" {
		t.Errorf("got %q, want [forwarded extra]", got)
	}
	next := http.Header{}
	setDedupStatus(next, statusForwarded)
	if got := next.Values(HeaderDedupStatus); len(got) != 1 || got[0] != statusForwarded {
		t.Errorf("next answer: got %q, want [forwarded]", got)
	}
	setDedupStatus(next, "not-a-status")
	if got := next.Get(HeaderDedupStatus); got != "not-a-status" {
		t.Errorf("got %q, want not-a-status", got)
	}
}

// FuzzDuplicateAck: for any key and time, the fast ack encoding either
// defers to json.Marshal or equals it byte for byte.
func FuzzDuplicateAck(f *testing.F) {
	f.Add("evt_1", int64(1796032800), int64(0))
	f.Add("<&>", int64(0), int64(999999999))
	f.Add("\xff\u2028", int64(-62135596800), int64(1))
	f.Add("k", int64(253402300800), int64(0)) // year 10000
	f.Fuzz(func(t *testing.T, key string, sec, nsec int64) {
		ack := duplicateBody{Status: "duplicate", Route: "orders", Key: key, FirstSeen: time.Unix(sec, nsec).UTC()}
		got, ok := appendDuplicateAck(nil, ack)
		if !ok {
			return
		}
		want := marshalAck(t, ack)
		if !bytes.Equal(got, want) {
			t.Errorf("got %s, want %s", got, want)
		}
	})
}

// TestAcceptsCoding: Accept-Encoding as RFC 9110 reads it: a named coding
// with a non-zero weight, or "*", and gzip's x-gzip alias.
func TestAcceptsCoding(t *testing.T) {
	tests := []struct {
		accept []string
		coding string
		want   bool
	}{
		{nil, "gzip", false},
		{[]string{""}, "gzip", false},
		{[]string{"gzip"}, "gzip", true},
		{[]string{"GZIP"}, "gzip", true},
		{[]string{"x-gzip"}, "gzip", true},
		{[]string{"gzip"}, "x-gzip", true},
		{[]string{"deflate, gzip;q=1.0, *;q=0.5"}, "gzip", true},
		{[]string{"br", "gzip"}, "gzip", true},
		{[]string{"gzip;q=0"}, "gzip", false},
		{[]string{"gzip ; Q = 0.000"}, "gzip", false},
		{[]string{"gzip;q=0.001"}, "gzip", true},
		{[]string{"gzip;q=bogus"}, "gzip", true},
		{[]string{"identity"}, "gzip", false},
		{[]string{"br, deflate"}, "gzip", false},
		{[]string{"*"}, "gzip", true},
		{[]string{"*;q=0"}, "gzip", false},
		{[]string{"*, gzip;q=0"}, "gzip", false},
		{[]string{"gzip;q=0, *"}, "gzip", false},
		{[]string{"*;q=0, gzip"}, "gzip", true},
		{[]string{"gzip"}, "br", false},
		{[]string{"br;q=0.8"}, "br", true},
	}
	for _, tt := range tests {
		if got := acceptsCoding(tt.accept, tt.coding); got != tt.want {
			t.Errorf("acceptsCoding(%q, %q): got %v, want %v", tt.accept, tt.coding, got, tt.want)
		}
	}
}

// gzipBytes returns s gzip-compressed.
func gzipBytes(t testing.TB, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestReplayFor: a stored answer is replayed as stored to a sender that
// accepts its coding, decompressed to one that does not accept gzip, and
// not at all (the ack instead) when it cannot be made readable; the stored
// answer itself is never changed.
func TestReplayFor(t *testing.T) {
	const plain = `{"id":"pay_1"}`
	zipped := gzipBytes(t, plain)
	big := gzipBytes(t, strings.Repeat("x", decodedReplayMin+1))
	full := gzipBytes(t, strings.Repeat("x", decodedReplayMin))
	stored := func(body []byte, enc ...string) *dedup.Response {
		h := map[string][]string{"Content-Type": {"application/json"}}
		if len(enc) > 0 {
			h["Content-Encoding"] = enc
		}
		return &dedup.Response{Status: 201, Header: h, Body: body}
	}
	tests := []struct {
		name     string
		stored   *dedup.Response
		accept   []string
		limit    int64
		wantSame bool   // stored itself
		wantBody string // else the decompressed body; "" for nil
	}{
		{"plain, no Accept-Encoding", stored([]byte(plain)), nil, 64 << 10, true, ""},
		{"identity, no Accept-Encoding", stored([]byte(plain), "identity"), nil, 64 << 10, true, ""},
		{"gzip to a gzip sender", stored(zipped, "gzip"), []string{"gzip, deflate"}, 64 << 10, true, ""},
		{"gzip to a sender with *", stored(zipped, "gzip"), []string{"*"}, 64 << 10, true, ""},
		{"gzip, no Accept-Encoding", stored(zipped, "gzip"), nil, 64 << 10, false, plain},
		{"x-gzip to an identity sender", stored(zipped, "x-gzip"), []string{"identity"}, 64 << 10, false, plain},
		{"gzip refused by weight", stored(zipped, "gzip"), []string{"gzip;q=0, br"}, 64 << 10, false, plain},
		{"GZIP spelt in capitals", stored(zipped, "GZIP"), nil, 64 << 10, false, plain},
		{"gzip decompressing to 1 MiB exactly", stored(full, "gzip"), nil, 64 << 10, false, strings.Repeat("x", decodedReplayMin)},
		{"gzip decompressing past 1 MiB", stored(big, "gzip"), nil, 64 << 10, false, ""},
		{"gzip within a larger max_replay_bytes", stored(big, "gzip"), nil, 2 << 20, false, strings.Repeat("x", decodedReplayMin+1)},
		{"broken gzip", stored([]byte("not gzip"), "gzip"), nil, 64 << 10, false, ""},
		{"truncated gzip", stored(zipped[:len(zipped)-4], "gzip"), nil, 64 << 10, false, ""},
		{"br to a gzip-only sender", stored([]byte("br bytes"), "br"), []string{"gzip"}, 64 << 10, false, ""},
		{"br to a br sender", stored([]byte("br bytes"), "br"), []string{"br"}, 64 << 10, true, ""},
		{"gzip then br, one refused", stored([]byte("x"), "gzip, br"), []string{"gzip"}, 64 << 10, false, ""},
		{"gzip then br, both accepted", stored([]byte("x"), "gzip", "br"), []string{"br, gzip"}, 64 << 10, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := fmt.Sprint(tt.stored)
			got := replayFor(tt.stored, tt.accept, tt.limit)
			if after := fmt.Sprint(tt.stored); after != before {
				t.Errorf("stored answer changed: got %s, want %s", after, before)
			}
			switch {
			case tt.wantSame:
				if got != tt.stored {
					t.Errorf("got %v, want the stored answer as it is", got)
				}
			case tt.wantBody == "":
				if got != nil {
					t.Errorf("got %d %v (%d bytes), want nil (the ack)", got.Status, got.Header, len(got.Body))
				}
			case got == nil:
				t.Errorf("got nil, want the body decompressed")
			default:
				if string(got.Body) != tt.wantBody {
					t.Errorf("got body %.40q (%d bytes), want %.40q (%d bytes)", got.Body, len(got.Body), tt.wantBody, len(tt.wantBody))
				}
				if _, ok := got.Header["Content-Encoding"]; ok {
					t.Errorf("got Content-Encoding %q, want none", got.Header["Content-Encoding"])
				}
				if got.Status != 201 || got.Header["Content-Type"][0] != "application/json" {
					t.Errorf("got %d %v, want 201 with the stored Content-Type", got.Status, got.Header)
				}
			}
		})
	}
}

// FuzzReplayFor: whatever the stored bytes, coding and Accept-Encoding,
// replayFor returns the stored answer, nil, or an answer with no
// Content-Encoding within the bound.
func FuzzReplayFor(f *testing.F) {
	f.Add([]byte(`{"id":"pay_1"}`), "gzip", "")
	f.Add(gzipBytes(f, `{"id":"pay_1"}`), "gzip", "deflate, *;q=0")
	f.Add([]byte{0x1f, 0x8b, 8, 0}, "x-gzip", "identity;q=1")
	f.Add([]byte("x"), "gzip,  ,br", "gzip;q=0.5;level=1")
	f.Fuzz(func(t *testing.T, body []byte, coding, accept string) {
		stored := &dedup.Response{Status: 200, Header: map[string][]string{"Content-Encoding": {coding}}, Body: body}
		got := replayFor(stored, []string{accept}, 0)
		if got == nil || got == stored {
			return
		}
		if _, ok := got.Header["Content-Encoding"]; ok {
			t.Errorf("got Content-Encoding %q in a decompressed answer", got.Header["Content-Encoding"])
		}
		if len(got.Body) > decodedReplayMin {
			t.Errorf("got %d bytes decompressed, want at most %d", len(got.Body), decodedReplayMin)
		}
	})
}
