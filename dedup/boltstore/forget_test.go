package boltstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/storetest"
)

// A record the store cannot decode makes every claim of its key fail, so
// Forget is the way to repair the key. A Forget with a State cannot check
// it and fails with the decoding error, keeping it; one that only keeps
// keys in flight (the admin DELETE without ?force) deletes it, since no
// delivery can hold a key whose record cannot be read; so does an
// unconditional one. Both in the journal and once checkpointed.
func TestForgetRepairsAnUndecodableRecord(t *testing.T) {
	ctx := context.Background()
	for _, checkpointed := range []bool{false, true} {
		for _, tt := range storetest.UndecodableForgets {
			s, _ := openTemp(t, Options{})
			k := dedup.Key{Namespace: "n", ID: "evt_corrupt"}
			if err := s.writeDurable(ctx, recordKey(k), []byte("not a record")); err != nil {
				t.Fatal(err)
			}
			if checkpointed {
				if err := s.flush(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err == nil {
				t.Fatalf("Claim of an undecodable record: got nil, want an error")
			}
			rec, err := s.Forget(ctx, k, tt.Opts)
			what := tt.Name
			if checkpointed {
				what += ", checkpointed"
			}
			if tt.Repairs {
				if err != nil || rec != (dedup.Record{}) {
					t.Errorf("%s: Forget: got (%+v, %v), want a zero Record and nil", what, rec, err)
				}
				if res, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Claimed {
					t.Errorf("%s: Claim after Forget: got (%v, %v), want claimed", what, res.Outcome, err)
				}
			} else {
				if err == nil || errors.Is(err, dedup.ErrKept) || errors.Is(err, dedup.ErrNotFound) {
					t.Errorf("%s: Forget: got %v, want the decoding error", what, err)
				}
				if _, err := s.Claim(ctx, k, dedup.ClaimOptions{Lease: time.Minute}); err == nil {
					t.Errorf("%s: Claim after the refused Forget: got nil, want the record kept (an error)", what)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
