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
// ASK when the map was stale. A pipeliner is made for a master address the
// first time one of its keys is sent.
//
// Until the client has loaded its first slot map (the Cluster unreachable,
// or hanging, since start), finding a key's master loads it, on the
// caller's goroutine. When that fails the operation fails with that error
// (a *slotMapError): nothing was sent. Handing the command to a pipeliner
// all the same would load the map a second time, for the pipeline, and
// double the time a failing call takes.
//
// Pipeliners of departed masters are closed. Masters come and go with
// failovers and resharding, and on Kubernetes a restarted Redis pod comes
// back under a new address: kept until close, their idle workers would
// pile up over months. The rules:
//
//   - Every pipeliner counts its users: forKey hands it out under mu and
//     counts one more, and the caller calls release once its command
//     returned. A pipeliner is closed only when it is out of the map, so
//     that forKey cannot hand it out again, and has no user left: a caller
//     never finds the pipeliner it was handed closed under it (which would
//     fail it with dedup.ErrClosed on a healthy Store).
//   - A new address is the sign that the slot map changed, so forKey,
//     having made its pipeliner, checks every pipeliner against the
//     client's slot map (no round trip: the map is loaded). One whose last
//     key (the key it was last handed out for) has another master now is
//     retired: taken out of the map, and closed at once if nobody uses it,
//     else by the release of its last user. If its address is still a
//     master (resharding moved only that slot away), its next key makes it
//     a new pipeliner: a retirement costs at most a pipeliner's restart,
//     never a failed call. The new pipeliner is checked too, against a map
//     at least as new as the one that named its master: one made from a
//     map already replaced is retired by its own arrival.
//   - Closing runs on a goroutine of n (a worker may still be sending a
//     batch whose callers gave up, until the read timeout), which close
//     waits for; close closes every pipeliner not yet closed, retired ones
//     with users too.
//
// So the common path is a map lookup under mu, plus a second lock of mu
// to release. A master that leaves with no new address arriving (its
// slots resharded to the remaining masters) keeps its pipeliner until the
// next arrival: what is left over is bounded by the masters gone since
// the last arrival, and does not grow.
type nodePipes struct {
	cc *redis.ClusterClient

	mu      sync.Mutex
	m       map[string]*nodePipe   // by master address
	retired map[*nodePipe]struct{} // out of m, waiting for their users
	closed  bool
	closing sync.WaitGroup // closes of retired pipeliners
}

// nodePipe is one master address's pipeliner and its use; nodePipes.mu
// guards every field but p and addr.
type nodePipe struct {
	p    *pipeliner
	addr string
	// key is the key it was last handed out for: its master was addr
	// then.
	key     string
	users   int  // handed out and not released
	retired bool // out of the map: closed once users falls to 0
}

// newNodePipes returns per-master pipelines on cc.
func newNodePipes(cc *redis.ClusterClient) *nodePipes {
	return &nodePipes{cc: cc, m: make(map[string]*nodePipe), retired: make(map[*nodePipe]struct{})}
}

// forKey returns key's master's pipeliner, which stays open until the
// caller calls release with it. It returns a *slotMapError when the master
// is not known (the slot map could not be loaded), and dedup.ErrClosed
// once n is closed; nothing was sent either way.
func (n *nodePipes) forKey(ctx context.Context, key string) (*nodePipe, error) {
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
	np := n.m[addr]
	arrived := np == nil
	if arrived {
		np = &nodePipe{p: newPipeliner(n.cc, defaultInFlight, defaultMaxBatch, 0, 0), addr: addr} // no WAIT on a Cluster
		n.m[addr] = np
	}
	np.key = key
	np.users++
	if arrived {
		n.retireDeparted(ctx)
	}
	return np, nil
}

// retireDeparted retires every pipeliner whose last key has another master
// in the client's slot map now. The one just made is checked too: a caller
// that found its master in a map replaced since makes one for an address
// that already left. n.mu is held.
func (n *nodePipes) retireDeparted(ctx context.Context) {
	for addr, np := range n.m {
		node, err := n.cc.MasterForKey(ctx, np.key)
		if err != nil || node.Options().Addr == addr {
			continue // still its master, or the map cannot tell
		}
		delete(n.m, addr)
		np.retired = true
		if np.users == 0 {
			n.closing.Go(np.p.close)
		} else {
			n.retired[np] = struct{}{}
		}
	}
}

// release ends a use of np that forKey handed out: np's last user closes
// it once it was retired.
func (n *nodePipes) release(np *nodePipe) {
	n.mu.Lock()
	defer n.mu.Unlock()
	np.users--
	if np.retired && np.users == 0 && !n.closed {
		delete(n.retired, np)
		n.closing.Go(np.p.close)
	}
}

// close closes every pipeliner, retired ones still in use too, and waits
// for the closes under way: later forKey calls return dedup.ErrClosed.
// Callers still using one get their replies first (see pipeliner.close).
func (n *nodePipes) close() {
	n.mu.Lock()
	n.closed = true
	ps := make([]*pipeliner, 0, len(n.m)+len(n.retired))
	for _, np := range n.m {
		ps = append(ps, np.p)
	}
	for np := range n.retired {
		ps = append(ps, np.p)
	}
	n.mu.Unlock()
	for _, p := range ps {
		p.close()
	}
	n.closing.Wait()
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
