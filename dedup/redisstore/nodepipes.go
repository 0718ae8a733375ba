package redisstore

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dedupgw/dedupgw/dedup"
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
//
// Until the client has loaded its first slot map (the Cluster unreachable,
// or hanging, since start), finding a key's master loads it, on the
// caller's goroutine. When that fails the operation fails with that error
// (a *slotMapError): nothing was sent. Handing the command to a pipeliner
// all the same would load the map a second time, for the pipeline, and
// double the time a failing call takes.
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

// forKey returns the pipeliner of key's master. It returns a *slotMapError
// when the master is not known (the slot map could not be loaded), and
// dedup.ErrClosed once n is closed; nothing was sent either way.
func (n *nodePipes) forKey(ctx context.Context, key string) (*pipeliner, error) {
	node, err := n.cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, &slotMapError{err: err}
	}
	addr := node.Options().Addr
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, dedup.ErrClosed
	}
	p := n.m[addr]
	if p == nil {
		p = newPipeliner(n.cc, defaultInFlight, defaultMaxBatch, 0, 0) // no WAIT on a Cluster
		n.m[addr] = p
	}
	return p, nil
}

// close closes every master's pipeliner: later forKey calls return
// dedup.ErrClosed.
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

// slotMapError is the error of an operation on a Cluster whose key's
// master could not be found: the client has no slot map yet and could not
// load one (err says why: a timeout, a refused connection, an error
// reply). The operation sent nothing (see nothingSent).
type slotMapError struct{ err error }

func (e *slotMapError) Error() string {
	return "the Cluster's slot map could not be loaded to find the key's master: " + e.err.Error()
}

func (e *slotMapError) Unwrap() error { return e.err }
