package boltstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

// writeReq is one write waiting for the group commit: val nil deletes key.
// A request with seal set writes nothing: it seals the current segment so a
// checkpoint can take everything written before it. A durable request is
// answered after its group's fdatasync, any other once its group is written
// (see writeLoop).
type writeReq struct {
	key     []byte
	val     []byte
	seal    bool
	durable bool
	done    chan error
}

// recentEntry is a journaled write not yet checkpointed into bbolt: val is
// the encoded record, nil for a delete.
type recentEntry struct {
	seq uint64
	val []byte
}

// segment is the journal segment being written, owned by the writer
// goroutine, or a sealed one waiting for its checkpoint.
type segment struct {
	path  string
	slot  int
	nonce uint64 // names this use of the file (see journal.go)
	f     *os.File
	size  int64 // bytes written
	// tried is set once a write into it was attempted: a failed one may have
	// landed in part, so the segment must reach the checkpointer, which
	// moves the checkpoint past its sequence numbers, never be reused as
	// if untouched.
	tried bool
	end   uint64   // the last sequence number handed out while it was current
	keys  []string // keys of its acknowledged entries, in order
	// flushedTo is how many bytes an fdatasync (successful or not) covered;
	// the syncer's alone.
	flushedTo int64
	// syncErr is the segment's first failed fdatasync, the syncer's alone.
	// Every later flush of the segment fails with it: Linux reports a
	// writeback error to an fdatasync once, so the next one returns 0
	// although the pages it failed to write are lost, and replay stops
	// there.
	syncErr error
}

// writeDurable journals key → val (val nil: delete) together with every
// other write queued meanwhile, and returns once it is fsynced and visible
// to lookups. If ctx ends or Close begins first it returns an error; the
// write may still land.
func (s *Store) writeDurable(ctx context.Context, key, val []byte) error {
	return s.send(ctx, &writeReq{key: key, val: val, durable: true, done: make(chan error, 1)})
}

func (s *Store) send(ctx context.Context, req *writeReq) error {
	if err := s.enqueue(ctx, req); err != nil {
		return err
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing:
		return dedup.ErrClosed
	}
}

// enqueue hands req to the writer; on error it was not queued.
func (s *Store) enqueue(ctx context.Context, req *writeReq) error {
	select {
	case s.writes <- req:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing:
		return dedup.ErrClosed
	}
}

// finishWrite journals the outcome of lease l on rk (a Commit or Release)
// and ends l's finishing state with the write's real result. It returns once
// the entry is written to the journal and visible to lookups, before the
// group's fdatasync (see writeLoop for why that is enough). If ctx ends or
// Close begins while the write is queued, it returns that error at once, but
// l stays finishing (so no claim takes the key over and a Forget waits) until
// the write lands or fails: the caller's answer may be an error while the
// write still succeeds, never a lease freed under a write that then lands.
func (s *Store) finishWrite(ctx context.Context, rk []byte, l *lease, val []byte) error {
	req := &writeReq{key: rk, val: val, done: make(chan error, 1)}
	if err := s.enqueue(ctx, req); err != nil {
		s.endFinish(rk, l, false)
		return err
	}
	var err error
	select {
	case werr := <-req.done:
		s.endFinish(rk, l, werr == nil)
		return werr
	case <-ctx.Done():
		err = ctx.Err()
	case <-s.closing:
		err = dedup.ErrClosed
	}
	// The caller holds closeMu for reading, so this Add comes before
	// Close's Wait; the writer answers every queued write, on stop too.
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		werr := <-req.done
		s.endFinish(rk, l, werr == nil)
	}()
	return err
}

// flush seals the current segment and checkpoints every sealed one into
// bbolt, so the bbolt file alone holds every acknowledged write.
func (s *Store) flush(ctx context.Context) error {
	if err := s.send(ctx, &writeReq{seal: true, durable: true, done: make(chan error, 1)}); err != nil {
		return err
	}
	return s.checkpoint()
}

// writer is the state of the writeLoop goroutine.
type writer struct {
	s       *Store
	seg     *segment
	nextSeq uint64
	buf     []byte
	timer   *time.Timer // seals seg checkpointEvery after its first entry
	// deferred is set while timed rotations are put off (see rotatable).
	deferred bool
}

// writeLoop is the group committer: it takes the first queued write plus all
// that queued behind it (up to maxWriteBatch), appends them to the journal in
// one write, makes them visible to lookups and answers the commits and
// releases among them. The syncer (syncLoop) fdatasyncs what was written
// meanwhile, so the writer never waits for a flush: while one runs, the next
// groups are written behind it and the next fdatasync covers them all.
// Durable requests (Forget, a seal) are answered by the syncer after the
// fdatasync that covers them. Unlike bolt's DB.Batch it waits for no timer.
//
// Why a commit is answered before its fdatasync: once written, the entry is
// in the kernel's page cache, so it survives kill -9 and any crash of the
// gateway; only a power loss (or kernel crash) before the fdatasync that
// follows can forget it. The gateway answers the sender with the upstream's
// 2xx whether or not the commit succeeds, so waiting would only delay that
// answer: a power loss before it reached the sender left the key just as
// unrecorded, and the provider retried for certain, where now it retries
// only if it would have redelivered anyway. What is given up: the flush
// can end later than the old synchronous one would have (pacing, queueing),
// and a power loss in that extra time forgets a commit whose sender was
// answered, so a spontaneous redelivery of that event after the restart is
// forwarded again. Meanwhile the wait was most of a unique delivery's
// latency on bolt (0.35 ms at p50, 1.3 ms at p90 on a busy two-core
// machine), which 32 senders turned into 20% less throughput.
//
// A segment is sealed checkpointEvery after its first entry, or sooner when
// it grows large, and reaches the checkpointer through the syncer once it is
// flushed. The loop stops when s.stop closes, which Close does only after
// every operation has returned; it seals the current segment on the way out
// and then closes s.syncs, which stops the syncer.
func (s *Store) writeLoop(nextSeq uint64, opened chan<- error) {
	defer s.wg.Done()
	defer close(s.syncs)
	w := &writer{s: s, nextSeq: nextSeq, timer: time.NewTimer(time.Hour)}
	w.timer.Stop()
	defer w.timer.Stop()
	// Reserve the first segment before any claim: on a volume without room
	// for one, or a failing disk, the store starts out unable to record, as
	// after any journal failure (claims fail, Ping reports it, probes find
	// out when it records again). Left to the first commit, the first key
	// would have been granted, forwarded, and its commit lost.
	err := w.open()
	if err != nil {
		err = fmt.Errorf("journal: %w", err)
		s.noteJournalFailure(err, nextSeq-1)
	}
	opened <- err
	batch := make([]*writeReq, 0, maxWriteBatch)
	for {
		select {
		case <-s.stop:
			w.seal()
			// Answer what is still queued: only finishWrite's waiters can
			// be left (every operation has returned), and they wait for it.
			for {
				select {
				case req := <-s.writes:
					req.done <- dedup.ErrClosed
				default:
					return
				}
			}
		case <-w.timer.C:
			if !w.rotatable() {
				w.timer.Reset(s.checkpointEvery) // try again then
				continue
			}
			w.seal()
			continue
		case req := <-s.writes:
			batch = append(batch[:0], req)
		}
		// Let goroutines that are about to write run first: under load they
		// join this group instead of paying for an fdatasync of their own
		// (measured: groups of 3 became 5, +10% unique deliveries/s on two
		// cores). When nothing else is runnable this returns at once, so a
		// lone write still waits for no timer.
		runtime.Gosched()
	drain:
		for len(batch) < maxWriteBatch {
			select {
			case req := <-s.writes:
				batch = append(batch, req)
			default:
				break drain
			}
		}
		w.commit(batch)
		clear(batch)
	}
}

// commit journals batch and acknowledges each request.
func (w *writer) commit(batch []*writeReq) {
	s := w.s
	w.awaitCheckpoint()
	if f := s.syncFailed.Swap(nil); f != nil && f == w.seg {
		// An fdatasync of this segment failed: the kernel may have dropped
		// its pages, so its tail is in doubt. Go on in a fresh one.
		w.seal()
	}
	seals, writes := 0, 0
	for _, req := range batch {
		if req.seal {
			seals++
		} else {
			writes++
		}
	}
	first := w.nextSeq
	var err error
	if writes > 0 {
		if err = w.open(); err == nil {
			w.encode(batch, first)
			if w.seg.size > 0 && w.seg.size+int64(len(w.buf)) > segmentBytes {
				// Overwrite in place, never extend, when it can be helped:
				// the group goes to a fresh segment, under its nonce.
				w.seal()
				if err = w.open(); err == nil {
					w.encode(batch, first)
				}
			}
		}
		w.nextSeq += uint64(writes)
		if err == nil {
			w.seg.tried = true
			_, err = s.writeAt(w.seg.f, w.buf, w.seg.size)
			w.seg.end = w.nextSeq - 1
			if err != nil {
				w.failed("journal write failed", err)
			} else {
				if w.seg.size == 0 && s.checkpointEvery > 0 {
					w.timer.Reset(s.checkpointEvery) // its first entry
				}
				w.seg.size += int64(len(w.buf))
			}
		}
	}
	if err == nil && writes > 0 && w.deferred {
		w.noteTight()
	}
	if err == nil && writes > 0 {
		s.recentMu.Lock()
		seq := first
		for _, req := range batch {
			if req.seal {
				continue
			}
			k := string(req.key)
			s.recent[k] = recentEntry{seq: seq, val: req.val}
			w.seg.keys = append(w.seg.keys, k)
			seq++
		}
		s.recentMu.Unlock()
	}
	if err != nil {
		err = fmt.Errorf("journal: %w", err)
		s.noteJournalFailure(err, w.nextSeq-1)
	}
	// Answer the commits and releases now; durable requests and seals wait
	// for the syncer.
	item := syncWork{}
	for _, req := range batch {
		if req.seal || (req.durable && err == nil) {
			item.waiters = append(item.waiters, req)
		} else {
			req.done <- err
		}
	}
	if err == nil && writes > 0 {
		item.sync, item.upTo, item.lastSeq = w.seg, w.seg.size, w.nextSeq-1
	}
	if seals > 0 || (w.seg != nil && (w.seg.size >= segmentBytes || len(w.seg.keys) >= maxSegmentEntries)) {
		item.seal = w.retire()
	}
	if item.sync != nil || item.seal != nil || len(item.waiters) > 0 {
		s.syncs <- item
	}
}

// failed logs a failed write of the current segment and seals it: its tail
// is in doubt, so the next group goes to a fresh segment.
func (w *writer) failed(msg string, err error) {
	w.s.log.Error(msg, zap.String("segment", w.seg.path), zap.Error(err))
	w.seal()
}

// encode fills w.buf with batch's writes, numbered from first, for the
// current segment: after its header when nothing is written yet.
func (w *writer) encode(batch []*writeReq, first uint64) {
	w.buf = w.buf[:0]
	nonce := w.seg.nonce
	if w.seg.size == 0 {
		w.buf = appendSegmentHeader(w.buf, nonce, w.s.journal.id)
	}
	seq := first
	for _, req := range batch {
		if req.seal {
			continue
		}
		w.buf = appendWALEntry(w.buf, nonce, seq, req.key, req.val)
		seq++
	}
}

// awaitCheckpoint holds the writer while the sealed segments exceed
// maxBacklogBytes, so a checkpointer that cannot keep up slows writes down
// instead of letting the in-memory index grow without bound.
func (w *writer) awaitCheckpoint() {
	s := w.s
	for {
		s.sealedMu.Lock()
		over := s.backlog > s.maxBacklog
		s.sealedMu.Unlock()
		if !over {
			return
		}
		select {
		case <-s.drained:
		case <-s.closing:
			return
		}
	}
}

// open makes sure there is a current segment: a checkpointed file handed
// back for reuse, or a new one, zero-filled to segmentBytes and made
// durable before anything is written to it.
func (w *writer) open() error {
	if w.seg != nil {
		return nil
	}
	s := w.s
	s.sealedMu.Lock()
	slot, reuse := 0, len(s.freeSlots) > 0
	if reuse {
		slot = s.freeSlots[len(s.freeSlots)-1]
		s.freeSlots = s.freeSlots[:len(s.freeSlots)-1]
	} else {
		slot = s.nextSlot
		s.nextSlot++
	}
	s.sealedMu.Unlock()
	path := slotPath(s.path, slot)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil && !reuse {
		err = s.preallocate(f)
	}
	if err != nil {
		if f != nil {
			_ = f.Close()
		}
		if reuse {
			s.sealedMu.Lock()
			s.freeSlots = append(s.freeSlots, slot) // try it again next time
			s.sealedMu.Unlock()
		} else {
			// Half created: never reuse it as if it were durable.
			s.dropNewSlot(slot)
			if w.awaitSlot() {
				return w.open() // a checkpoint handed a file back: reuse it
			}
		}
		return err
	}
	w.seg = &segment{path: path, slot: slot, nonce: randomNonce(), f: f, end: w.nextSeq - 1}
	return nil
}

// rotatable reports whether the timer may seal the current segment now:
// when a file is free for the next segment, when no sealed segment waits
// for a checkpoint (this one's file comes back once checkpointed, see
// awaitSlot), or when a new file can be made (zero-filled here and kept
// free for the next segment). Otherwise (a full disk, where the checkpoints
// that would hand files back fail too, as bbolt cannot grow) a seal would
// leave the next group without a file, failing its commits and releases
// although the current file has room for them: the segment stays current,
// taking writes until it is full, and the timer tries again.
func (w *writer) rotatable() bool {
	if w.seg == nil { // nothing to seal
		return w.rotating()
	}
	s := w.s
	s.sealedMu.Lock()
	free, waiting := len(s.freeSlots) > 0, s.retiring > 0
	slot := s.nextSlot
	if !free && waiting {
		s.nextSlot++ // this goroutine alone makes files: the name is ours
	}
	s.sealedMu.Unlock()
	if free || !waiting {
		return w.rotating()
	}
	path := slotPath(s.path, slot)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = s.preallocate(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	s.sealedMu.Lock()
	kept := err == nil && s.keepSlot(slot)
	free = len(s.freeSlots) > 0 // a checkpoint may have handed one back meanwhile
	s.sealedMu.Unlock()
	if !kept {
		s.dropNewSlot(slot)
	}
	if kept || free {
		return w.rotating()
	}
	if !w.deferred {
		w.deferred = true
		s.log.Warn("journal rotation put off: no room for another journal file while the sealed ones wait for a checkpoint; writes go on into the current file until it is full",
			zap.String("segment", w.seg.path), zap.Error(err))
	}
	w.noteTight()
	return false
}

// dropNewSlot removes the journal file of slot, one just made that will not
// be used, and gives its number back when no later one was taken: on a full
// disk every try makes a new file, and the names would count up without
// end.
func (s *Store) dropNewSlot(slot int) {
	if err := os.Remove(slotPath(s.path, slot)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return
	}
	s.sealedMu.Lock()
	if s.nextSlot == slot+1 {
		s.nextSlot = slot
	}
	s.sealedMu.Unlock()
}

// noteTight sets journalTight once the current segment, while rotations are
// put off, is over half full (in bytes or entries): the other half is kept
// for the commits and releases of the claims already granted.
func (w *writer) noteTight() {
	if w.seg == nil || w.s.journalTight.Load() || w.seg.size <= segmentBytes/2 && len(w.seg.keys) <= maxSegmentEntries/2 {
		return
	}
	w.s.journalTight.Store(true)
	w.s.log.Warn("journal nearly full with no room for another file: new claims are refused (the routes' on_store_error decides) and readiness fails until a checkpoint can write the database again",
		zap.String("segment", w.seg.path), zap.Int64("bytes", w.seg.size), zap.Int("entries", len(w.seg.keys)))
}

// rotating ends a spell of rotations put off (see rotatable) and reports
// true.
func (w *writer) rotating() bool {
	if w.deferred {
		w.deferred = false
		w.s.journalTight.Store(false)
		w.s.log.Info("journal rotation resumed")
	}
	return true
}

// randomNonce returns 8 random bytes that are not zero.
func randomNonce() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
		if n := binary.BigEndian.Uint64(b[:]); n != 0 {
			return n
		}
	}
}

// preallocate zero-fills a new segment file to segmentBytes and makes it and
// its directory entry durable, so later writes into it change no metadata.
func preallocate(f *os.File) error {
	zeros := make([]byte, 1<<20)
	for off := int64(0); off < segmentBytes; off += int64(len(zeros)) {
		if _, err := f.WriteAt(zeros, off); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return syncDir(filepath.Dir(f.Name()))
}

// seal ends the current segment, if any: the syncer flushes it, closes it
// and hands it to the checkpointer. A segment never written to is ready for
// reuse at once (see retire).
func (w *writer) seal() {
	if seg := w.retire(); seg != nil {
		w.s.syncs <- syncWork{seal: seg}
	}
}

// slotWait bounds how long the writer waits for a checkpoint to hand back
// a journal file when it cannot make a new one (see awaitSlot).
const slotWait = time.Second

// awaitSlot waits, after a new segment file could not be made (a volume
// with room for one or two journal files), for a checkpoint to hand back
// one of the segments the writer sealed, for at most slotWait. It reports
// whether a file is free for reuse now. Without it, each rotation on such
// a volume failed the group that came first, commits among them.
func (w *writer) awaitSlot() bool {
	s := w.s
	deadline := time.NewTimer(slotWait)
	defer deadline.Stop()
	for {
		s.sealedMu.Lock()
		free, coming := len(s.freeSlots) > 0, s.retiring > 0
		s.sealedMu.Unlock()
		if free || !coming {
			return free
		}
		select {
		case <-s.drained:
		case <-deadline.C:
			return false
		case <-s.closing:
			return false
		}
	}
}

// retire ends the current segment, if any, like seal, but returns it
// (nil if there is none or no write into it was attempted) for the caller
// to send to the syncer, counted as retiring until a checkpoint takes it
// in.
func (w *writer) retire() *segment {
	seg := w.detach()
	if seg != nil && !seg.tried {
		w.s.unused(seg)
		return nil
	}
	if seg != nil {
		w.s.sealedMu.Lock()
		w.s.retiring++
		w.s.sealedMu.Unlock()
	}
	return seg
}

// unused hands back seg, which was never written to (opened ahead of its
// first entry): its file, zero-filled or checkpointed, is ready for reuse
// as it is.
func (s *Store) unused(seg *segment) {
	if err := seg.f.Close(); err != nil {
		s.log.Warn("journal close failed", zap.String("segment", seg.path), zap.Error(err))
	}
	s.sealedMu.Lock()
	kept := s.keepSlot(seg.slot)
	s.sealedMu.Unlock()
	if !kept {
		s.removeSegment(seg.path)
	}
}

// removeSegment removes a journal file beyond those kept for reuse; what it
// holds is at or below the checkpoint, or was never written.
func (s *Store) removeSegment(path string) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("journal segment not removed", zap.String("segment", path), zap.Error(err))
	}
}

// detach ends the current segment and returns it (nil if there is none),
// for the caller to send to the syncer.
func (w *writer) detach() *segment {
	seg := w.seg
	w.seg = nil
	w.timer.Stop()
	return seg
}

// minFlushGap is the least time between the starts of two journal
// flushes; a flush due after a quiet spell starts at once. Back to back, a
// busy two-core machine ran about 2,800 a second at ~15 µs of CPU each
// (some 70 µs each under the load benchmark). Paced at 1 ms, the flushes
// still took 7 % of the gateway's CPU in that benchmark; at 5 ms it did 7 %
// more unique deliveries a second, with a lower p99 (go run ./bench
// -dedupgw-alt). It is also the most a power loss can forget beyond the
// flush in progress.
const minFlushGap = 5 * time.Millisecond

// syncWork is what the writer hands the syncer after a group: the segment
// it wrote to, to fdatasync; a segment to seal once flushed; and requests
// to answer after both.
type syncWork struct {
	sync    *segment
	upTo    int64  // sync's size after the group
	lastSeq uint64 // the group's last sequence number
	seal    *segment
	waiters []*writeReq
}

// syncLoop is the syncer: it takes every piece of work the writer queued
// and fdatasyncs each segment they wrote to once (a flush covers every
// write before it), then seals what is to be sealed and answers the
// waiters, in order. It stops once the writer closed s.syncs and it has
// done everything queued.
func (s *Store) syncLoop() {
	defer s.wg.Done()
	work := make([]syncWork, 0, maxWriteBatch)
	var last time.Time // when the last flush began
	for item := range s.syncs {
		if wait := minFlushGap - time.Since(last); wait > 0 {
			// Pace the flushes under load: nothing waits for them but
			// durable requests, and each costs CPU.
			time.Sleep(wait)
		}
		last = time.Now()
		work = append(work[:0], item)
		more := true
	drain:
		for len(work) < cap(work) {
			select {
			case item, ok := <-s.syncs:
				if !ok {
					more = false
					break drain
				}
				work = append(work, item)
			default:
				break drain
			}
		}
		s.syncWork(work)
		clear(work)
		if !more {
			return
		}
	}
}

// journalFailure is a failed journal write or fdatasync: the error, and the
// last sequence number handed out when it happened.
type journalFailure struct {
	err error
	seq uint64
}

// noteJournalFailure records a failed journal write or fdatasync when it is
// the latest (writer and syncer race here: the failure numbered highest
// stays).
func (s *Store) noteJournalFailure(err error, seq uint64) {
	f := &journalFailure{err: err, seq: seq}
	for {
		cur := s.journalErr.Load()
		if cur != nil && cur.seq > seq || s.journalErr.CompareAndSwap(cur, f) {
			return
		}
	}
}

// pingKey is the key of the delete Ping journals to find out whether the
// journal records again. No record has it: a recordKey holds a ':' (the
// namespace has none) or is 33 bytes (a hash).
var pingKey = []byte("\x00dedupgw-ping")

// syncWork does work, in order (see syncLoop).
func (s *Store) syncWork(work []syncWork) {
	var flushed *segment // the segment flushed in this call
	// flush fdatasyncs seg, which holds upTo bytes, once per call: the
	// writer queued every piece of work before this call took it, so the
	// first flush covers them all. A failed flush is seg.syncErr from then
	// on.
	flush := func(seg *segment, upTo int64, lastSeq uint64) error {
		seg.flushedTo = max(seg.flushedTo, upTo)
		if seg.syncErr != nil {
			return seg.syncErr
		}
		if seg == flushed {
			return nil
		}
		flushed = seg
		if err := s.syncFile(seg.f); err != nil {
			// The answered entries stay visible and reach bbolt with the
			// next checkpoint, which copies from memory, not from the file;
			// a crash before that would forget them.
			s.log.Error("journal fdatasync failed", zap.String("segment", seg.path), zap.Error(err))
			seg.syncErr = fmt.Errorf("journal: %w", err)
			s.syncFailed.Store(seg)
			s.noteJournalFailure(seg.syncErr, lastSeq)
		} else if f := s.journalErr.Load(); f != nil && f.seq < lastSeq {
			s.journalErr.CompareAndSwap(f, nil) // a write after the failure is durable
		}
		return seg.syncErr
	}
	for _, item := range work {
		var err error
		if item.sync != nil {
			err = flush(item.sync, item.upTo, item.lastSeq)
		}
		if seg := item.seal; seg != nil {
			if seg.flushedTo < seg.size { // the writer is done with it
				_ = flush(seg, seg.size, 0)
			}
			s.handOver(seg)
		}
		for _, req := range item.waiters {
			if req.seal {
				req.done <- nil
			} else {
				req.done <- err
			}
		}
	}
}

// handOver closes a sealed, flushed segment and hands it to the
// checkpointer.
func (s *Store) handOver(seg *segment) {
	if err := seg.f.Close(); err != nil {
		s.log.Warn("journal close failed", zap.String("segment", seg.path), zap.Error(err))
	}
	seg.f = nil
	s.sealedMu.Lock()
	s.sealed = append(s.sealed, seg)
	s.backlog += seg.size
	s.sealedMu.Unlock()
	select {
	case s.sealedCh <- struct{}{}:
	default:
	}
}
