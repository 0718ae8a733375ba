package redisstore

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/chaos"
	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

// TestForgetIsNotResent: go-redis sends a command again after a lost reply
// (MaxRetries). Forget must not be: between the two sends another replica
// may claim and commit the key (the replay the operator forgot it for), and
// a second forget.lua would delete that commit, so the next duplicate would
// be forwarded again. A Forget whose reply is lost reports an error instead,
// and the later commit stays.
func TestForgetIsNotResent(t *testing.T) {
	srv := redistest.Start(t)
	relay, err := chaos.NewDelayProxy(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })
	viaRelay := redis.NewClient(&redis.Options{
		Addr: relay.Addr(), ReadTimeout: 300 * time.Millisecond, MaxRetries: 1,
		ContextTimeoutEnabled: true, // as New configures it
	})
	t.Cleanup(func() { _ = viaRelay.Close() })
	direct := srv.Client()
	admin := NewFromClient(viaRelay, "", Options{}) // the replica serving the admin DELETE
	t.Cleanup(func() { _ = admin.Close() })
	gw := NewFromClient(direct, "", Options{}) // another replica
	t.Cleanup(func() { _ = gw.Close() })
	ctx := context.Background()
	k := dedup.Key{Namespace: "stripe", ID: "evt_1"}
	lease := dedup.ClaimOptions{Lease: time.Minute}
	commit := dedup.CommitOptions{Window: time.Hour, Status: 200}

	// The script is cached, so the lost reply is forget.lua's own, and the
	// relay's connection is open before replies are dropped.
	if err := direct.ScriptLoad(ctx, forgetSrc).Err(); err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	if err := viaRelay.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING through the relay: %v", err)
	}
	// deliver claims and commits k on the other replica, as a forwarded
	// delivery does.
	deliver := func(what string) {
		t.Helper()
		res, err := gw.Claim(ctx, k, lease)
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("%s: got %v, %v, want claimed", what, res.Outcome, err)
		}
		if err := gw.Commit(ctx, k, res.Token, commit); err != nil {
			t.Fatalf("%s's commit: %v", what, err)
		}
	}
	deliver("first delivery")

	relay.SetDropReplies(true)
	forgot := make(chan error, 1)
	go func() { _, err := admin.Forget(ctx, k); forgot <- err }()
	waitFor(t, "forget.lua to delete the key and its reply to be lost", func() bool {
		n, err := direct.Exists(ctx, gw.Key(k)).Result()
		return err == nil && n == 0 && relay.DroppedReplies() > 0
	})
	// The operator's replay reaches the other replica and is processed.
	deliver("replay")
	// Replies pass again, before the lost one times out: a resend (on a new
	// connection) would run and be answered.
	relay.SetDropReplies(false)
	err = await(t, "Forget to return", forgot)
	var netErr net.Error
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Errorf("Forget whose reply was lost: got %v, want a timeout error", err)
	}

	res, err := gw.Claim(ctx, k, lease)
	if err != nil || res.Outcome != dedup.Duplicate {
		t.Errorf("a copy of the committed replay: got %v, %v, want duplicate (a resent forget deleted the commit)", res.Outcome, err)
	}
}

// TestCommitOfALostClaim: a claim can vanish from Redis without anyone
// forgetting it: a Sentinel failover discards what the old master took in
// its last second, or eviction drops the key. The delivery was forwarded
// and processed all the same, so its owner's Commit records it from what
// the claim wrote, and the next copy is a duplicate instead of a second
// forward. A lease forgotten by an operator (on any replica) is not
// recorded: forget.lua leaves a tombstone its owner's Commit finds. A Store
// that did not make the claim never records an absent key.
func TestCommitOfALostClaim(t *testing.T) {
	srv := redistest.Start(t)
	direct := srv.Client()
	gw := NewFromClient(direct, "", Options{})
	t.Cleanup(func() { _ = gw.Close() })
	other := NewFromClient(srv.Client(), "", Options{}) // another replica
	t.Cleanup(func() { _ = other.Close() })
	ctx := context.Background()
	claimOpts := dedup.ClaimOptions{Lease: time.Minute, BodySHA256: strings.Repeat("ab", 32)}
	commit := dedup.CommitOptions{Window: time.Hour, Status: 200}
	claim := func(s *Store, id string) dedup.ClaimResult {
		t.Helper()
		res, err := s.Claim(ctx, dedup.Key{Namespace: "stripe", ID: id}, claimOpts)
		if err != nil || res.Outcome != dedup.Claimed {
			t.Fatalf("claim %s: got %v, %v, want claimed", id, res.Outcome, err)
		}
		return res
	}

	t.Run("lost in a failover: recorded", func(t *testing.T) {
		k := dedup.Key{Namespace: "stripe", ID: "evt_lost"}
		res := claim(gw, k.ID)
		if err := direct.Del(ctx, gw.Key(k)).Err(); err != nil { // what the new master never had
			t.Fatal(err)
		}
		if err := gw.Commit(ctx, k, res.Token, commit); err != nil {
			t.Fatalf("Commit of the lost claim: got %v, want nil", err)
		}
		rec, err := gw.Get(ctx, k)
		if err != nil || rec.State != dedup.StateProcessed || !rec.FirstSeen.Equal(res.Record.FirstSeen) ||
			rec.Attempts != 1 || rec.BodySHA256 != claimOpts.BodySHA256 || rec.LastStatus != 200 {
			t.Errorf("record after the commit: got %+v, %v; want processed, first seen %v, 1 attempt, the claim's body SHA-256, status 200", rec, err, res.Record.FirstSeen)
		}
		if dup, err := other.Claim(ctx, k, claimOpts); err != nil || dup.Outcome != dedup.Duplicate {
			t.Errorf("the next copy: got %v, %v, want duplicate", dup.Outcome, err)
		}
	})

	t.Run("forgotten by an operator on another replica: not recorded", func(t *testing.T) {
		k := dedup.Key{Namespace: "stripe", ID: "evt_forgotten"}
		res := claim(gw, k.ID)
		if existed, err := other.Forget(ctx, k); err != nil || !existed {
			t.Fatalf("Forget: got %v, %v, want true", existed, err)
		}
		if _, err := gw.Get(ctx, k); !errors.Is(err, dedup.ErrNotFound) {
			t.Errorf("Get of the forgotten key: got %v, want ErrNotFound", err)
		}
		if ttl := direct.PTTL(ctx, gw.Key(k)).Val(); ttl <= 0 || ttl > time.Minute+leaseGrace {
			t.Errorf("the tombstone's TTL: got %v, want the rest of the lease plus its grace", ttl)
		}
		if err := gw.Commit(ctx, k, res.Token, commit); !errors.Is(err, dedup.ErrNotOwner) {
			t.Errorf("Commit after Forget: got %v, want ErrNotOwner", err)
		}
		if existed, err := other.Forget(ctx, k); err != nil || existed {
			t.Errorf("a second Forget: got %v, %v, want false", existed, err)
		}
		again := claim(other, k.ID) // over the tombstone
		if again.Record.Attempts != 1 || !again.Record.FirstSeen.After(res.Record.FirstSeen.Add(-time.Millisecond)) {
			t.Errorf("claim after Forget: got %+v, want a fresh record", again.Record)
		}
	})

	t.Run("a claim this Store did not make: not recorded", func(t *testing.T) {
		k := dedup.Key{Namespace: "stripe", ID: "evt_foreign"}
		res := claim(gw, k.ID)
		if err := direct.Del(ctx, gw.Key(k)).Err(); err != nil {
			t.Fatal(err)
		}
		if err := other.Commit(ctx, k, res.Token, commit); !errors.Is(err, dedup.ErrNotOwner) {
			t.Errorf("Commit by another Store: got %v, want ErrNotOwner", err)
		}
		if _, err := gw.Get(ctx, k); !errors.Is(err, dedup.ErrNotFound) {
			t.Errorf("Get: got %v, want ErrNotFound", err)
		}
	})
}
