package boltstore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

// Bounds of one List page.
const (
	// listBatch is how many bbolt records one read-only transaction of a
	// List reads: a long read transaction would hold up the checkpointer's
	// growth of the file (bbolt remaps it only without readers).
	listBatch = 256
	// listScanBudget is how many bbolt records one List page examines at
	// most (Store.listBudget; tests lower it); a page that runs out of it
	// ends early, with a Next cursor.
	listScanBudget = 10_000
)

// overlayItem is the in-memory state of one record key at the start of a
// List page: its lease, its journaled write not yet checkpointed, or both.
type overlayItem struct {
	key      string
	lease    *dedup.Record // the lease's record; nil when there is none
	recent   recentEntry
	inRecent bool
}

// List implements dedup.Store. It lists in key order, each key at most
// once, and shows each key as Get does: its lease while a claim is in
// flight, else its journaled write not yet checkpointed, else bbolt's
// record.
//
// A page first copies, under each lock in turn and briefly, the leases and
// then the journaled writes of the namespace past the cursor (O(leases) and
// O(journaled writes) each), then reads bbolt in read-only transactions of
// listBatch records. The order matters: a Commit journals its write before
// it drops its lease, and a checkpoint writes bbolt before it drops the
// journaled entry, so a key that is live throughout is in at least one of
// the three as each is read. IDs stored by their SHA-256 (namespace:id
// longer than maxRawKey bytes) name no namespace and are never listed, nor
// is a corrupt record (logged).
func (s *Store) List(ctx context.Context, namespace string, opts dedup.ListOptions) (dedup.ListPage, error) {
	after, err := dedup.ParseKeyCursor(opts.Cursor)
	if err != nil {
		return dedup.ListPage{}, fmt.Errorf("boltstore: list: %w", err)
	}
	if err := s.enter(ctx, "list"); err != nil {
		return dedup.ListPage{}, err
	}
	defer s.leave()
	l := lister{
		s:      s,
		prefix: namespace + ":",
		opts:   opts,
		limit:  opts.PageLimit(),
		now:    s.now(),
	}
	// from is the first key to look at, or the cursor's key, which is
	// skipped.
	from := l.prefix + after
	skipFrom := opts.Cursor != ""
	l.overlay = s.listOverlay(l.prefix, from, skipFrom)
	if s.listRead != nil {
		s.listRead()
	}

	examined := 0
	for {
		batch, more, err := s.listBatch(l.prefix, from, skipFrom)
		if err != nil {
			return dedup.ListPage{}, fmt.Errorf("boltstore: list: %w", err)
		}
		for _, it := range batch {
			// The overlay's keys before this one have no bbolt record.
			for len(l.overlay) > 0 && l.overlay[0].key < it.key {
				if l.add(l.overlay[0], nil, nil) {
					return l.page, nil
				}
				l.overlay = l.overlay[1:]
			}
			o := overlayItem{key: it.key}
			if len(l.overlay) > 0 && l.overlay[0].key == it.key {
				o = l.overlay[0]
				l.overlay = l.overlay[1:]
			}
			if l.add(o, it.rec, it.err) {
				return l.page, nil
			}
			if examined++; examined >= s.listBudget {
				l.page.Next = dedup.KeyCursor(it.key[len(l.prefix):])
				return l.page, nil
			}
		}
		if !more {
			break
		}
		from, skipFrom = batch[len(batch)-1].key, true
		if err := ctx.Err(); err != nil {
			return dedup.ListPage{}, fmt.Errorf("boltstore: list: %w", err)
		}
	}
	for _, o := range l.overlay {
		if l.add(o, nil, nil) {
			return l.page, nil
		}
	}
	return l.page, nil
}

// lister is the state of one List page.
type lister struct {
	s       *Store
	prefix  string
	opts    dedup.ListOptions
	limit   int
	now     time.Time
	overlay []overlayItem // sorted by key, those not yet looked at
	page    dedup.ListPage
}

// add looks at one key: o is its in-memory state, disk its bbolt record
// (nil when none, or when derr says it is corrupt). It appends the key to
// the page when live and matching, and reports whether the page is full
// (its Next then set).
func (l *lister) add(o overlayItem, disk *dedup.Record, derr error) bool {
	rec, ok := l.truth(o, disk, derr)
	if !ok || !l.opts.Match(rec) {
		return false
	}
	rec.Owner, rec.Response = "", nil
	id := o.key[len(l.prefix):]
	l.page.Entries = append(l.page.Entries, dedup.ListEntry{ID: id, Record: rec})
	if len(l.page.Entries) < l.limit {
		return false
	}
	l.page.Next = dedup.KeyCursor(id)
	return true
}

// truth is the key's live record as Get composes it, ok false when the key
// reads as absent.
func (l *lister) truth(o overlayItem, disk *dedup.Record, derr error) (dedup.Record, bool) {
	if o.lease != nil {
		if l.now.After(o.lease.LeaseUntil) {
			return dedup.Record{}, false
		}
		return *o.lease, true
	}
	if o.inRecent {
		disk, derr = decodeRecent([]byte(o.key), o.recent)
	}
	if derr != nil {
		l.s.log.Warn("list: skipped a corrupt record (forget the key to repair it)", zap.String("key", clip(o.key)), zap.Error(derr))
		return dedup.Record{}, false
	}
	if !live(disk, l.now) {
		return dedup.Record{}, false
	}
	return *disk, true
}

// clip shortens a record key for a log line.
func clip(key string) string {
	const n = 64
	if len(key) <= n {
		return fmt.Sprintf("%q", key)
	}
	return fmt.Sprintf("%q…", key[:n])
}

// inListRange reports whether record key k has prefix and comes after from
// (or is from, unless skipFrom).
func inListRange(k, prefix, from string, skipFrom bool) bool {
	if !strings.HasPrefix(k, prefix) {
		return false
	}
	if skipFrom {
		return k > from
	}
	return k >= from
}

// listOverlay copies the leases, then the journaled writes not yet
// checkpointed, of the keys in List's range, sorted by key. Each lock is
// held for one pass over its map, and never both at once.
func (s *Store) listOverlay(prefix, from string, skipFrom bool) []overlayItem {
	byKey := make(map[string]*overlayItem)
	s.mu.Lock()
	for k, ls := range s.leases {
		if inListRange(k, prefix, from, skipFrom) {
			rec := ls.record()
			byKey[k] = &overlayItem{key: k, lease: &rec}
		}
	}
	s.mu.Unlock()
	s.recentMu.RLock()
	for k, e := range s.recent {
		if !inListRange(k, prefix, from, skipFrom) {
			continue
		}
		it := byKey[k]
		if it == nil {
			it = &overlayItem{key: k}
			byKey[k] = it
		}
		// The entry's val is never changed once journaled: it may be
		// decoded after the lock.
		it.recent, it.inRecent = e, true
	}
	s.recentMu.RUnlock()
	items := make([]overlayItem, 0, len(byKey))
	for _, it := range byKey {
		items = append(items, *it)
	}
	slices.SortFunc(items, func(a, b overlayItem) int { return strings.Compare(a.key, b.key) })
	return items
}

// listItem is one bbolt record read by listBatch.
type listItem struct {
	key string
	rec *dedup.Record
	err error // the record is corrupt
}

// listBatch reads up to listBatch bbolt records in List's range in one
// read-only transaction, and reports whether more may follow.
func (s *Store) listBatch(prefix, from string, skipFrom bool) ([]listItem, bool, error) {
	var (
		items []listItem
		more  bool
	)
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRecords).Cursor()
		p := []byte(prefix)
		k, v := c.Seek([]byte(from))
		if skipFrom && k != nil && string(k) == from {
			k, v = c.Next()
		}
		for ; k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			if len(items) == listBatch {
				more = true
				break
			}
			it := listItem{key: string(k)} // copies: k lives only in the transaction
			if r, err := decodeRecord(v); err != nil {
				it.err = fmt.Errorf("record %q: %w", k, err)
			} else {
				it.rec = &r
			}
			items = append(items, it)
		}
		return nil
	})
	return items, more, err
}
