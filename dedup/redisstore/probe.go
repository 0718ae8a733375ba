package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"
)

// The write probe.
//
// PING proves that Redis answers, not that it takes writes: at maxmemory
// under noeviction it refuses every write with OOM, a node turned replica
// answers READONLY, and min-replicas-to-write makes a master answer
// NOREPLICAS, while PING still answers PONG. Claims of new keys then fail
// (a route failing open forwards them without deduplication, one that
// rejects answers 503) although the store looks up. So Ping also sends
//
//	SET <prefix>dedupgw-start-up-probe:ping{} "" XX
//
// to every master: Redis checks it as any write, and, the key being
// absent, it writes nothing (no memory, no replication, no AOF). No
// event's key holds a "{" (see redisKey), so the probe's is never one. On
// a Cluster it sends one per slot range, each key's braces holding a hash
// tag of that range's first slot (see slotTag), so that every master is
// asked.

// writeProbe sends the write probe (above) and returns a refusal: an
// error when a master refused it as a write (see writeRefused), nil
// otherwise. Other failures are left to the PING that goes before it: a
// user whose ACL does not allow the probe (NOPERM), a single-node store
// given one node of a Cluster (MOVED, warned about at start-up), a Cluster
// slot map that could not be read, a connection lost in between.
func (s *Store) writeProbe(ctx context.Context) error {
	base := s.prefix + probeNamespace + ":ping"
	keys := []string{base + "{}"}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		slots, err := cc.ClusterSlots(ctx).Result()
		if err != nil {
			return nil
		}
		keys = keys[:0]
		for _, r := range slots {
			keys = append(keys, base+"{"+slotTag(r.Start)+"}")
		}
	}
	cmds, _ := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.SetArgs(ctx, k, "", redis.SetArgs{Mode: "XX"})
		}
		return nil
	})
	for _, c := range cmds {
		if err := c.Err(); writeRefused(err) {
			return fmt.Errorf("Redis answers but refuses writes, so claims of new keys fail (copies of processed keys are still answered): %w", err)
		}
	}
	return nil
}

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// slotTags caches, per Cluster hash slot, a short hash tag that maps to it
// (see slotTag): tags[i] is "" until found; next is the first number not
// tried yet.
var slotTags struct {
	mu   sync.Mutex
	tags [clusterSlots]string
	next int
}

// slotTag returns a hash tag (the decimal form of a number) whose key slot
// is slot: a key holding "{" + slotTag(n) + "}" (and no "{" before it) is
// in slot n. Numbers are tried in order, once in the process's life, each
// found tag kept: all 16384 are known after some 170,000 tries.
func slotTag(slot int) string {
	slotTags.mu.Lock()
	defer slotTags.mu.Unlock()
	for slotTags.tags[slot] == "" {
		t := strconv.Itoa(slotTags.next)
		slotTags.next++
		if n := keySlot(t); slotTags.tags[n] == "" {
			slotTags.tags[n] = t
		}
	}
	return slotTags.tags[slot]
}

// keySlot is the Cluster hash slot of a key with no hash tag: CRC16 of the
// key (XMODEM: polynomial 0x1021, initial value 0) modulo 16384, as Redis
// computes it.
func keySlot(key string) int {
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}
