package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// checkpointLoop checkpoints sealed journal segments as the writer seals
// them, retrying a failed checkpoint every checkpointRetry. It stops when
// s.stop closes; Close runs the last checkpoint itself.
func (s *Store) checkpointLoop() {
	defer s.wg.Done()
	var retry <-chan time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-s.sealedCh:
		case <-retry:
		}
		retry = nil
		if err := s.checkpoint(); err != nil {
			s.log.Warn("checkpoint failed; the journal keeps the writes", zap.Error(err))
			retry = time.After(checkpointRetry)
		}
	}
}

// checkpointItem is the newest journaled write of one key.
type checkpointItem struct {
	key string
	recentEntry
}

// checkpoint copies what the sealed segments hold into bbolt in one
// transaction, in key order, then forgets them: their entries leave the
// in-memory index (unless written again since) and their files are removed.
// Only the newest write of each key is copied. On error nothing is forgotten
// and the next checkpoint retries.
func (s *Store) checkpoint() error {
	s.checkpointMu.Lock()
	defer s.checkpointMu.Unlock()
	s.sealedMu.Lock()
	segs := slices.Clone(s.sealed)
	s.sealedMu.Unlock()
	if len(segs) == 0 {
		return nil
	}
	end := segs[len(segs)-1].end
	n := 0
	for _, seg := range segs {
		n += len(seg.keys)
	}
	items := make([]checkpointItem, 0, n)
	s.recentMu.RLock()
	for _, seg := range segs {
		for _, k := range seg.keys {
			// The map holds each key's newest write: take it once, when it
			// is in these segments (a newer one waits for its own).
			if e, ok := s.recent[k]; ok && e.seq <= end {
				items = append(items, checkpointItem{key: k, recentEntry: e})
			}
		}
	}
	s.recentMu.RUnlock()
	slices.SortFunc(items, func(a, b checkpointItem) int {
		if c := strings.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmpUint(a.seq, b.seq)
	})
	items = slices.CompactFunc(items, func(a, b checkpointItem) bool { return a.key == b.key })

	start := time.Now()
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, it := range items {
			if err := applyWrite(tx, []byte(it.key), it.val); err != nil {
				return err
			}
		}
		return setCheckpoint(tx, end)
	})
	if s.onCheckpoint != nil {
		s.onCheckpoint(len(items), time.Since(start))
	}
	if err != nil {
		return fmt.Errorf("boltstore: checkpoint: %w", err)
	}

	s.recentMu.Lock()
	for _, it := range items {
		if e, ok := s.recent[it.key]; ok && e.seq == it.seq {
			delete(s.recent, it.key)
		}
	}
	s.recentMu.Unlock()
	s.sealedMu.Lock()
	s.sealed = slices.Delete(s.sealed, 0, len(segs))
	for _, seg := range segs {
		s.backlog -= seg.size
	}
	s.sealedMu.Unlock()
	select {
	case s.drained <- struct{}{}:
	default:
	}
	// A removal that does not survive a crash is harmless: replay skips
	// entries the checkpoint sequence number covers.
	for _, seg := range segs {
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("journal segment not removed", zap.String("segment", seg.path), zap.Error(err))
		}
	}
	return nil
}

// applyWrite stores val under rk, moving its expiry index entry, or deletes
// rk's record when val is nil.
func applyWrite(tx *bolt.Tx, rk, val []byte) error {
	if _, err := deleteRecord(tx, rk); err != nil || val == nil {
		return err
	}
	if err := tx.Bucket(bucketRecords).Put(rk, val); err != nil {
		return err
	}
	exp, ok := recordExpiry(val)
	if !ok {
		return nil // never: we encoded it; the sweeper would not find it
	}
	return tx.Bucket(bucketExpiry).Put(indexKey(exp, rk), []byte{})
}

func checkpointSeq(tx *bolt.Tx) uint64 {
	if v := tx.Bucket(bucketMeta).Get(metaCheckpointKey); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func setCheckpoint(tx *bolt.Tx, seq uint64) error {
	if seq <= checkpointSeq(tx) {
		return nil
	}
	return tx.Bucket(bucketMeta).Put(metaCheckpointKey, binary.BigEndian.AppendUint64(nil, seq))
}

// replay applies the journal segments a previous process left (after a
// crash) to bbolt, one transaction per segment, skipping entries an earlier
// checkpoint covered, and removes them. It returns the next sequence number
// to hand out. A torn tail ends its segment: it was never acknowledged.
func (s *Store) replay() (uint64, error) {
	var last uint64
	if err := s.db.View(func(tx *bolt.Tx) error { last = checkpointSeq(tx); return nil }); err != nil {
		return 0, err
	}
	segs, err := listSegments(s.path)
	if err != nil {
		return 0, fmt.Errorf("list journal: %w", err)
	}
	for _, seg := range segs {
		applied := 0
		err := s.db.Update(func(tx *bolt.Tx) error {
			done := checkpointSeq(tx)
			f, err := os.Open(seg.path)
			if err != nil {
				return err
			}
			defer f.Close()
			end := done
			rerr := readWAL(f, func(e walEntry) error {
				end = max(end, e.seq)
				if e.seq <= done {
					return nil
				}
				applied++
				// bbolt keeps key and value until the commit: copy them out
				// of the reader's buffer.
				var val []byte
				if e.val != nil {
					val = slices.Clone(e.val)
				}
				return applyWrite(tx, slices.Clone(e.key), val)
			})
			if errors.Is(rerr, errTorn) {
				s.log.Warn("journal segment ends in a torn entry (a write the crash interrupted, never acknowledged); replayed what precedes it",
					zap.String("segment", seg.path), zap.Error(rerr))
			} else if rerr != nil {
				return rerr
			}
			last = max(last, end)
			return setCheckpoint(tx, end)
		})
		if err != nil {
			return 0, fmt.Errorf("replay journal %s: %w", seg.path, err)
		}
		if applied > 0 {
			s.log.Info("replayed journal segment", zap.String("segment", seg.path), zap.Int("writes", applied))
		}
		if err := os.Remove(seg.path); err != nil {
			return 0, fmt.Errorf("replay journal: %w", err)
		}
	}
	return last + 1, nil
}
