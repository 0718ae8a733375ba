package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
	"github.com/dedupgw/dedupgw/dedup/redisstore"
	"github.com/dedupgw/dedupgw/dedup/redisstore/redistest"
)

// refusals are the ways a Redis that still answers PING refuses writes,
// each with the settings that cause it and undo it, and the error code it
// answers.
var refusals = []struct {
	name       string
	set, unset func(ctx context.Context, c *redis.Client, deadPort int) error
	code       string
}{
	{
		name: "maxmemory reached under noeviction",
		set: func(ctx context.Context, c *redis.Client, _ int) error {
			return c.ConfigSet(ctx, "maxmemory", "1").Err()
		},
		unset: func(ctx context.Context, c *redis.Client, _ int) error {
			return c.ConfigSet(ctx, "maxmemory", "0").Err()
		},
		code: "OOM",
	},
	{
		name: "a node turned replica",
		set: func(ctx context.Context, c *redis.Client, deadPort int) error {
			return c.Do(ctx, "replicaof", "127.0.0.1", strconv.Itoa(deadPort)).Err()
		},
		unset: func(ctx context.Context, c *redis.Client, _ int) error {
			return c.Do(ctx, "replicaof", "no", "one").Err()
		},
		code: "READONLY",
	},
	{
		name: "min-replicas-to-write unmet",
		set: func(ctx context.Context, c *redis.Client, _ int) error {
			return c.ConfigSet(ctx, "min-replicas-to-write", "1").Err()
		},
		unset: func(ctx context.Context, c *redis.Client, _ int) error {
			return c.ConfigSet(ctx, "min-replicas-to-write", "0").Err()
		},
		code: "NOREPLICAS",
	},
}

// TestRefusedWrites: while Redis answers but refuses writes, Ping fails
// (readiness and dedupgw_store_up follow it), and a claim still answers
// from the record the key holds: a processed key is a duplicate and a held
// lease in flight, so a copy of a processed event is not forwarded again;
// only a claim that must write fails, with Redis's refusal. Once Redis
// takes writes again, so does the store, and the probe left no key behind.
func TestRefusedWrites(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	dead := redistest.Start(t)
	deadPort := dead.Port()
	dead.Stop() // a master that is never there: the replica keeps its data
	ctx := context.Background()
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			// other is another replica, sharing s's keys: s holds the
			// key in flight (its claims of it go straight to claim.lua),
			// other does not (its claims try SET NX GET first).
			cfg := redisstore.Config{Addrs: []string{srv.Addr()}, KeyPrefix: uniquePrefix()}
			s, other := newStore(t, cfg, nil), newStore(t, cfg, nil)
			ns := "refused" + strconv.Itoa(int(time.Now().UnixNano()))
			processed := dedup.Key{Namespace: ns, ID: "evt_processed"}
			held := dedup.Key{Namespace: ns, ID: "evt_held"}
			claimCommit(t, s, processed)
			if res, err := s.Claim(ctx, held, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Claimed {
				t.Fatalf("Claim(held): got (%v, %v), want (claimed, nil)", res.Outcome, err)
			}
			before, err := admin.DBSize(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}

			if err := tt.set(ctx, admin, deadPort); err != nil {
				t.Fatal(err)
			}
			undone := false
			undo := func() {
				if !undone {
					undone = true
					if err := tt.unset(ctx, admin, deadPort); err != nil {
						t.Fatal(err)
					}
				}
			}
			t.Cleanup(undo)

			if err := admin.Ping(ctx).Err(); err != nil {
				t.Fatalf("PING while refusing writes: got %v, want PONG (the case the probe is for)", err)
			}
			err = s.Ping(ctx)
			if err == nil || !strings.Contains(err.Error(), tt.code) || !strings.Contains(err.Error(), "refuses writes") {
				t.Errorf("Ping: got %v, want an error naming %s and that Redis refuses writes", err, tt.code)
			}
			for _, st := range []*redisstore.Store{s, other} {
				if res, err := st.Claim(ctx, processed, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Duplicate {
					t.Errorf("Claim(processed key): got (%v, %v), want (duplicate, nil)", res.Outcome, err)
				}
				if res, err := st.Claim(ctx, held, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.InFlight {
					t.Errorf("Claim(held key): got (%v, %v), want (in-flight, nil)", res.Outcome, err)
				}
				if _, err := st.Claim(ctx, dedup.Key{Namespace: ns, ID: "evt_new"}, dedup.ClaimOptions{Lease: time.Minute}); err == nil || !strings.Contains(err.Error(), tt.code) {
					t.Errorf("Claim(new key): got error %v, want Redis's %s refusal", err, tt.code)
				}
			}

			undo()
			if err := s.Ping(ctx); err != nil {
				t.Errorf("Ping once Redis takes writes again: got %v, want nil", err)
			}
			if after, err := admin.DBSize(ctx).Result(); err != nil || after != before {
				t.Errorf("keys after the probes: got (%d, %v), want %d: the probe must write nothing", after, err, before)
			}
			if res, err := s.Claim(ctx, dedup.Key{Namespace: ns, ID: "evt_new"}, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Claimed {
				t.Errorf("Claim(new key) once Redis takes writes again: got (%v, %v), want (claimed, nil)", res.Outcome, err)
			}
		})
	}
}

// TestRefusedWritesCluster: on a Cluster, Ping's write probe reaches every
// master, so one master at maxmemory fails it, whichever it is.
func TestRefusedWritesCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	s := newStore(t, redisstore.Config{Addrs: cl.Addrs()}, nil)
	ctx := context.Background()
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping: got %v, want nil", err)
	}
	for i, node := range cl.Nodes {
		c := node.Client()
		if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		err := s.Ping(ctx)
		if err == nil || !strings.Contains(err.Error(), "OOM") {
			t.Errorf("Ping with master %d at maxmemory: got %v, want an OOM refusal", i, err)
		}
		if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
			t.Fatal(err)
		}
		if err := s.Ping(ctx); err != nil {
			t.Errorf("Ping with master %d back: got %v, want nil", i, err)
		}
	}
}

// TestSlotTag: keySlot is Redis's CRC16 (the XMODEM check value of
// "123456789" is 0x31C3) and the slot CLUSTER KEYSLOT gives; and each
// slotTag(n) is a hash tag in slot n.
func TestSlotTag(t *testing.T) {
	if got, want := redisstore.KeySlot("123456789"), 0x31C3%16384; got != want {
		t.Errorf("keySlot(%q): got %d, want %d", "123456789", got, want)
	}
	cl := redistest.StartCluster(t, 3)
	c := cl.Nodes[0].Client()
	ctx := context.Background()
	for _, n := range []int{0, 1, 5461, 5462, 10922, 10923, 12182, 16383} {
		tag := redisstore.SlotTag(n)
		if got := redisstore.KeySlot(tag); got != n {
			t.Errorf("keySlot(slotTag(%d) = %q): got %d, want %d", n, tag, got, n)
		}
		key := "dedupgw:dedupgw-start-up-probe:ping{" + tag + "}"
		if got, err := c.ClusterKeySlot(ctx, key).Result(); err != nil || got != int64(n) {
			t.Errorf("CLUSTER KEYSLOT %s: got (%d, %v), want %d", key, got, err, n)
		}
	}
}
