package redisstore_test

import (
	"context"
	"net"
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
	// The master a node turned replica is pointed at: a port held open
	// that never answers, so no redis-server another test starts can take
	// it and make the replica sync (and drop its data).
	never, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = never.Close() })
	deadPort := never.Addr().(*net.TCPAddr).Port
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
			before := dirty(t, admin)

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
			if after := dirty(t, admin); after != before {
				t.Errorf("rdb_changes_since_last_save after the probes: got %d, want %d: the probe must write nothing", after, before)
			}
			if res, err := s.Claim(ctx, dedup.Key{Namespace: ns, ID: "evt_new"}, dedup.ClaimOptions{Lease: time.Minute}); err != nil || res.Outcome != dedup.Claimed {
				t.Errorf("Claim(new key) once Redis takes writes again: got (%v, %v), want (claimed, nil)", res.Outcome, err)
			}
		})
	}
}

// TestRefusedWritesCluster: on a Cluster, Ping's write probe reaches every
// master that holds keys of the Store, so one of them at maxmemory fails
// it, whichever it is, also when the key prefix holds braces; with a hash
// tag in the prefix only the master of that slot holds keys.
func TestRefusedWritesCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	ctx := context.Background()
	tagSlot := redisstore.HashSlot("{dgw}")
	tagMaster, err := redistest.MasterOf(ctx, cl.Addrs()[0], tagSlot)
	if err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"dedupgw:", "x{}:", "x{:", "{dgw}:"} {
		s := newStore(t, redisstore.Config{Addrs: cl.Addrs(), KeyPrefix: prefix}, nil)
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("prefix %q: Ping: got %v, want nil", prefix, err)
		}
		for i, node := range cl.Nodes {
			holds := prefix != "{dgw}:" || node.Addr() == tagMaster
			c := node.Client()
			if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
				t.Fatal(err)
			}
			err := s.Ping(ctx)
			if refused := err != nil && strings.Contains(err.Error(), "OOM"); refused != holds {
				t.Errorf("prefix %q, master %d at maxmemory (holds keys: %v): got Ping %v", prefix, i, holds, err)
			}
			if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
				t.Fatal(err)
			}
			if err := s.Ping(ctx); err != nil {
				t.Errorf("prefix %q, master %d back: got Ping %v, want nil", prefix, i, err)
			}
		}
	}
}

// dirty returns the server's count of writes since its last save.
func dirty(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "persistence").Result()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := redisstore.InfoField(info, "rdb_changes_since_last_save")
	if !ok {
		t.Fatalf("INFO persistence: no rdb_changes_since_last_save in %q", info)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSlotTag: keySlot is Redis's CRC16 (the XMODEM check value of
// "123456789" is 0x31C3), hashSlot follows Redis's hash-tag rule as
// CLUSTER KEYSLOT does, and each slotTag(n) is a hash tag in slot n.
func TestSlotTag(t *testing.T) {
	if got, want := redisstore.KeySlot("123456789"), 0x31C3%16384; got != want {
		t.Errorf("keySlot(%q): got %d, want %d", "123456789", got, want)
	}
	for _, tt := range []struct{ key, hashed string }{
		{"dedupgw:a:b", "dedupgw:a:b"},
		{"x{dgw}:a", "dgw"},
		{"x{}:a{b}", "x{}:a{b}"}, // an empty tag: the whole key
		{"x{:a}b", ":a"},
		{"x}a{b", "x}a{b"},
	} {
		if got, want := redisstore.HashSlot(tt.key), redisstore.KeySlot(tt.hashed); got != want {
			t.Errorf("hashSlot(%q): got %d, want keySlot(%q) = %d", tt.key, got, tt.hashed, want)
		}
	}
	cl := redistest.StartCluster(t, 3)
	c := cl.Nodes[0].Client()
	ctx := context.Background()
	for _, key := range []string{"dedupgw:a:b", "x{dgw}:a", "x{}:a{b}", "x{:a}b", "x}a{b"} {
		if got, err := c.ClusterKeySlot(ctx, key).Result(); err != nil || got != int64(redisstore.HashSlot(key)) {
			t.Errorf("CLUSTER KEYSLOT %s: got (%d, %v), want hashSlot's %d", key, got, err, redisstore.HashSlot(key))
		}
	}
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
