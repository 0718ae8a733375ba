package boltstore

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 678_000_000, time.UTC)

func TestRecordRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		rec  dedup.Record
	}{
		{"processed minimal", dedup.Record{State: dedup.StateProcessed, FirstSeen: t0, CompletedAt: t0.Add(time.Second), ExpiresAt: t0.Add(24 * time.Hour), Attempts: 1, LastStatus: 200}},
		{"processed full", dedup.Record{
			State: dedup.StateProcessed, FirstSeen: t0, CompletedAt: t0.Add(3 * time.Second), ExpiresAt: t0.Add(72 * time.Hour),
			Attempts: 3, LastStatus: 201, BodySHA256: strings.Repeat("a1", 32), Fingerprint: strings.Repeat("9f", 32),
			Response: &dedup.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", ""}}, Body: []byte{0, 1, 0xff}},
		}},
		{"failed with error", dedup.Record{State: dedup.StateFailed, FirstSeen: t0, CompletedAt: t0.Add(30 * time.Second), ExpiresAt: t0.Add(time.Hour), Attempts: 2, LastError: "timeout"}},
		{"failed, maybe processed", dedup.Record{State: dedup.StateFailed, FirstSeen: t0, CompletedAt: t0.Add(30 * time.Second), ExpiresAt: t0.Add(time.Hour), Attempts: 3, LastStatus: 500, MaybeProcessed: true}},
		{"non-hex hashes", dedup.Record{State: dedup.StateFailed, FirstSeen: t0, CompletedAt: t0, ExpiresAt: t0, Attempts: 1, BodySHA256: "ABCDEF", Fingerprint: "xyz"}},
		{"odd-length hex", dedup.Record{State: dedup.StateFailed, FirstSeen: t0, CompletedAt: t0, ExpiresAt: t0, Attempts: 1, BodySHA256: "abc"}},
		{"clock went back", dedup.Record{State: dedup.StateProcessed, FirstSeen: t0, CompletedAt: t0.Add(-time.Hour), ExpiresAt: t0.Add(-time.Minute), Attempts: 1, LastStatus: 204}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := encodeRecord(nil, &tt.rec)
			got, err := decodeRecord(b)
			if err != nil {
				t.Fatalf("decodeRecord: got error %v, want nil", err)
			}
			if !reflect.DeepEqual(got, tt.rec) {
				t.Errorf("round trip: got %+v, want %+v", got, tt.rec)
			}
			exp, ok := recordExpiry(b)
			if !ok || exp != tt.rec.ExpiresAt.UnixMilli() {
				t.Errorf("recordExpiry: got (%d, %v), want (%d, true)", exp, ok, tt.rec.ExpiresAt.UnixMilli())
			}
		})
	}
}

func TestRecordSize(t *testing.T) {
	rec := dedup.Record{State: dedup.StateProcessed, FirstSeen: t0, CompletedAt: t0.Add(40 * time.Millisecond), ExpiresAt: t0.Add(24 * time.Hour), Attempts: 1, LastStatus: 200, BodySHA256: strings.Repeat("ab", 32)}
	if got := len(encodeRecord(nil, &rec)); got > 56 {
		t.Errorf("encoded processed record with body hash: got %d bytes, want at most 56", got)
	}
}

func TestDecodeRejectsCorrupt(t *testing.T) {
	good := encodeRecord(nil, &dedup.Record{State: dedup.StateProcessed, FirstSeen: t0, CompletedAt: t0, ExpiresAt: t0, Attempts: 1, LastStatus: 200, LastError: "x"})
	tests := []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"bad version", append([]byte{9}, good[1:]...)},
		{"bad state", append([]byte{good[0], 7}, good[2:]...)},
		{"maybe flag without a state", append([]byte{good[0], stateMaybe}, good[2:]...)},
		{"truncated", good[:len(good)-1]},
		{"trailing byte", append(append([]byte{}, good...), 0)},
		{"huge length", []byte{1, 2, 0, 0, 0, 1, 200, 0xff, 0xff, 0xff, 0xff, 0x0f}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if rec, err := decodeRecord(tt.b); err == nil {
				t.Errorf("decodeRecord(%x): got (%+v, nil), want an error", tt.b, rec)
			}
		})
	}
}

// FuzzDecodeRecord: decoding arbitrary bytes never panics, and whatever
// decodes re-encodes to something that decodes to the same record.
func FuzzDecodeRecord(f *testing.F) {
	f.Add(encodeRecord(nil, &dedup.Record{State: dedup.StateProcessed, FirstSeen: t0, CompletedAt: t0, ExpiresAt: t0.Add(time.Hour), Attempts: 1, LastStatus: 200, BodySHA256: strings.Repeat("ab", 32)}))
	f.Add(encodeRecord(nil, &dedup.Record{State: dedup.StateFailed, FirstSeen: t0, CompletedAt: t0, ExpiresAt: t0, Attempts: 4, LastError: "connection refused",
		Response: &dedup.Response{Status: 200, Header: map[string][]string{"A": {"b"}}, Body: []byte("body")}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := decodeRecord(b)
		if err != nil {
			return
		}
		again, err := decodeRecord(encodeRecord(nil, &rec))
		if err != nil {
			t.Fatalf("re-decode of %+v: %v", rec, err)
		}
		if !reflect.DeepEqual(normalise(again), normalise(rec)) {
			t.Fatalf("re-decode: got %+v, want %+v", again, rec)
		}
	})
}

// normalise drops distinctions the encoding does not keep: an empty header
// value list and a nil one.
func normalise(r dedup.Record) dedup.Record {
	if r.Response != nil {
		resp := *r.Response
		h := map[string][]string{}
		for k, v := range resp.Header {
			if len(v) > 0 {
				h[k] = v
			} else {
				h[k] = nil
			}
		}
		resp.Header = h
		r.Response = &resp
	}
	return r
}
