package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

// TestProcessedRecordMatchesScript: the commit fast path writes, over each
// kind of processing record a claim writes (a first claim, a takeover of a
// failed record carrying its history, a takeover of a lapsed lease with the
// maybe-processed mark), the value commit.lua writes.
func TestProcessedRecordMatchesScript(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	now := storetestEpochMS
	leaseMS := time.Minute.Milliseconds()
	claim := func(t *testing.T, key string, at int64, claimPart string) string {
		t.Helper()
		reply, err := claimScript.Run(ctx, client, []string{key},
			at, base36(at), base36(at+leaseMS), leaseMS+leaseGrace.Milliseconds(), dedup.NewToken(), claimPart, "").Slice()
		if err != nil {
			t.Fatalf("claim script: %v", err)
		}
		_, value, err := claimReply(reply)
		if err != nil {
			t.Fatalf("claim script: %v", err)
		}
		return value
	}
	token := func(record string) string { return strings.Split(record, ",")[4] }
	tests := []struct {
		name string
		// claimed leaves key claimed and returns the record it holds.
		claimed func(t *testing.T, key string) string
		result  string
	}{
		{"first claim", func(t *testing.T, key string) string {
			return claim(t, key, now, encodeClaim(strings.Repeat("ab", 32), ""))
		}, encodeResult(200, "", false, nil)},
		{"first claim, raw fingerprint, stored response", func(t *testing.T, key string) string {
			return claim(t, key, now, encodeClaim("", "fp, with a comma"))
		}, encodeResult(201, "", false, &dedup.Response{Status: 201, Header: map[string][]string{"A": {"b"}}, Body: []byte("d,1,2,")})},
		{"takeover of a failed record", func(t *testing.T, key string) string {
			first := claim(t, key, now-2000, encodeClaim("", ""))
			if _, err := releaseScript.Run(ctx, client, []string{key}, now-1000, token(first), base36(now-1000), base36(now+3600_000), 3600_000,
				encodeResult(503, "upstream said no", false, nil)).Int64(); err != nil {
				t.Fatalf("release script: %v", err)
			}
			return claim(t, key, now, encodeClaim("", ""))
		}, encodeResult(200, "", false, nil)},
		{"takeover of a lapsed lease", func(t *testing.T, key string) string {
			claim(t, key, now-leaseMS-1000, encodeClaim("", ""))
			return claim(t, key, now, encodeClaim("", ""))
		}, encodeResult(204, "", false, nil)},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "commit" + strconv.Itoa(i)
			claimed := tt.claimed(t, key)
			at, expires, windowMS := base36(now+5), now+5+3600_000, int64(3600_000)
			got, leaseUntil, ok := processedRecord(claimed, at, expires, tt.result)
			if !ok {
				t.Fatalf("processedRecord(%q): not a processing record", claimed)
			}
			if want := now + leaseMS; leaseUntil != want {
				t.Errorf("lease end: got %d, want %d", leaseUntil, want)
			}
			if n, err := commitScript.Run(ctx, client, []string{key}, now+5, token(claimed), at, base36(expires), windowMS, tt.result).Int64(); err != nil || n != 1 {
				t.Fatalf("commit script: got (%d, %v), want (1, nil)", n, err)
			}
			want, err := client.Get(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("processed record:\ngot  %q\nwant %q (commit.lua's)", got, want)
			}
			if !sameCommit(want, got) {
				t.Errorf("sameCommit(commit.lua's record, the fast path's): got false, want true")
			}
		})
	}
	if _, _, ok := processedRecord("d,1,2,1,3,0,", "4", 5, ""); ok {
		t.Errorf("processedRecord of a processed record: got ok, want false")
	}
}

// TestSameCommit: a processed record is the same commit as another when
// only their expires_at differ.
func TestSameCommit(t *testing.T) {
	const rec = "d,abc,def,1,ghi,2,xyresult"
	tests := []struct {
		old  string
		want bool
	}{
		{rec, true},
		{"d,abc,zzzzzz,1,ghi,2,xyresult", true},
		{"d,abc,def,1,ghj,2,xyresult", false}, // another completed_at
		{"d,abd,def,1,ghi,2,xyresult", false}, // another first_seen
		{"d,abc,def,2,ghi,2,xyresult", false}, // another attempt count
		{"d,abc,def,1,ghi,2,xyresulT", false}, // another result
		{"f,abc,def,1,ghi,2,xyresult", false}, // failed, not processed
		{"p,abc,def,1,ghi,2,xyresult", false},
		{"d,abc", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := sameCommit(tt.old, rec); got != tt.want {
			t.Errorf("sameCommit(%q, %q): got %v, want %v", tt.old, rec, got, tt.want)
		}
	}
}
