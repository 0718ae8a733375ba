package boltstore

import (
	bolt "go.etcd.io/bbolt"
)

// writeReq is one write waiting for the group commit.
type writeReq struct {
	fn   func(*bolt.Tx) error
	done chan error
}

// write applies fn in a durable write transaction, shared with every other
// write queued meanwhile, and returns once it is fsynced. fn may run twice
// (see commitBatch), so it must only read and write the transaction.
// Callers hold closeMu for reading, so the writer is running.
func (s *Store) write(fn func(*bolt.Tx) error) error {
	req := &writeReq{fn: fn, done: make(chan error, 1)}
	s.writes <- req
	return <-req.done
}

// writeLoop is the group committer: it takes the first queued write plus all
// that queued behind it (up to maxWriteBatch) and applies them in one
// transaction. While that transaction's fsync runs, the next group queues.
// Unlike bolt's DB.Batch it waits for no timer, so a lone write costs one
// commit and concurrent writes share one. It stops when s.stop closes, which
// Close does only after every operation has returned.
func (s *Store) writeLoop() {
	defer s.wg.Done()
	batch := make([]*writeReq, 0, maxWriteBatch)
	for {
		select {
		case <-s.stop:
			return
		case req := <-s.writes:
			batch = append(batch[:0], req)
		}
	drain:
		for len(batch) < maxWriteBatch {
			select {
			case req := <-s.writes:
				batch = append(batch, req)
			default:
				break drain
			}
		}
		s.commitBatch(batch)
		clear(batch)
	}
}

// commitBatch applies batch in one transaction. If one function fails, the
// transaction is rolled back and each function is retried alone, so the
// failure reaches only its own caller (as bolt's DB.Batch does).
func (s *Store) commitBatch(batch []*writeReq) {
	failed := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, req := range batch {
			if err := req.fn(tx); err != nil {
				failed = true
				return err
			}
		}
		return nil
	})
	if err == nil || !failed || len(batch) == 1 {
		for _, req := range batch {
			req.done <- err
		}
		return
	}
	for _, req := range batch {
		req.done <- s.db.Update(req.fn)
	}
}
