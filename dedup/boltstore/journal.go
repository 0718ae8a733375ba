package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The journal is a write-ahead log in a few preallocated segment files
// beside the bbolt file, <file>.journal.<slot>. A Commit, Release or Forget
// is written to the current segment and fdatasynced, one write and one
// fdatasync per group of concurrent writes (a Commit or Release returns
// after the write, a Forget after the fdatasync: see writeLoop); the
// checkpointer later copies what the sealed segments hold into bbolt in one
// large, key-sorted transaction, records in bbolt's meta bucket the last
// sequence number it covered, and hands the segment's file back for reuse.
//
// Segment files are zero-filled to segmentBytes when created and then
// overwritten in place, never extended in the common case, so an fdatasync
// flushes data only: no file size or block allocation to journal in the
// filesystem, which halves its latency on ext4. A reused file still holds
// an earlier use's entries after the new ones; they fail the new use's
// checksums, and were checkpointed before the file was reused anyway.
//
// An entry is
//
//	length  uint32 (big-endian), bytes after the checksum
//	crc32c  uint32 (big-endian), of those bytes
//	seq     uint64 (big-endian)
//	keyLen  uvarint
//	key     keyLen bytes
//	value   the rest: an encoded record, or nothing for a delete
//
// after a 16-byte header naming this use of the file (see
// appendSegmentHeader): every checksum covers the use's random nonce, and
// sequence numbers follow on by one within a use, so nothing an earlier use
// left (or entry-shaped bytes inside a stored record) passes as an entry. A
// zero length is the preallocated end of the data. A torn or corrupt entry
// ends its segment: it was being written when the process died, so it was
// never acknowledged, or it is an earlier use's leftover; unless entries of
// the same use follow it, which only damage to the file leaves (see
// readWAL).

// walSuffix separates the bbolt file name from a segment file's slot number.
const walSuffix = ".journal."

// segmentBytes is the size segment files are preallocated to; a segment is
// sealed before a write would pass it (a larger single group extends it).
const segmentBytes = 4 << 20

// walHeader is the length and checksum in front of every entry.
const walHeader = 8

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// metaCheckpointKey holds, in the meta bucket, the last journal sequence
// number whose entry is in bbolt (8 bytes, big-endian).
var metaCheckpointKey = []byte("checkpoint")

// walEntry is one journaled write: val nil deletes key.
type walEntry struct {
	seq uint64
	key []byte
	val []byte
}

// A segment file starts with a header naming this use of the file and the
// bbolt file whose journal it is:
//
//	magic   "DGWJ"
//	version uint32 (big-endian), 2
//	nonce   8 random bytes, new each time the file is (re)used
//	owner   the bbolt file's journal identity (metaJournalKey)
//
// Every entry's checksum covers the nonce, so bytes an earlier use of the
// file left behind (or bytes inside a stored record that happen to look like
// an entry) never pass as an entry of this use. The owner keeps a segment
// beside a bbolt file that did not write it (the file was deleted to start
// afresh, or replaced by a copy) from being replayed into it. Version 1
// segments had no owner (16 bytes of header); only a file written before
// version 2 takes them in.
const (
	segmentMagic    = "DGWJ"
	segmentVersion  = 2
	segmentHeader   = 24
	segmentHeaderV1 = 16
)

// journalOwner names the segments a bbolt file takes in: version 2 segments
// whose owner is id, and version 1 segments when legacy (the file predates
// version 2).
type journalOwner struct {
	id     uint64
	legacy bool
}

// appendSegmentHeader appends the header of a use of a segment file, named
// by nonce, of the journal of the bbolt file whose identity is owner.
func appendSegmentHeader(dst []byte, nonce, owner uint64) []byte {
	dst = append(dst, segmentMagic...)
	dst = binary.BigEndian.AppendUint32(dst, segmentVersion)
	dst = binary.BigEndian.AppendUint64(dst, nonce)
	return binary.BigEndian.AppendUint64(dst, owner)
}

// entryChecksum is the CRC-32C of nonce ‖ body.
func entryChecksum(nonce uint64, body []byte) uint32 {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], nonce)
	return crc32.Update(crc32.Checksum(n[:], castagnoli), castagnoli, body)
}

// appendWALEntry appends the encoding of one entry of the segment use named
// by nonce to dst.
func appendWALEntry(dst []byte, nonce, seq uint64, key, val []byte) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, walHeader)...)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	dst = binary.AppendUvarint(dst, uint64(len(key)))
	dst = append(dst, key...)
	dst = append(dst, val...)
	body := dst[start+walHeader:]
	binary.BigEndian.PutUint32(dst[start:], uint32(len(body)))
	binary.BigEndian.PutUint32(dst[start+4:], entryChecksum(nonce, body))
	return dst
}

// Errors of readWAL. Replay applies the entries read either way; errForeign
// and errOldFormat come before any.
var (
	// errTorn reports a segment that ends in a partial or corrupt entry: a
	// write a crash interrupted (never acknowledged), or an earlier use's
	// leftover.
	errTorn = errors.New("torn or corrupt entry")
	// errDamaged reports damaged bytes with entries of this use after them:
	// not a torn write, but a damaged file. The entries after the damage
	// were read; what the damage covered is lost.
	errDamaged = errors.New("damaged entries inside the data")
	// errForeign reports a segment of another bbolt file's journal.
	errForeign = errors.New("segment of another bbolt file's journal")
	// errOldFormat reports a version 1 segment beside a file that has a
	// journal identity: a segment an older build left, checkpointed before
	// the file got its identity (or beside another file: nobody can tell).
	errOldFormat = errors.New("version 1 segment")
)

// minEntry is the size of the smallest entry: header, sequence number and
// a one-byte key length.
const minEntry = walHeader + 9

// readWAL calls fn for each entry of the segment file b, in order. A file
// without a header (preallocated, never written) has none, and so has one
// whose owner is not owner (errForeign) or a version 1 one unless
// owner.legacy (errOldFormat). It stops without error at a clean
// end (the end of b, or a zero length: the preallocated rest). A partial or
// corrupt entry, or one whose sequence number does not follow the previous
// one's, ends the data (errTorn), unless an entry of this use follows it
// further on: then the file is damaged, and readWAL skips to that entry,
// reads on, and returns an error wrapping errDamaged at the end. The
// entry's key and value alias b. floor is the checkpoint: entries at or
// below it are in bbolt already, and resync looks only above it.
func readWAL(b []byte, owner journalOwner, floor uint64, fn func(walEntry) error) error {
	var damage []string
	if len(b) < segmentHeaderV1 || string(b[:4]) != segmentMagic {
		switch {
		case len(b) < 4 || binary.BigEndian.Uint32(b) == 0:
			return nil // never written
		case !magicDamaged(b, owner):
			return fmt.Errorf("segment header: %w", errTorn)
		}
		damage = append(damage, "0-4 (the segment's magic)")
	}
	start := segmentHeader
	switch v := binary.BigEndian.Uint32(b[4:]); {
	case v == 1 && owner.legacy:
		start = segmentHeaderV1
	case v == 1:
		return errOldFormat
	case v != segmentVersion:
		return fmt.Errorf("segment version %d (this build reads %d)", v, segmentVersion)
	case len(b) < segmentHeader:
		return fmt.Errorf("segment header: %w", errTorn)
	case binary.BigEndian.Uint64(b[16:]) != owner.id:
		return fmt.Errorf("owner %016x, this file is %016x: %w", binary.BigEndian.Uint64(b[16:]), owner.id, errForeign)
	}
	nonce := binary.BigEndian.Uint64(b[8:])
	var prev uint64
	budget := 2 * len(b) // bytes resync may checksum: Open stays linear in the file
	for off := start; off < len(b); {
		e, n, err := entryAt(b, off, nonce, prev)
		if err == nil && n == 0 {
			if allZero(b[off:]) {
				break // the preallocated, never written end
			}
			err = errors.New("zeroed bytes")
		}
		if err != nil {
			next, seq, ok := resync(b, off+1, nonce, max(prev, floor), &budget)
			if !ok {
				if len(damage) > 0 {
					break // the tail after the last damage is an ordinary end
				}
				return fmt.Errorf("offset %d: %w: %w", off, err, errTorn)
			}
			damage = append(damage, fmt.Sprintf("%d-%d (%v)", off, next, err))
			off, prev = next, seq-1
			continue
		}
		prev = e.seq
		if err := fn(e); err != nil {
			return err
		}
		off += n
	}
	if len(damage) > 0 {
		return fmt.Errorf("bytes %s: %w", strings.Join(damage, ", "), errDamaged)
	}
	return nil
}

// magicDamaged reports whether b, a segment file whose first bytes are
// neither the magic nor zero, has the rest of a current header naming
// owner and an entry of its use right after it: then only the magic was
// damaged (a header torn by a power loss has no entry behind it), and the
// entries are replayed, the file reported damaged.
func magicDamaged(b []byte, owner journalOwner) bool {
	if len(b) < segmentHeader || binary.BigEndian.Uint32(b[4:]) != segmentVersion || binary.BigEndian.Uint64(b[16:]) != owner.id {
		return false
	}
	_, n, err := entryAt(b, segmentHeader, binary.BigEndian.Uint64(b[8:]), 0)
	return err == nil && n > 0
}

// entryAt decodes the entry of the use nonce at off, whose sequence number
// must follow prev (0: any). It returns the entry and its size, a size of 0
// at the preallocated end, or why there is no entry there.
func entryAt(b []byte, off int, nonce, prev uint64) (walEntry, int, error) {
	if len(b)-off < walHeader {
		if allZero(b[off:]) {
			return walEntry{}, 0, nil
		}
		return walEntry{}, 0, errors.New("partial header")
	}
	n := int64(binary.BigEndian.Uint32(b[off:]))
	sum := binary.BigEndian.Uint32(b[off+4:])
	if n == 0 && sum == 0 {
		return walEntry{}, 0, nil
	}
	if n < minEntry-walHeader || n > int64(len(b)-off-walHeader) {
		return walEntry{}, 0, fmt.Errorf("length %d", n)
	}
	body := b[off+walHeader : off+walHeader+int(n)]
	e := walEntry{seq: binary.BigEndian.Uint64(body)}
	if e.seq == 0 || e.seq == math.MaxUint64 || (prev != 0 && e.seq != prev+1) {
		return walEntry{}, 0, fmt.Errorf("sequence %d after %d", e.seq, prev)
	}
	if entryChecksum(nonce, body) != sum {
		return walEntry{}, 0, errors.New("checksum")
	}
	kl, w := binary.Uvarint(body[8:])
	if w <= 0 || kl > uint64(len(body)-8-w) {
		return walEntry{}, 0, errors.New("key length")
	}
	rest := body[8+w:]
	e.key = rest[:kl]
	if len(rest) > int(kl) {
		e.val = rest[kl:]
	}
	return e, walHeader + int(n), nil
}

// resync looks for an entry of the use nonce at or after from that a
// damaged stretch hid: its sequence number is above after (the previous
// entry's, or the checkpoint) by at most the entries a journal backlog can
// hold, and it is followed by the preallocated end or by the next entry in
// sequence. A torn write is followed by zeros or an earlier use's leftovers,
// so it finds nothing there. A checksum match by chance needs two in a row,
// under a nonce no sender knows; cheap header tests come first, and at most
// *budget bytes are checksummed, so bytes crafted to pass the cheap tests
// (a stored body, say) cannot make Open slow. It returns the entry's offset
// and sequence number.
func resync(b []byte, from int, nonce, after uint64, budget *int) (int, uint64, bool) {
	if allZero(b[from:]) {
		return 0, 0, false
	}
	window := uint64((maxBacklogBytes+len(b))/minEntry) + 1
	for off := from; len(b)-off >= minEntry && *budget > 0; off++ {
		// Cheap tests first: the length fits, the sequence number is in the
		// window, and where this entry would end, the next one is numbered
		// on or the data ends. Only then the checksums.
		n := int(binary.BigEndian.Uint32(b[off:]))
		seq := binary.BigEndian.Uint64(b[off+walHeader:])
		if n < minEntry-walHeader || n > len(b)-off-walHeader ||
			seq <= after || seq-after > window || seq >= math.MaxUint64-1 {
			continue
		}
		next := off + walHeader + n
		if len(b)-next >= minEntry && binary.BigEndian.Uint64(b[next+walHeader:]) != seq+1 &&
			binary.BigEndian.Uint64(b[next:]) != 0 {
			continue
		}
		*budget -= n
		e, n, err := entryAt(b, off, nonce, seq-1)
		if err != nil || n == 0 {
			continue
		}
		if next := off + n; len(b)-next >= walHeader { // the successor's checksum
			*budget -= min(int(binary.BigEndian.Uint32(b[next:])), len(b)-next)
		}
		if _, m, err := entryAt(b, off+n, nonce, e.seq); err != nil || m == 0 && !allZero(b[off+n:]) {
			continue
		}
		return off, e.seq, true
	}
	return 0, 0, false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// slotFile is one journal segment file found on disk.
type slotFile struct {
	path string
	slot int
}

// listSlots returns the journal segment files of the bbolt file at dbPath,
// by slot number.
func listSlots(dbPath string) ([]slotFile, error) {
	dir, base := filepath.Split(dbPath)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var slots []slotFile
	prefix := base + walSuffix
	for _, e := range ents {
		name := e.Name()
		num, ok := strings.CutPrefix(name, prefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		n, err := strconv.Atoi(num)
		if err != nil || n < 0 || strconv.Itoa(n) != num {
			continue
		}
		slots = append(slots, slotFile{path: filepath.Join(dir, name), slot: n})
	}
	slices.SortFunc(slots, func(a, b slotFile) int { return a.slot - b.slot })
	return slots, nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// slotPath names the segment file of slot n.
func slotPath(dbPath string, n int) string {
	return dbPath + walSuffix + strconv.Itoa(n)
}

// syncDir fsyncs a directory, so a file created or removed in it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
