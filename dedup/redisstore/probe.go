package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

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
//	SET <prefix>dedupgw-start-up-probe:ping{…} "" XX KEEPTTL
//
// to every master that holds keys of the Store: Redis checks it as any
// write, and, the key being absent, it writes nothing (no memory, no
// replication, no AOF). No event's key holds a "{" (see redisKey), so the
// probe's is never one. On a Cluster the braces hold a tag that puts the
// key in a slot of that master (see probeKeys).

// probeTimeout bounds the write probe. A master whose writes are paused
// (CLIENT PAUSE WRITE, during a manual failover) holds the probe as it
// holds claims, for as long as the pause; that is not a refusal, and
// must not take the ping's whole budget (the readiness probe's is 2s).
const probeTimeout = 500 * time.Millisecond

// writeProbe sends the write probe (above) and returns a refusal: an
// error when a master refused it as a write (see RefusesWrites), nil
// otherwise. Other failures are left to the PING that goes before it: a
// user whose ACL does not allow the probe (NOPERM), a single-node store
// given one node of a Cluster (MOVED, warned about at start-up), a Cluster
// slot map that could not be read, a probe that timed out, a connection
// lost in between.
func (s *Store) writeProbe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	keys := s.probeKeys(ctx)
	cmds, _ := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.SetArgs(ctx, k, "", redis.SetArgs{Mode: "XX", KeepTTL: true})
		}
		return nil
	})
	for _, c := range cmds {
		if err := c.Err(); RefusesWrites(err) {
			return fmt.Errorf("Redis answers but refuses writes, so claims of new keys fail (copies of keys it holds as processed or in flight are still answered): %w", err)
		}
	}
	return nil
}

// probeKeys returns the write probe's keys: one, unless the Store runs on
// a Cluster and its key prefix leaves the slot to the rest of the key; then
// one in a slot of each master, from CLUSTER SLOTS (none when that fails:
// PING has the say).
func (s *Store) probeKeys(ctx context.Context) []string {
	base := s.prefix + probeNamespace + ":ping"
	cc, ok := s.client.(*redis.ClusterClient)
	if _, tagged := hashTag(s.prefix); !ok || tagged {
		// A prefix with a hash tag puts every key of the Store, this one
		// too, in the one slot it names: its master is the one to ask.
		return []string{base + "{}"}
	}
	slots, err := cc.ClusterSlots(ctx).Result()
	if err != nil {
		return nil
	}
	var keys []string
	asked := make(map[string]bool)
	for _, r := range slots {
		if len(r.Nodes) == 0 || asked[r.Nodes[0].Addr] {
			continue
		}
		if k, ok := s.probeKey(base, r.Start); ok {
			asked[r.Nodes[0].Addr] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// probeKey returns a probe key, base + "{…}", in slot, and true; false when
// none was found (a prefix whose braces Redis reads otherwise, searched in
// vain).
func (s *Store) probeKey(base string, slot int) (string, bool) {
	if k := base + "{" + slotTag(slot) + "}"; hashSlot(k) == slot {
		return k, true // the usual case: the braces are the key's tag
	}
	// The prefix holds a "{" that is no tag ("x{}:"): Redis hashes more
	// than the braces. Search for a key in slot, once per slot.
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if k, ok := s.probeFound[slot]; ok {
		return k, k != ""
	}
	if s.probeFound == nil {
		s.probeFound = make(map[int]string)
	}
	for i := range 1 << 20 {
		if k := base + "{" + strconv.Itoa(i) + "}"; hashSlot(k) == slot {
			s.probeFound[slot] = k
			return k, true
		}
	}
	s.probeFound[slot] = ""
	return "", false
}

// hashTag returns key's Cluster hash tag, as Redis finds it: the part
// between the first "{" and the first "}" after it, and true, when that
// part is not empty. A key beginning with a prefix that has a tag has the
// same one, whatever follows.
func hashTag(key string) (string, bool) {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return "", false
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return "", false
	}
	return key[open+1 : open+1+end], true
}

// hashSlot is the Cluster hash slot of key, as Redis computes it: keySlot
// of its hash tag, or of the whole key when it has none.
func hashSlot(key string) int {
	if tag, ok := hashTag(key); ok {
		return keySlot(tag)
	}
	return keySlot(key)
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
// found tag kept: all 16384 are known after some 110,000 tries (about
// 20ms).
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
