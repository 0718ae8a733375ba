// Package boltstore is the embedded dedup.Store on one bbolt file, the
// gateway's default backend.
//
// One process owns the file (bbolt holds an exclusive flock), so in-flight
// leases live in memory under one mutex and are checked against the persisted
// record; only processed and failed records touch the disk.
//
// A Commit or Release returns once it is written to a write-ahead journal
// beside the file (<file>.journal.<n>, see journal.go), so a processed key
// survives kill -9; a syncer goroutine fdatasyncs it right behind the
// writer, at most once every 5 ms (minFlushGap), and a power loss can
// forget only what no finished fdatasync covered yet: the flush in
// progress and the writes queued behind it (writeLoop says why that is the
// right trade). A Forget returns after its fdatasync.
// Concurrent writes are group-committed: one writer goroutine appends every
// write that queued meanwhile in one append, and one fdatasync covers every
// group written while the previous one ran; no write waits for a timer. Journaled writes are served from memory until a checkpointer
// copies them into bbolt, about once a second, in one large key-sorted
// transaction, which costs far less per record than a bbolt transaction per
// group of commits (random keys dirty about one page each). Open replays a
// journal a crash left behind; Close checkpoints it, so a closed file holds
// everything.
//
// A duplicate (a processed key inside its window) is answered from memory or
// a read-only transaction without taking the lease lock. Expired records read
// as absent at once; a sweeper deletes them later in bounded batches using an
// expiry index (8-byte big-endian unix milliseconds ‖ record key). No
// request waits for bbolt's write lock: only the checkpointer and the sweeper
// take it.
//
// A crash loses the in-memory leases, so after a restart an in-flight key is
// claimable at once instead of after its lease: bbolt has one owner, and the
// owner that held the lease is gone.
package boltstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"

	"github.com/dedupgw/dedupgw/dedup"
)

// Buckets of the file.
var (
	// bucketRecords maps a record key to its encoded dedup.Record.
	bucketRecords = []byte("records")
	// bucketExpiry holds one empty-valued entry per record: 8-byte big-endian
	// ExpiresAt in unix milliseconds ‖ record key.
	bucketExpiry = []byte("expiry")
	// bucketMeta holds the schema version under metaVersionKey, the file's
	// journal identity under metaJournalKey and the checkpoint (see
	// checkpoint.go).
	bucketMeta     = []byte("meta")
	metaVersionKey = []byte("version")
	// metaJournalKey holds 8 random bytes (big-endian, not zero) created with
	// the file: its journal segments carry them (see journal.go), so a
	// segment left beside another file (the file deleted to start afresh, or
	// replaced by a copy) is never replayed into this one.
	metaJournalKey = []byte("journal-id")
	// metaRunningKey is present while a Store has the file open: Open
	// finding it means the last owner did not close it (a crash, kill -9,
	// power loss or a failed final checkpoint).
	metaRunningKey = []byte("running")
)

const schemaVersion = 1

// Defaults for zero Options.
const (
	DefaultOpenTimeout   = time.Second
	DefaultSweepInterval = time.Minute
	DefaultSweepBatch    = 250
)

// maxRawKey is the longest namespace:id stored as is; longer keys are stored
// as "\x00" ‖ SHA-256(namespace:id).
const maxRawKey = 200

// maxWriteBatch bounds how many writes one group commit applies.
const maxWriteBatch = 1000

// Journal tuning.
const (
	// DefaultCheckpointInterval is how long a journal segment takes writes
	// before it is sealed and checkpointed into bbolt.
	DefaultCheckpointInterval = time.Second
	// maxSegmentEntries seals a segment early under load (as segmentBytes
	// does), bounding one checkpoint transaction.
	maxSegmentEntries = 50_000
	// maxFreeSlots is how many checkpointed segment files are kept for
	// reuse; more (after a backlog) are removed.
	maxFreeSlots = 2
	// maxBacklogBytes bounds the sealed segments waiting for a checkpoint
	// (and so the memory their index holds): past it, writes wait for the
	// checkpointer.
	maxBacklogBytes = 64 << 20
	// checkpointRetry is the pause after a failed checkpoint.
	checkpointRetry = time.Second
	// forgetWriteTimeout bounds a Forget's journal write, which holds the
	// lease lock (claims of new keys wait behind it) when the journal is
	// held up by the checkpoint backlog.
	forgetWriteTimeout = 5 * time.Second
)

// Options configure a Store. The zero value is ready to use.
type Options struct {
	// Now is the clock for every lease, window and retention. Nil means time.Now.
	Now dedup.Clock
	// Logger receives sweeper reports and errors, used as given (the caller
	// names it). Nil means zap.NewNop().
	Logger *zap.Logger
	// OpenTimeout bounds the wait for the file lock held by another process.
	// Zero means DefaultOpenTimeout (1s).
	OpenTimeout time.Duration
	// SweepInterval is how often expired records are deleted. Zero means
	// DefaultSweepInterval (1m); negative disables the sweeper (call Sweep).
	SweepInterval time.Duration
	// SweepBatch is how many expired records one sweep transaction deletes.
	// Zero means DefaultSweepBatch (250): a sweep of random keys dirties about
	// one page per record, and smaller transactions stall commits less.
	SweepBatch int
	// CheckpointInterval is how long journaled writes wait, at most, before
	// they are copied into the bbolt file (sooner under load). Zero means
	// DefaultCheckpointInterval (1s); negative checkpoints only when a
	// segment fills, on Sweep and on Close.
	CheckpointInterval time.Duration

	// preallocate, when set (by tests), replaces the zero-filling of a new
	// journal segment, which Open does first.
	preallocate func(*os.File) error
}

// lease is an in-flight claim, held in memory only.
type lease struct {
	token          string
	until          time.Time
	firstSeen      time.Time
	attempts       int
	lastStatus     int
	lastError      string
	maybeProcessed bool // the record's MaybeProcessed, carried over
	bodySHA256     string
	fingerprint    string
	// finishing is non-nil while the owner's Commit or Release is being
	// written, and closed when that write ends. A finishing lease cannot be
	// taken over even if it runs out meanwhile.
	finishing chan struct{}
}

func (l *lease) record() dedup.Record {
	return dedup.Record{
		State:          dedup.StateProcessing,
		FirstSeen:      l.firstSeen,
		LeaseUntil:     l.until,
		ExpiresAt:      l.until,
		Attempts:       l.attempts,
		LastStatus:     l.lastStatus,
		LastError:      l.lastError,
		MaybeProcessed: l.maybeProcessed,
		BodySHA256:     l.bodySHA256,
		Fingerprint:    l.fingerprint,
	}
}

// Store is the bbolt dedup.Store. It is safe for concurrent use. Close stops
// its goroutines and closes the file.
type Store struct {
	db              *bolt.DB
	path            string       // the file's real path: journal segments are named after it
	journal         journalOwner // whose journal segments this file takes in
	now             dedup.Clock
	log             *zap.Logger
	sweepBatch      int
	checkpointEvery time.Duration

	// closeMu is read-held by every operation; Close write-locks it to wait
	// them out before stopping the writer.
	closeMu sync.RWMutex
	closed  bool

	mu     sync.Mutex
	leases map[string]*lease

	// recent indexes journaled writes by record key until a checkpoint has
	// copied them into bbolt: lookups consult it first.
	recentMu sync.RWMutex
	recent   map[string]recentEntry
	// checkpoints counts checkpoints that moved entries out of recent.
	checkpoints atomic.Uint64
	// checkpointFailures counts checkpoints that failed (see Stats).
	checkpointFailures atomic.Uint64
	// swept counts the records sweeps deleted (see Stats).
	swept atomic.Uint64

	// sealed are journal segments waiting for a checkpoint, oldest first.
	sealedMu     sync.Mutex
	sealed       []*segment
	backlog      int64         // bytes of the sealed segments
	retiring     int           // segments the writer sealed and no checkpoint has taken in yet
	maxBacklog   int64         // maxBacklogBytes; tests lower it
	freeSlots    []int         // checkpointed segment files, ready for reuse
	nextSlot     int           // the slot number a new segment file gets
	sealedCh     chan struct{} // signals the checkpointer; capacity 1
	drained      chan struct{} // signals the writer after a checkpoint; capacity 1
	checkpointMu sync.Mutex    // one checkpoint at a time

	writes chan *writeReq
	// syncs carries the writer's work to the syncer (see syncLoop); the
	// writer closes it when it stops.
	syncs chan syncWork
	// syncFailed is the segment whose last fdatasync failed, for the writer
	// to seal (nil when none).
	syncFailed atomic.Pointer[segment]
	// journalErr is the last failed journal write or fdatasync, nil once a
	// later write was fdatasynced: Ping reports it, so readiness shows a
	// store that cannot record (a full or failing disk).
	journalErr atomic.Pointer[journalFailure]
	// journalTight is set while timed rotations are put off (no room for
	// another journal file: see rotatable) and the current file is over
	// half full: claims that would be granted are refused, and Ping fails,
	// so the room left takes the commits and releases of the claims
	// already granted. The writer clears it when a rotation goes ahead.
	journalTight atomic.Bool
	// lastProbe is when a Claim last journalled a probe (unix ns on the
	// store's clock) to find out whether the journal records again; see
	// recording.
	lastProbe atomic.Int64
	// closing closes when Close begins, before it waits for operations:
	// waits on the writer end with ErrClosed then, so Close cannot hang
	// behind a writer held by the backlog. stop closes once they are gone.
	closing     chan struct{}
	closingOnce sync.Once
	stop        chan struct{}
	wg          sync.WaitGroup

	// syncFile flushes a journal segment after each group is written:
	// fdatasync; tests replace it before the first write.
	syncFile func(*os.File) error
	// writeAt writes a group into a journal segment: (*os.File).WriteAt,
	// but tests replace it (before the first write) to fail.
	writeAt func(f *os.File, b []byte, off int64) (int, error)
	// preallocate zero-fills a new journal segment (see Options).
	preallocate func(*os.File) error

	// listBudget is how many bbolt records one List page examines at most:
	// listScanBudget, but tests lower it.
	listBudget int
	// listRead, when set (by tests), runs after a List page copied the
	// leases and the journal's index, before it reads bbolt.
	listRead func()

	// probed, when set (by tests), runs after a Claim's probe found that
	// the journal records, before the claim is decided again.
	probed func()

	// onSweepTx, when set (by measurements), receives how long each sweep
	// transaction's deletes took, before its commit and fsync.
	onSweepTx func(time.Duration)
	// onCheckpoint, when set (by measurements), receives each checkpoint's
	// record count and transaction time, commit included.
	onCheckpoint func(records int, took time.Duration)
}

var _ dedup.Store = (*Store)(nil)

// Open opens (creating if needed) the bbolt file at path, replays the journal
// a crash may have left beside it, starts the writer, the checkpointer and
// the sweeper, and reserves the first journal segment (reusing a file of an
// earlier run, or creating one zero-filled to 4 MiB and synced). If another
// process holds the file, Open fails after opts.OpenTimeout with an error
// naming the path. If the segment cannot be reserved (a full or failing
// disk), Open logs it and succeeds with a store that cannot record yet:
// claims of new keys fail and Ping reports it until a probe succeeds.
func Open(path string, opts Options) (*Store, error) {
	timeout := opts.OpenTimeout
	if timeout <= 0 {
		timeout = DefaultOpenTimeout
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout:        timeout,
		FreelistType:   bolt.FreelistMapType, // fast with the many free pages sweeping leaves
		NoFreelistSync: true,                 // commits skip writing the freelist; Open rebuilds it
	})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("boltstore: open %s: file is locked by another process (waited %s); a bbolt file has one owner: stop the other dedupgw or use another store.bolt.path: %w", path, timeout, err)
	}
	if err != nil {
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	var (
		owner   journalOwner
		unclean bool
	)
	if err := db.Update(func(tx *bolt.Tx) (err error) {
		if owner, err = initSchema(tx); err != nil {
			return err
		}
		unclean = tx.Bucket(bucketMeta).Get(metaRunningKey) != nil
		return nil
	}); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	// The journal is named after the file, not after the path it was opened
	// by: a crash's journal is found whichever symlink leads to the file.
	journalPath := path
	if real, err := filepath.EvalSymlinks(path); err == nil {
		journalPath = real
	}
	s := &Store{
		db:              db,
		path:            journalPath,
		journal:         owner,
		now:             opts.Now,
		log:             opts.Logger,
		sweepBatch:      opts.SweepBatch,
		checkpointEvery: opts.CheckpointInterval,
		leases:          make(map[string]*lease),
		recent:          make(map[string]recentEntry),
		sealedCh:        make(chan struct{}, 1),
		drained:         make(chan struct{}, 1),
		maxBacklog:      maxBacklogBytes,
		listBudget:      listScanBudget,
		syncFile:        fdatasync,
		writeAt:         (*os.File).WriteAt,
		preallocate:     opts.preallocate,
		writes:          make(chan *writeReq, maxWriteBatch),
		syncs:           make(chan syncWork, maxWriteBatch),
		closing:         make(chan struct{}),
		stop:            make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	// Every time the store records has the same millisecond precision in
	// UTC as on disk and on Redis (see dedup.Clock.Millis).
	s.now = s.now.Millis
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.preallocate == nil {
		s.preallocate = preallocate
	}
	if unclean {
		// The leases of the deliveries then in flight were in memory only.
		s.log.Warn("the last run did not close the file (a crash, kill -9, power loss or a failed final checkpoint): deliveries in flight at that moment, if any, are claimable at once, so their next copies are forwarded")
	}
	if s.sweepBatch <= 0 {
		s.sweepBatch = DefaultSweepBatch
	}
	if s.checkpointEvery == 0 {
		s.checkpointEvery = DefaultCheckpointInterval
	}
	nextSeq, err := s.replay()
	if err == nil {
		// Marked only now: an Open that fails leaves the file as it was.
		err = db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(metaRunningKey, []byte{1}) })
	}
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	s.wg.Add(3)
	opened := make(chan error, 1)
	go s.writeLoop(nextSeq, opened)
	go s.syncLoop()
	go s.checkpointLoop()
	if err := <-opened; err != nil {
		hint := fmt.Sprintf("each journal file needs %d MiB free beside the database", segmentBytes>>20)
		if errors.Is(err, fs.ErrPermission) {
			hint = "the gateway's user cannot create files in the database's directory"
		}
		s.log.Error("the journal cannot record: new keys are not claimed (each route's on_store_error decides) and readiness fails until it can",
			zap.String("path", journalPath), zap.String("hint", hint), zap.Error(err))
	}
	interval := opts.SweepInterval
	if interval == 0 {
		interval = DefaultSweepInterval
	}
	if interval > 0 {
		s.wg.Add(1)
		go s.sweepLoop(interval)
	}
	return s, nil
}

// initSchema creates the buckets and the file's journal identity when they
// are missing, checks the schema version, and returns whose journal segments
// the file takes in.
func initSchema(tx *bolt.Tx) (journalOwner, error) {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return journalOwner{}, err
	}
	existed := false
	if v := meta.Get(metaVersionKey); v != nil {
		if len(v) != 8 || binary.BigEndian.Uint64(v) != schemaVersion {
			return journalOwner{}, fmt.Errorf("unsupported schema version %x (this build reads %d)", v, schemaVersion)
		}
		existed = true
	} else if err := meta.Put(metaVersionKey, binary.BigEndian.AppendUint64(nil, schemaVersion)); err != nil {
		return journalOwner{}, err
	}
	for _, name := range [][]byte{bucketRecords, bucketExpiry} {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return journalOwner{}, err
		}
	}
	if v := meta.Get(metaJournalKey); len(v) == 8 && binary.BigEndian.Uint64(v) != 0 {
		return journalOwner{id: binary.BigEndian.Uint64(v)}, nil
	}
	owner := journalOwner{id: randomNonce()}
	if existed {
		// A file written before journal identities existed takes in the
		// segments of that format (its own, as far as anyone can tell).
		// replay saves the identity in the transaction that applies them,
		// so an Open that fails before leaves the file legacy still.
		owner.legacy = true
		return owner, nil
	}
	return owner, meta.Put(metaJournalKey, binary.BigEndian.AppendUint64(nil, owner.id))
}

// Close waits for running operations, stops the writer, the checkpointer and
// the sweeper, checkpoints the journal into the file and closes it. Later
// operations return ErrClosed; Close is idempotent. If the last checkpoint
// fails, the journal stays and the next Open replays it.
func (s *Store) Close() error {
	s.closingOnce.Do(func() { close(s.closing) })
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	s.closeMu.Unlock()
	close(s.stop)
	s.wg.Wait()
	cerr := s.checkpoint()
	if cerr == nil {
		cerr = s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(metaRunningKey) })
		if cerr != nil {
			cerr = fmt.Errorf("boltstore: close: %w", cerr)
		}
	}
	if err := s.db.Close(); err != nil {
		return errors.Join(cerr, fmt.Errorf("boltstore: close: %w", err))
	}
	return cerr
}

// enter starts an operation; on success the caller must call s.leave.
func (s *Store) enter(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("boltstore: %s: %w", op, err)
	}
	s.closeMu.RLock()
	if s.closed {
		s.closeMu.RUnlock()
		return fmt.Errorf("boltstore: %s: %w", op, dedup.ErrClosed)
	}
	return nil
}

func (s *Store) leave() { s.closeMu.RUnlock() }

// recordKey is the bucket key of k: namespace:id, or "\x00" ‖ SHA-256 of it
// when longer than maxRawKey bytes.
func recordKey(k dedup.Key) []byte {
	n := len(k.Namespace) + 1 + len(k.ID)
	if n <= maxRawKey {
		b := make([]byte, 0, n)
		b = append(b, k.Namespace...)
		b = append(b, ':')
		return append(b, k.ID...)
	}
	h := sha256.New()
	h.Write([]byte(k.Namespace))
	h.Write([]byte{':'})
	h.Write([]byte(k.ID))
	return h.Sum([]byte{0})
}

func indexKey(expiresMs int64, key []byte) []byte {
	b := make([]byte, 8, 8+len(key))
	binary.BigEndian.PutUint64(b, uint64(max(expiresMs, 0)))
	return append(b, key...)
}

// expired reports whether a persisted expiry (unix ms) has passed at now.
func expired(now time.Time, expiresMs int64) bool {
	return now.UnixMilli() > expiresMs
}

// load reads the persisted record of key: its journaled write not yet
// checkpointed, else what bbolt holds, read in a read-only transaction; nil
// when there is none. The record shares no memory with the file.
func (s *Store) load(key []byte) (*dedup.Record, error) {
	var (
		rec *dedup.Record
		err error
	)
	// A checkpoint drops an entry only after bbolt committed it, so a miss
	// here finds the record in the transaction below.
	s.recentMu.RLock()
	e, ok := s.recent[string(key)]
	s.recentMu.RUnlock()
	if ok {
		return decodeRecent(key, e)
	}
	verr := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketRecords).Get(key)
		if v == nil {
			return nil
		}
		r, derr := decodeRecord(v)
		if derr != nil {
			err = fmt.Errorf("record %q: %w", key, derr)
			return nil
		}
		rec = &r
		return nil
	})
	if verr != nil {
		return nil, verr
	}
	return rec, err
}

// decodeRecent decodes key's journaled write e: nil for a delete.
func decodeRecent(key []byte, e recentEntry) (*dedup.Record, error) {
	if e.val == nil {
		return nil, nil
	}
	r, err := decodeRecord(e.val)
	if err != nil {
		return nil, fmt.Errorf("record %q: %w", key, err)
	}
	return &r, nil
}

// loadRecentSince reads key's journaled write not yet checkpointed (ok
// false when there is none) if no checkpoint ran since gen; stale reports
// that one did (read bbolt too). The check and the read are one critical
// section: a checkpoint counts and drops its entries in one.
func (s *Store) loadRecentSince(key []byte, gen uint64) (rec *dedup.Record, ok, stale bool, err error) {
	s.recentMu.RLock()
	if s.checkpoints.Load() != gen {
		s.recentMu.RUnlock()
		return nil, false, true, nil
	}
	e, ok := s.recent[string(key)]
	s.recentMu.RUnlock()
	if !ok {
		return nil, false, false, nil
	}
	rec, err = decodeRecent(key, e)
	return rec, true, false, err
}

// live reports whether a persisted record is processed or failed and inside
// its window or retention.
func live(r *dedup.Record, now time.Time) bool {
	return r != nil && r.State != dedup.StateProcessing && !now.After(r.ExpiresAt)
}

// Claim implements dedup.Store. A processing key whose lease ran out is taken
// over keeping its FirstSeen and Attempts, as a failed one is.
func (s *Store) Claim(ctx context.Context, key dedup.Key, opts dedup.ClaimOptions) (dedup.ClaimResult, error) {
	if err := s.enter(ctx, "claim"); err != nil {
		return dedup.ClaimResult{}, err
	}
	defer s.leave()
	rk := recordKey(key)
	now := s.now()

	// Fast path: a processed key inside its window is a duplicate whatever the
	// in-memory state (a lease only exists while the disk shows no live
	// processed record). A read-only transaction: no lock, no fsync.
	gen := s.checkpoints.Load()
	disk, err := s.load(rk)
	if err != nil {
		return dedup.ClaimResult{}, fmt.Errorf("boltstore: claim: %w", err)
	}
	if live(disk, now) && disk.State == dedup.StateProcessed {
		if opts.Conflicts(disk.Fingerprint) {
			return dedup.ClaimResult{Outcome: dedup.Conflict, Record: *disk}, nil
		}
		return dedup.ClaimResult{Outcome: dedup.Duplicate, Record: *disk}, nil
	}

	s.mu.Lock()
	res, next, err := s.decideClaim(rk, now, opts, gen, disk)
	if next != nil && s.journalTight.Load() {
		// Granted, this claim's commit might find the journal full: the
		// route's on_store_error decides instead, as for a failed journal.
		s.mu.Unlock()
		return dedup.ClaimResult{}, fmt.Errorf("boltstore: claim: %w", errJournalTight)
	}
	if next != nil && s.journalErr.Load() != nil {
		// A key claimed now would be forwarded, and its commit could not
		// be recorded: a copy would be forwarded again once the lease ran
		// out, or at once after a restart. The claim fails instead, so the
		// route's on_store_error decides (reject answers 503 and the
		// provider retries). Only a claim that would be granted waits for
		// the probe; the lock is let go meanwhile, so decide again.
		s.mu.Unlock()
		if err := s.recording(ctx); err != nil {
			return dedup.ClaimResult{}, fmt.Errorf("boltstore: claim: %w", err)
		}
		if s.probed != nil {
			s.probed()
		}
		s.mu.Lock()
		res, next, err = s.decideClaim(rk, now, opts, gen, disk)
		// The journal may have failed again since the probe; a grant now
		// would be just as unrecordable.
		if f := s.journalErr.Load(); next != nil && f != nil {
			s.mu.Unlock()
			return dedup.ClaimResult{}, fmt.Errorf("boltstore: claim: %w", unrecordable(f.err))
		}
	}
	defer s.mu.Unlock()
	if err != nil || next == nil {
		return res, err
	}
	s.leases[string(rk)] = next
	return dedup.ClaimResult{Outcome: dedup.Claimed, Token: next.token, Record: next.record(), TookOver: res.TookOver}, nil
}

// errJournalTight is the error of claims and pings while journalTight is
// set.
var errJournalTight = errors.New("the disk has no room for another journal file and the current one is over half full: new claims wait until the checkpoints can write the database again")

// decideClaim answers a claim of rk under s.mu: the result when it is not
// granted, or the lease to grant (not yet stored) with a result that says
// only whether it takes over a lapsed lease (TookOver). disk is the record the
// fast path read at checkpoint generation gen.
func (s *Store) decideClaim(rk []byte, now time.Time, opts dedup.ClaimOptions, gen uint64, disk *dedup.Record) (dedup.ClaimResult, *lease, error) {
	next := &lease{
		token:       dedup.NewToken(),
		until:       now.Add(opts.Lease),
		firstSeen:   now,
		attempts:    1,
		bodySHA256:  opts.BodySHA256,
		fingerprint: opts.Fingerprint,
	}
	if l := s.leases[string(rk)]; l != nil {
		if opts.Conflicts(l.fingerprint) {
			return dedup.ClaimResult{Outcome: dedup.Conflict, Record: l.record()}, nil, nil
		}
		if l.finishing != nil || !now.After(l.until) {
			return dedup.ClaimResult{Outcome: dedup.InFlight, Record: l.record()}, nil, nil
		}
		next.firstSeen, next.attempts = l.firstSeen, l.attempts+1
		// The lapsed attempt ended unseen (its owner hung, or could not
		// settle it): the application may have processed it.
		next.lastStatus, next.lastError, next.maybeProcessed = l.lastStatus, l.lastError, true
		return dedup.ClaimResult{TookOver: true}, next, nil
	}
	// Read again under the lock: a commit may have landed since the fast
	// path (a commit drops its lease only once its write is in the
	// journal's index). It would be in that index: bbolt itself changes
	// only by checkpoints (counted) and sweeps (which delete only what
	// already read as expired), so without a checkpoint since, the index is
	// all there is to read again.
	var err error
	if rec, ok, stale, rerr := s.loadRecentSince(rk, gen); stale {
		disk, err = s.load(rk)
	} else if ok {
		disk, err = rec, rerr
	}
	if err != nil {
		return dedup.ClaimResult{}, nil, fmt.Errorf("boltstore: claim: %w", err)
	}
	if live(disk, now) {
		if opts.Conflicts(disk.Fingerprint) {
			return dedup.ClaimResult{Outcome: dedup.Conflict, Record: *disk}, nil, nil
		}
		if disk.State == dedup.StateProcessed {
			return dedup.ClaimResult{Outcome: dedup.Duplicate, Record: *disk}, nil, nil
		}
		next.firstSeen, next.attempts = disk.FirstSeen, disk.Attempts+1
		next.lastStatus, next.lastError, next.maybeProcessed = disk.LastStatus, disk.LastError, disk.MaybeProcessed
	}
	return dedup.ClaimResult{}, next, nil
}

// probeEvery is how often claims journal a probe while the journal cannot
// record (see recording): each failed probe costs a journal write, and the
// writer logs it.
const probeEvery = 250 * time.Millisecond

// recording returns nil when the journal records: no journal write or
// fdatasync failed since the last one that succeeded. Otherwise one caller
// per probeEvery (on the store's clock) journals a probe, a harmless delete,
// durably, and gets nil once it is synced; the others get the failure at
// once. Commits clear the failure too, but while claims fail none come, and
// nothing else would find out that the disk records again.
func (s *Store) recording(ctx context.Context) error {
	f := s.journalErr.Load()
	if f == nil {
		return nil
	}
	now := s.now().UnixNano()
	last := s.lastProbe.Load()
	if since := now - last; since >= 0 && since < int64(probeEvery) || !s.lastProbe.CompareAndSwap(last, now) {
		return unrecordable(f.err)
	}
	return s.probe(ctx)
}

// unrecordable is the error of an operation refused, or a probe failed,
// because the journal cannot record: err is the journal's failure.
func unrecordable(err error) error {
	return fmt.Errorf("commits cannot be recorded: %w", err)
}

// probe journals a harmless delete, durably: its fdatasync clears a journal
// failure. It returns nil when the journal records.
func (s *Store) probe(ctx context.Context) error {
	if err := s.writeDurable(ctx, pingKey, nil); err != nil {
		return unrecordable(err)
	}
	if f := s.journalErr.Load(); f != nil {
		return unrecordable(f.err)
	}
	return nil
}

// beginFinish marks token's lease on rk as finishing, or returns ErrNotOwner.
// A lease that ran out but was not taken over still belongs to its owner:
// the upstream did answer.
func (s *Store) beginFinish(rk []byte, token string) (*lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[string(rk)]
	if l == nil || token == "" || l.token != token || l.finishing != nil {
		return nil, dedup.ErrNotOwner
	}
	l.finishing = make(chan struct{})
	return l, nil
}

// endFinish ends a finishing lease: dropped once its outcome is durable,
// kept (and claimable again) when the write failed.
func (s *Store) endFinish(rk []byte, l *lease, written bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(l.finishing)
	l.finishing = nil
	if written && s.leases[string(rk)] == l {
		delete(s.leases, string(rk))
	}
}

// Commit implements dedup.Store. It returns once the processed record is
// written to the journal (it survives a crash of the process) and visible;
// its fdatasync follows without waiting for it, within a few milliseconds
// (the syncer's pacing, minFlushGap; see writeLoop).
func (s *Store) Commit(ctx context.Context, key dedup.Key, token string, opts dedup.CommitOptions) error {
	if err := s.enter(ctx, "commit"); err != nil {
		return err
	}
	defer s.leave()
	rk := recordKey(key)
	l, err := s.beginFinish(rk, token)
	if err != nil {
		return err
	}
	now := s.now()
	rec := dedup.Record{
		State:       dedup.StateProcessed,
		FirstSeen:   l.firstSeen,
		CompletedAt: now,
		ExpiresAt:   now.Add(opts.Window),
		Attempts:    l.attempts,
		LastStatus:  opts.Status,
		BodySHA256:  l.bodySHA256,
		Fingerprint: l.fingerprint,
		Response:    opts.Response,
	}
	if err := s.finishWrite(ctx, rk, l, encodeRecord(nil, &rec)); err != nil {
		return fmt.Errorf("boltstore: commit: %w", err)
	}
	return nil
}

// Release implements dedup.Store. It returns once the failed record (or
// the deletion, when opts.Retain is zero) is written to the journal, like
// Commit.
func (s *Store) Release(ctx context.Context, key dedup.Key, token string, opts dedup.ReleaseOptions) error {
	if err := s.enter(ctx, "release"); err != nil {
		return err
	}
	defer s.leave()
	rk := recordKey(key)
	l, err := s.beginFinish(rk, token)
	if err != nil {
		return err
	}
	var val []byte // nil: delete
	if opts.Retain > 0 {
		now := s.now()
		val = encodeRecord(nil, &dedup.Record{
			State:          dedup.StateFailed,
			FirstSeen:      l.firstSeen,
			CompletedAt:    now,
			ExpiresAt:      now.Add(opts.Retain),
			Attempts:       l.attempts,
			LastStatus:     opts.Status,
			LastError:      opts.Error,
			MaybeProcessed: opts.MaybeProcessed,
			BodySHA256:     l.bodySHA256,
			Fingerprint:    l.fingerprint,
		})
	}
	if err := s.finishWrite(ctx, rk, l, val); err != nil {
		return fmt.Errorf("boltstore: release: %w", err)
	}
	return nil
}

// deleteRecord deletes rk's record and index entry and returns the expiry
// (unix ms) of what it deleted, -1 if there was nothing.
func deleteRecord(tx *bolt.Tx, rk []byte) (int64, error) {
	recs := tx.Bucket(bucketRecords)
	old := recs.Get(rk)
	if old == nil {
		return -1, nil
	}
	exp, ok := recordExpiry(old)
	if ok {
		if err := tx.Bucket(bucketExpiry).Delete(indexKey(exp, rk)); err != nil {
			return -1, err
		}
	} else {
		exp = 0 // corrupt: its index entry, if any, is dropped by the sweeper
	}
	return exp, recs.Delete(rk)
}

// Get implements dedup.Store.
func (s *Store) Get(ctx context.Context, key dedup.Key) (dedup.Record, error) {
	if err := s.enter(ctx, "get"); err != nil {
		return dedup.Record{}, err
	}
	defer s.leave()
	rk := recordKey(key)
	now := s.now()
	s.mu.Lock()
	l := s.leases[string(rk)]
	var rec dedup.Record
	if l != nil {
		rec = l.record()
	}
	s.mu.Unlock()
	if l != nil {
		if now.After(rec.LeaseUntil) {
			return dedup.Record{}, dedup.ErrNotFound
		}
		return rec, nil
	}
	disk, err := s.load(rk)
	if err != nil {
		return dedup.Record{}, fmt.Errorf("boltstore: get: %w", err)
	}
	if !live(disk, now) {
		return dedup.Record{}, dedup.ErrNotFound
	}
	return *disk, nil
}

// Forget implements dedup.Store. A Forget that meets a Commit or Release
// being written waits for it, so it is ordered after it.
func (s *Store) Forget(ctx context.Context, key dedup.Key, opts dedup.ForgetOptions) (dedup.Record, error) {
	if err := s.enter(ctx, "forget"); err != nil {
		return dedup.Record{}, err
	}
	defer s.leave()
	rk := recordKey(key)
	for {
		s.mu.Lock()
		l := s.leases[string(rk)]
		if l == nil || l.finishing == nil {
			break
		}
		done := l.finishing
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return dedup.Record{}, fmt.Errorf("boltstore: forget: %w", ctx.Err())
		}
	}
	// Hold the lease lock across the check and the delete so no claim sees
	// the record in between. Forget is an admin operation; claims wait one
	// fsync, or at most forgetWriteTimeout while the journal waits for
	// checkpoints.
	defer s.mu.Unlock()
	now := s.now()
	l := s.leases[string(rk)]
	disk, err := s.load(rk)
	if err != nil && !errors.Is(err, errCorrupt) {
		return dedup.Record{}, fmt.Errorf("boltstore: forget: %w", err)
	}
	// What Get would answer: a lease hides the record on disk.
	var rec dedup.Record
	found := false
	switch {
	case l != nil:
		rec, found = l.record(), !now.After(l.until)
	case live(disk, now):
		rec, found = *disk, true
	case err != nil && opts.State != "":
		// A corrupt record has no state to check; a Forget without a State
		// repairs it. KeepInFlight does not keep it: every claim of the key
		// fails, so no delivery of it can be in flight.
		return dedup.Record{}, fmt.Errorf("boltstore: forget: %w", err)
	}
	if found && !opts.Forgets(rec) {
		return rec, dedup.ErrKept
	}
	if l != nil {
		delete(s.leases, string(rk))
	}
	if disk != nil || err != nil {
		// A corrupt record is deleted too: Forget is the way to repair a
		// key. The write holds the lease lock, so bound it: claims wait
		// behind it.
		wctx, cancel := context.WithTimeout(ctx, forgetWriteTimeout)
		defer cancel()
		if err := s.writeDurable(wctx, rk, nil); err != nil {
			return dedup.Record{}, fmt.Errorf("boltstore: forget: %w", err)
		}
	}
	switch {
	case found:
		return rec, nil
	case err != nil && l == nil:
		return dedup.Record{}, nil // a corrupt record, repaired
	default:
		return dedup.Record{}, dedup.ErrNotFound
	}
}

// Stats is a snapshot of a Store's journal, for metrics.
type Stats struct {
	// BacklogBytes is the size of the sealed journal files waiting for a
	// checkpoint. Past MaxBacklogBytes, journal writes (commits) wait for
	// the checkpointer.
	BacklogBytes, MaxBacklogBytes int64
	// CheckpointFailures counts failed checkpoints since Open (by the
	// checkpointer, which retries a second later, and by Sweep and Close);
	// the journal keeps the writes meanwhile.
	CheckpointFailures uint64
	// SweptRecords counts the expired records sweeps deleted since Open.
	SweptRecords uint64
	// FileBytes is the bbolt file's size, 0 when it cannot be read. It does
	// not shrink when records are deleted: bbolt keeps the pages for reuse.
	FileBytes int64
}

// Stats returns the journal's backlog, checkpoint failures, records swept
// and the file's size. It is cheap (one stat of the file), and answers after
// Close too.
func (s *Store) Stats() Stats {
	var size int64
	if fi, err := os.Stat(s.db.Path()); err == nil {
		size = fi.Size()
	}
	s.sealedMu.Lock()
	defer s.sealedMu.Unlock()
	return Stats{
		BacklogBytes:       s.backlog,
		MaxBacklogBytes:    s.maxBacklog,
		CheckpointFailures: s.checkpointFailures.Load(),
		SweptRecords:       s.swept.Load(),
		FileBytes:          size,
	}
}

// Ping implements dedup.Store: nil when the file can be read and the journal
// records: after a failed journal write or fdatasync, Ping journals a probe
// and is nil once that is synced.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.enter(ctx, "ping"); err != nil {
		return err
	}
	defer s.leave()
	if s.journalTight.Load() {
		return fmt.Errorf("boltstore: ping: %w", errJournalTight)
	}
	if s.journalErr.Load() != nil {
		// Deliveries may have stopped (readiness took the gateway out), so
		// nothing else may find out that the disk records again: probe,
		// whenever asked (readiness asks every few seconds).
		if err := s.probe(ctx); err != nil {
			return fmt.Errorf("boltstore: ping: %w", err)
		}
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketRecords) == nil {
			return errors.New("records bucket missing")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("boltstore: ping: %w", err)
	}
	return nil
}

// counts checkpoints the journal and returns the number of records and index
// entries in bbolt, for tests and measurements.
func (s *Store) counts() (records, index int, err error) {
	if err := s.flush(context.Background()); err != nil {
		return 0, 0, err
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		records = tx.Bucket(bucketRecords).Stats().KeyN
		index = tx.Bucket(bucketExpiry).Stats().KeyN
		return nil
	})
	return records, index, err
}
