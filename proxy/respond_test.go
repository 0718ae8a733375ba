package proxy

import (
	"bytes"
	"encoding/json"
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
