package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

func (s *Store) sweepLoop(interval time.Duration) {
	defer s.wg.Done()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
			start := time.Now()
			n, err := s.sweep(context.Background())
			if err != nil {
				s.log.Warn("sweep failed", zap.Int("deleted", n), zap.Error(err))
				continue
			}
			if n > 0 { // at most one line per SweepInterval
				s.log.Info("swept expired records", zap.Int("deleted", n), zap.Duration("took", time.Since(start)))
			}
		}
	}
}

// Sweep deletes every record expired at the store's clock, in transactions
// of at most Options.SweepBatch records, and drops in-memory leases that ran
// out more than dedup.LeaseGrace ago (their owner may still commit). It returns how many records it deleted. It stops early, without
// error, when the store is closing. The background sweeper calls it every
// Options.SweepInterval; tests and tools may call it directly.
func (s *Store) Sweep(ctx context.Context) (int, error) {
	if err := s.enter(ctx, "sweep"); err != nil {
		return 0, err
	}
	defer s.leave()
	return s.sweep(ctx)
}

func (s *Store) sweep(ctx context.Context) (int, error) {
	now := s.now()
	s.mu.Lock()
	for k, l := range s.leases {
		if l.finishing == nil && now.After(l.until.Add(dedup.LeaseGrace)) {
			delete(s.leases, k)
		}
	}
	s.mu.Unlock()

	// Expired records still in the journal reach bbolt first, so one sweep
	// deletes everything expired at now.
	if err := s.flush(ctx); errors.Is(err, dedup.ErrClosed) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("boltstore: sweep: %w", err)
	}
	nowMs := now.UnixMilli()
	total := 0
	for {
		select {
		case <-s.stop:
			return total, nil
		default:
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("boltstore: sweep: %w", err)
		}
		n, more, err := s.sweepOnce(nowMs)
		total += n
		s.swept.Add(uint64(n))
		if err != nil {
			return total, fmt.Errorf("boltstore: sweep: %w", err)
		}
		if !more {
			return total, nil
		}
	}
}

// sweepOnce deletes up to s.sweepBatch records whose expiry is before nowMs
// in one write transaction, walking the expiry index from its start. It
// reports whether more may remain.
func (s *Store) sweepOnce(nowMs int64) (deleted int, more bool, err error) {
	err = s.db.Update(func(tx *bolt.Tx) error {
		if s.onSweepTx != nil {
			defer func(start time.Time) { s.onSweepTx(time.Since(start)) }(time.Now())
		}
		deleted, more = 0, false
		recs, idx := tx.Bucket(bucketRecords), tx.Bucket(bucketExpiry)
		keys := make([][]byte, 0, min(s.sweepBatch, 1024))
		c := idx.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			if len(keys) == s.sweepBatch {
				more = true
				break
			}
			if len(k) >= 8 && int64(binary.BigEndian.Uint64(k)) >= nowMs {
				break
			}
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if len(k) > 8 {
				rk := k[8:]
				// Only the record this entry indexes: a record rewritten with
				// a later expiry has its own entry.
				if v := recs.Get(rk); v != nil {
					if exp, ok := recordExpiry(v); !ok || exp == int64(binary.BigEndian.Uint64(k)) {
						if err := recs.Delete(rk); err != nil {
							return err
						}
						deleted++
					}
				}
			}
			if err := idx.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	return deleted, more, err
}
