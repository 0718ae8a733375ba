package redisstore

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

func TestRecordRoundTrip(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 123e6, time.UTC)
	sha := strings.Repeat("0f", 32)
	resp := &dedup.Response{
		Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}, "X-Empty": {}, "X-Multi": {"a", "", "b,c"}},
		Body:   []byte("{\"ok\":true}\x00,\xff"),
	}
	tests := []struct {
		name   string
		header string // state,first_seen,expires_at,attempts,aux
		body   string
		fp     string
		result string
		want   dedup.Record
	}{
		{
			name:   "processing, hex digests",
			header: "p," + base36(t0.UnixMilli()) + "," + base36(t0.Add(time.Minute).UnixMilli()) + ",1,0123abcd",
			body:   sha, fp: sha,
			want: dedup.Record{State: dedup.StateProcessing, FirstSeen: t0, LeaseUntil: t0.Add(time.Minute), ExpiresAt: t0.Add(time.Minute),
				Attempts: 1, Owner: "0123abcd", BodySHA256: sha, Fingerprint: sha},
		},
		{
			name:   "processed with response, odd digests",
			header: "d," + base36(t0.UnixMilli()) + "," + base36(t0.Add(time.Hour).UnixMilli()) + ",3," + base36(t0.Add(time.Second).UnixMilli()),
			body:   strings.ToUpper(sha), fp: "not,hex",
			result: encodeResult(201, "", false, resp),
			want: dedup.Record{State: dedup.StateProcessed, FirstSeen: t0, CompletedAt: t0.Add(time.Second), ExpiresAt: t0.Add(time.Hour),
				Attempts: 3, LastStatus: 201, BodySHA256: strings.ToUpper(sha), Fingerprint: "not,hex", Response: resp},
		},
		{
			name:   "failed with error, no digests",
			header: "f," + base36(0) + "," + base36(t0.UnixMilli()) + ",12," + base36(1),
			result: encodeResult(0, "connection refused", false, nil),
			want: dedup.Record{State: dedup.StateFailed, FirstSeen: time.UnixMilli(0), CompletedAt: time.UnixMilli(1), ExpiresAt: t0,
				Attempts: 12, LastError: "connection refused"},
		},
		{
			name:   "failed, maybe processed",
			header: "f," + base36(0) + "," + base36(t0.UnixMilli()) + ",2," + base36(1),
			result: encodeResult(0, "timeout", true, nil),
			want: dedup.Record{State: dedup.StateFailed, FirstSeen: time.UnixMilli(0), CompletedAt: time.UnixMilli(1), ExpiresAt: t0,
				Attempts: 2, LastError: "timeout", MaybeProcessed: true},
		},
		{
			name:   "processing, maybe processed carried over",
			header: "p," + base36(0) + "," + base36(t0.UnixMilli()) + ",3,0123abcd",
			result: encodeResult(500, "", true, nil),
			want: dedup.Record{State: dedup.StateProcessing, FirstSeen: time.UnixMilli(0), LeaseUntil: t0, ExpiresAt: t0,
				Attempts: 3, Owner: "0123abcd", LastStatus: 500, MaybeProcessed: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := encodeClaim(tt.body, tt.fp)
			value := tt.header + "," + itoa(len(claim)) + "," + claim + tt.result
			got, err := decodeRecord(value)
			if err != nil {
				t.Fatalf("decodeRecord: got error %v, want nil", err)
			}
			for _, tm := range []*time.Time{&got.FirstSeen, &got.CompletedAt, &got.LeaseUntil, &got.ExpiresAt,
				&tt.want.FirstSeen, &tt.want.CompletedAt, &tt.want.LeaseUntil, &tt.want.ExpiresAt} {
				if !tm.IsZero() {
					*tm = tm.UTC()
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("decodeRecord:\ngot  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestClaimPartSize(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	tests := []struct {
		body, fp string
		want     int
	}{
		{"", "", 2},
		{sha, "", 34},
		{sha, sha, 66},
		{"short", "", 8},
	}
	for _, tt := range tests {
		if got := len(encodeClaim(tt.body, tt.fp)); got != tt.want {
			t.Errorf("len(encodeClaim(%q, %q)): got %d, want %d", tt.body, tt.fp, got, tt.want)
		}
	}
}

func TestDecodeRecordRejects(t *testing.T) {
	tests := []struct{ name, value string }{
		{"empty", ""},
		{"too few fields", "d,1,2,3"},
		{"bad state", "x,1,2,1,1,2,\x00\x00"},
		{"bad time", "d,!,2,1,1,2,\x00\x00"},
		{"claim length beyond value", "d,1,2,1,1,99,\x00\x00"},
		{"negative claim length", "d,1,2,1,1,-1,\x00\x00"},
		{"short digest", "d,1,2,1,1,5,\x01abcd"},
		{"unknown field tag", "d,1,2,1,1,2,\x07\x00"},
		{"trailing claim bytes", "d,1,2,1,1,3,\x00\x00\x00"},
		{"bad response tag", "d,1,2,1,1,2,\x00\x00\xc8\x01\x00\x09"},
		{"maybe tag after the response tag's place", "f,1,2,1,1,2,\x00\x00\xc8\x01\x00\x02\x02"},
		{"string beyond value", "d,1,2,1,1,2,\x00\x00\xc8\x01\x7f"},
		{"huge header count", "d,1,2,1,1,2,\x00\x00\xc8\x01\x00\x01\xc8\x01\xff\xff\xff\x0f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if rec, err := decodeRecord(tt.value); err == nil {
				t.Errorf("decodeRecord(%q): got (%+v, nil), want an error", tt.value, rec)
			}
		})
	}
}

func FuzzDecodeRecord(f *testing.F) {
	sha := strings.Repeat("ab", 32)
	claim := encodeClaim(sha, "fp")
	f.Add("p,1,2,1,tok," + itoa(len(claim)) + "," + claim)
	f.Add("d,1,2,1,3," + itoa(len(claim)) + "," + claim + encodeResult(200, "", false, &dedup.Response{
		Status: 200, Header: map[string][]string{"A": {"b"}}, Body: []byte("body")}))
	f.Add("f,1,2,1,3,2,\x00\x00" + encodeResult(0, "timeout", false, nil))
	f.Add("f,1,2,1,3,2,\x00\x00" + encodeResult(0, "timeout", true, nil))
	f.Fuzz(func(t *testing.T, value string) {
		rec, err := decodeRecord(value)
		if err != nil {
			return
		}
		// A decodable record's claim part encodes back to a prefix that
		// decodes to the same digests.
		again := encodeClaim(rec.BodySHA256, rec.Fingerprint)
		b, rest, err1 := readField(again)
		fp, rest, err2 := readField(rest)
		if err1 != nil || err2 != nil || rest != "" || b != rec.BodySHA256 || fp != rec.Fingerprint {
			t.Errorf("claim part of %q: got (%q, %q, %q, %v, %v), want (%q, %q, \"\", nil, nil)",
				value, b, fp, rest, err1, err2, rec.BodySHA256, rec.Fingerprint)
		}
	})
}

func itoa(n int) string { return strconv.Itoa(n) }
