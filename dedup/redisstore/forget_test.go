package redisstore

import (
	"context"
	"errors"
	"net"
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
	go func() { _, err := admin.Forget(ctx, k, dedup.ForgetOptions{}); forgot <- err }()
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
