package redisstore

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

// Bounds of one List page.
const (
	// listScanRounds is how many SCAN calls one List page makes at most; a
	// page that runs out of them ends early, with a Next cursor.
	listScanRounds = 100
	// listMinCount is the smallest COUNT a SCAN of List asks for.
	listMinCount = 10
)

// listCursorTag starts List's cursors.
const listCursorTag = "r"

// listCursor is where a listing stands, handed out base64url-encoded JSON
// behind listCursorTag.
type listCursor struct {
	// Node is the address of the Cluster master being scanned; empty on a
	// single node or Sentinel master, and once every master is done.
	Node string `json:"n,omitempty"`
	// Scan is that node's SCAN cursor; 0 with Node set means its start.
	Scan uint64 `json:"c,omitempty"`
	// Done is set once every node's SCAN ended.
	Done bool `json:"d,omitempty"`
	// Pending are IDs a SCAN found and that matched, but found no room on
	// their page: the next page reads them first.
	Pending []string `json:"p,omitempty"`
}

func (c listCursor) encode() string {
	b, _ := json.Marshal(c) // strings and numbers only
	return listCursorTag + base64.RawURLEncoding.EncodeToString(b)
}

func parseListCursor(s string) (listCursor, error) {
	var c listCursor
	if s == "" {
		return c, nil
	}
	bad := fmt.Errorf("%w: not a cursor this store hands out", dedup.ErrBadCursor)
	rest, ok := strings.CutPrefix(s, listCursorTag)
	if !ok {
		return c, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || json.Unmarshal(b, &c) != nil {
		return c, bad
	}
	for _, id := range c.Pending {
		if !isLiteral(id, false) { // only literal IDs are listed
			return c, bad
		}
	}
	return c, nil
}

// listNode is one node a listing scans.
type listNode struct {
	addr   string // empty but on a Cluster
	client redis.Cmdable
}

// listNodes returns the nodes a listing scans: the single node or the
// Sentinel master, or every Cluster master, sorted by address so a cursor
// can name where it stands.
func (s *Store) listNodes(ctx context.Context) ([]listNode, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return []listNode{{client: s.client}}, nil
	}
	var (
		mu    sync.Mutex // ForEachMaster calls fn concurrently
		nodes []listNode
	)
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, listNode{addr: c.Options().Addr, client: c})
		return nil
	})
	slices.SortFunc(nodes, func(a, b listNode) int { return strings.Compare(a.addr, b.addr) })
	return nodes, err
}

// List implements dedup.Store with SCAN: MATCH on the namespace's key
// prefix, COUNT about the room left on the page, on the single node, the
// Sentinel master, or each Cluster master in turn (the cursor names the
// master and its SCAN cursor); the values are read with GETs in one
// pipeline per SCAN step. As SCAN does, it lists in no order and may
// return a key twice (when Redis rehashes meanwhile); a key present from
// the first page to the last is returned at least once, unless the
// Cluster's masters change during the listing, which fails the next page
// with ErrBadCursor (start again).
//
// SCAN walks the whole keyspace of the database, every prefix and
// namespace, so a listing costs O(keys in the database) commands' worth of
// Redis time, in steps of about the page size: for operators, never for a
// hot path. IDs stored by their SHA-256 (see redisKey) are not listed: the
// hash does not give the ID back.
func (s *Store) List(ctx context.Context, namespace string, opts dedup.ListOptions) (dedup.ListPage, error) {
	if s.closed.Load() {
		return dedup.ListPage{}, dedup.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return dedup.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
	}
	cur, err := parseListCursor(opts.Cursor)
	if err != nil {
		return dedup.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
	}
	nodes, err := s.listNodes(ctx)
	if err != nil {
		return dedup.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
	}
	idx := 0
	switch {
	case cur.Done:
		idx = len(nodes)
	case cur.Node != "":
		idx = slices.IndexFunc(nodes, func(n listNode) bool { return n.addr == cur.Node })
		if idx < 0 {
			return dedup.ListPage{}, fmt.Errorf("redisstore: list: %w: the Cluster's masters changed during the listing (%s is no longer one); start the listing again", dedup.ErrBadCursor, cur.Node)
		}
	}
	l := redisLister{
		s:     s,
		keyNS: s.prefix + part(namespace, true) + ":",
		opts:  opts,
		limit: opts.PageLimit(),
		now:   s.nowMS(),
	}
	match := globEscape(l.keyNS) + "*"
	scan, pending := cur.Scan, cur.Pending
	for rounds := 0; ; rounds++ {
		if len(pending) > 0 {
			if pending, err = l.fetch(ctx, pending); err != nil {
				return dedup.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
			}
			if len(l.page.Entries) == l.limit {
				break
			}
		}
		if idx == len(nodes) || rounds == listScanRounds {
			break
		}
		count := max(l.limit-len(l.page.Entries), listMinCount)
		keys, next, err := nodes[idx].client.Scan(ctx, scan, match, int64(count)).Result()
		if err != nil {
			return dedup.ListPage{}, fmt.Errorf("redisstore: list: scan: %w", err)
		}
		for _, k := range keys {
			// A hashed ID starts with hashedMark: its hash is all there is.
			if id := strings.TrimPrefix(k, l.keyNS); len(id) < len(k) && isLiteral(id, false) {
				pending = append(pending, id)
			}
		}
		if scan = next; scan == 0 {
			idx++
		}
	}
	if idx == len(nodes) && len(pending) == 0 {
		return l.page, nil
	}
	next := listCursor{Scan: scan, Pending: pending, Done: idx == len(nodes)}
	if !next.Done {
		next.Node = nodes[idx].addr
	}
	l.page.Next = next.encode()
	return l.page, nil
}

// redisLister is the state of one List page.
type redisLister struct {
	s     *Store
	keyNS string // prefix + namespace part + ":"
	opts  dedup.ListOptions
	limit int
	now   int64 // unix ms
	page  dedup.ListPage
}

// fetch reads the records of ids in one pipeline and adds those live and
// matching to the page; it returns the IDs of those that matched but found
// no room.
func (l *redisLister) fetch(ctx context.Context, ids []string) ([]string, error) {
	pipe := l.s.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.Get(ctx, l.keyNS+id)
	}
	_, _ = pipe.Exec(ctx) // each command carries its own reply
	var overflow []string
	for i, cmd := range cmds {
		v, err := cmd.Result()
		if isNil(err) {
			continue // gone since the SCAN
		}
		if err != nil {
			return nil, fmt.Errorf("get: %w", err)
		}
		rec, err := decodeRecord(v)
		if err != nil {
			l.s.log.Warn("list: skipped an undecodable record (forget the key to repair it)", zap.String("key", l.keyNS+ids[i]), zap.Error(err))
			continue
		}
		if rec.ExpiresAt.UnixMilli() < l.now || !l.opts.Match(rec) {
			continue
		}
		if len(l.page.Entries) == l.limit {
			overflow = append(overflow, ids[i])
			continue
		}
		rec.Owner, rec.Response = "", nil
		l.page.Entries = append(l.page.Entries, dedup.ListEntry{ID: ids[i], Record: rec})
	}
	return overflow, nil
}

// globEscape escapes the characters special in a Redis MATCH pattern.
func globEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '*', '?', '[', ']', '\\', '^', '-':
			b.WriteByte('\\')
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
