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
// in-memory index (unless written again since) and their files are handed
// back for reuse (or removed, beyond maxFreeSlots).
// Only the newest write of each key is copied. On error nothing is forgotten
// and the next checkpoint retries; the failure is counted (see Stats).
func (s *Store) checkpoint() (err error) {
	s.checkpointMu.Lock()
	defer s.checkpointMu.Unlock()
	defer func() {
		if err != nil {
			s.checkpointFailures.Add(1)
		}
	}()
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
			// The map holds each key's newest write: copy it, even when it
			// is newer than these segments. Skipping the key would move the
			// checkpoint past its write in these segments while the newer
			// one may not be flushed yet, and a power loss would then bring
			// back what that write replaced (a forgotten record, say).
			// bbolt ahead of the checkpoint for a key is harmless: replay
			// applies the key's later entries again, in order.
			if e, ok := s.recent[k]; ok {
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
	err = s.db.Update(func(tx *bolt.Tx) error {
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
	s.checkpoints.Add(1)
	for _, it := range items {
		if e, ok := s.recent[it.key]; ok && e.seq == it.seq {
			delete(s.recent, it.key)
		}
	}
	s.recentMu.Unlock()
	var remove []string
	s.sealedMu.Lock()
	s.sealed = slices.Delete(s.sealed, 0, len(segs))
	s.retiring -= len(segs)
	for _, seg := range segs {
		s.backlog -= seg.size
		if !s.keepSlot(seg.slot) {
			remove = append(remove, seg.path)
		}
	}
	s.sealedMu.Unlock()
	select {
	case s.drained <- struct{}{}:
	default:
	}
	// What a removed or reused file still holds is at or below the
	// checkpoint: replay skips it.
	for _, path := range remove {
		s.removeSegment(path)
	}
	return nil
}

// keepSlot hands a checkpointed segment file back for reuse, unless
// maxFreeSlots are kept already: then it reports false and the caller
// removes the file. The caller holds sealedMu (or runs before the
// goroutines start).
func (s *Store) keepSlot(slot int) bool {
	if len(s.freeSlots) >= maxFreeSlots {
		return false
	}
	s.freeSlots = append(s.freeSlots, slot)
	return true
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

// replay applies what the journal files a previous process left hold above
// the checkpoint (after a crash: a clean Close checkpointed everything) to
// bbolt, in sequence order, in one transaction, and keeps the files for
// reuse. It returns the next sequence number to hand out. A torn entry ends
// its file: it was never acknowledged. A file of another bbolt file's
// journal is not replayed; a damaged one is replayed around the damage and
// renamed <segment>.damaged-<unix nanoseconds>.
func (s *Store) replay() (uint64, error) {
	var done uint64
	if err := s.db.View(func(tx *bolt.Tx) error { done = checkpointSeq(tx); return nil }); err != nil {
		return 0, err
	}
	slots, err := listSlots(s.path)
	if err != nil {
		return 0, fmt.Errorf("list journal: %w", err)
	}
	last := done
	var pending []walEntry
	damaged := map[string]string{} // segment files to set aside once replayed, to their new names
	for _, sf := range slots {
		b, err := os.ReadFile(sf.path)
		if err != nil {
			return 0, fmt.Errorf("replay journal: %w", err)
		}
		rerr := readWAL(b, s.journal, done, func(e walEntry) error {
			if e.seq <= done {
				return nil // checkpointed
			}
			last = max(last, e.seq)
			pending = append(pending, e) // aliases b, kept until the commit
			return nil
		})
		switch {
		case rerr == nil:
		case errors.Is(rerr, errTorn):
			s.log.Debug("journal file ends in a torn entry (a write the crash interrupted, or an overwritten older entry)",
				zap.String("segment", sf.path), zap.Error(rerr))
		case errors.Is(rerr, errOldFormat):
			s.log.Debug("journal file from an older build, checkpointed when this file got its identity: reused",
				zap.String("segment", sf.path))
		case errors.Is(rerr, errForeign):
			s.log.Warn("journal file belongs to another bbolt file (this one was deleted or replaced?): not replayed, and reused",
				zap.String("segment", sf.path), zap.Error(rerr))
		case errors.Is(rerr, errDamaged):
			// Not a torn write: the file was damaged. Whatever the damage
			// covered is lost; keep the file for a post-mortem.
			kept := fmt.Sprintf("%s.damaged-%d", sf.path, time.Now().UnixNano()) // never over an earlier one
			s.log.Error("journal file is damaged: writes after the damage replayed, those it covered lost (their keys may read older states); the file is kept aside",
				zap.String("segment", sf.path), zap.String("kept_as", kept), zap.Error(rerr))
			damaged[sf.path] = kept
		default:
			return 0, fmt.Errorf("replay journal %s: %w", sf.path, rerr)
		}
	}
	if len(pending) > 0 || s.journal.legacy {
		slices.SortFunc(pending, func(a, b walEntry) int { return cmpUint(a.seq, b.seq) })
		err := s.db.Update(func(tx *bolt.Tx) error {
			for _, e := range pending {
				if err := applyWrite(tx, e.key, e.val); err != nil {
					return err
				}
			}
			if s.journal.legacy { // from now on, its segments name it
				if err := tx.Bucket(bucketMeta).Put(metaJournalKey, binary.BigEndian.AppendUint64(nil, s.journal.id)); err != nil {
					return err
				}
			}
			return setCheckpoint(tx, last)
		})
		if err != nil {
			return 0, fmt.Errorf("replay journal: %w", err)
		}
		if len(pending) > 0 {
			s.log.Info("replayed journal writes the file did not hold yet (left by a crash, or by a final checkpoint that failed)", zap.Int("writes", len(pending)))
		}
	}
	// Every file is checkpointed now: keep a few for reuse, and set a
	// damaged one aside.
	for _, sf := range slots {
		s.nextSlot = max(s.nextSlot, sf.slot+1)
		if kept, ok := damaged[sf.path]; ok {
			if err := os.Rename(sf.path, kept); err != nil {
				return 0, fmt.Errorf("replay journal: %w", err)
			}
			continue
		}
		if !s.keepSlot(sf.slot) {
			if err := os.Remove(sf.path); err != nil {
				return 0, fmt.Errorf("replay journal: %w", err)
			}
		}
	}
	return last + 1, nil
}
