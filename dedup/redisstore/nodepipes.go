package redisstore

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// nodePipes gives each Cluster master its own pipeliner. One pipeliner for
// the whole Cluster batches every caller's commands together, so nearly
// every pipeline holds a key of each master and waits for the slowest: a
// master that hangs (a stopped host, a partition) holds both pipeline
// slots until the read timeout, and the deliveries of every other master
// queue behind them. Batched per master, only that master's keys wait.
//
// A key's master is the one the client's slot map names now; the
// pipelines still go through the Cluster client, which follows MOVED and
// ASK when the map was stale. A pipeliner is made for a master the first
// time one of its keys is sent, and kept until close: masters come and go
// only with failovers and resharding, so there are few.
type nodePipes struct {
	cc *redis.ClusterClient

	mu     sync.Mutex
	m      map[string]*pipeliner // by master address
	closed bool
}

// newNodePipes returns per-master pipelines on cc.
func newNodePipes(cc *redis.ClusterClient) *nodePipes {
	return &nodePipes{cc: cc, m: make(map[string]*pipeliner)}
}

// forKey returns the pipeliner of key's master, or fallback when the
// master is not known (no slot map yet, the Cluster down) or n is closed.
func (n *nodePipes) forKey(ctx context.Context, key string, fallback *pipeliner) *pipeliner {
	node, err := n.cc.MasterForKey(ctx, key)
	if err != nil {
		return fallback
	}
	addr := node.Options().Addr
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return fallback
	}
	p := n.m[addr]
	if p == nil {
		p = newPipeliner(n.cc, defaultInFlight, defaultMaxBatch, 0, 0) // no WAIT on a Cluster
		n.m[addr] = p
	}
	return p
}

// close closes every master's pipeliner: later forKey calls get the
// fallback, which the Store closes too.
func (n *nodePipes) close() {
	n.mu.Lock()
	n.closed = true
	ps := make([]*pipeliner, 0, len(n.m))
	for _, p := range n.m {
		ps = append(ps, p)
	}
	n.mu.Unlock()
	for _, p := range ps {
		p.close()
	}
}
