package redisstore

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

// replyDropper is a TCP relay to a Redis server that, while drop is set,
// passes commands on but throws the replies away: a lost reply, the command
// applied and its sender never told.
type replyDropper struct {
	ln      net.Listener
	drop    atomic.Bool
	dropped atomic.Int64 // reads thrown away
	mu      sync.Mutex
	open    []net.Conn
	wg      sync.WaitGroup
}

func newReplyDropper(t *testing.T, addr string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &replyDropper{ln: ln}
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.open = append(r.open, c, s)
			r.mu.Unlock()
			r.wg.Go(func() { _, _ = io.Copy(s, c); s.Close() })
			r.wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					switch {
					case n > 0 && r.drop.Load():
						r.dropped.Add(1)
					case n > 0:
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for _, c := range r.open {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// TestForgetIsNotResent: go-redis sends a command again after a lost reply
// (MaxRetries). Forget must not be: between the two sends another replica
// may claim and commit the key (the replay the operator forgot it for), and
// a second forget.lua would delete that commit, so the next duplicate would
// be forwarded again. A Forget whose reply is lost reports an error instead,
// and the later commit stays.
func TestForgetIsNotResent(t *testing.T) {
	srv := redistest.Start(t)
	relay := newReplyDropper(t, srv.Addr())
	viaRelay := redis.NewClient(&redis.Options{
		Addr: relay.ln.Addr().String(), ReadTimeout: 300 * time.Millisecond, MaxRetries: 1,
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
	res, err := gw.Claim(ctx, k, lease)
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("first delivery: got %v, %v, want claimed", res.Outcome, err)
	}
	if err := gw.Commit(ctx, k, res.Token, commit); err != nil {
		t.Fatalf("commit: %v", err)
	}

	relay.drop.Store(true)
	forgot := make(chan error, 1)
	go func() { _, err := admin.Forget(ctx, k); forgot <- err }()
	waitFor(t, "forget.lua to delete the key and its reply to be lost", func() bool {
		n, err := direct.Exists(ctx, gw.Key(k)).Result()
		return err == nil && n == 0 && relay.dropped.Load() > 0
	})
	// The operator's replay reaches the other replica and is processed.
	res, err = gw.Claim(ctx, k, lease)
	if err != nil || res.Outcome != dedup.Claimed {
		t.Fatalf("replay: got %v, %v, want claimed", res.Outcome, err)
	}
	if err := gw.Commit(ctx, k, res.Token, commit); err != nil {
		t.Fatalf("replay's commit: %v", err)
	}
	// Replies pass again, before the lost one times out: a resend (on a new
	// connection) would run and be answered.
	relay.drop.Store(false)
	err = await(t, "Forget to return", forgot)
	var netErr net.Error
	if !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Errorf("Forget whose reply was lost: got %v, want a timeout error", err)
	}

	res, err = gw.Claim(ctx, k, lease)
	if err != nil || res.Outcome != dedup.Duplicate {
		t.Errorf("a copy of the committed replay: got %v, %v, want duplicate (a resent forget deleted the commit)", res.Outcome, err)
	}
}
