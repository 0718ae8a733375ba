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
// never acknowledged, or it is an earlier use's leftover.

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

// A segment file starts with a header naming this use of the file:
//
//	magic   "DGWJ"
//	version uint32 (big-endian), 1
//	nonce   8 random bytes, new each time the file is (re)used
//
// Every entry's checksum covers the nonce, so bytes an earlier use of the
// file left behind (or bytes inside a stored record that happen to look like
// an entry) never pass as an entry of this use.
const (
	segmentMagic   = "DGWJ"
	segmentVersion = 1
	segmentHeader  = 16
)

// appendSegmentHeader appends a segment header with nonce to dst.
func appendSegmentHeader(dst []byte, nonce uint64) []byte {
	dst = append(dst, segmentMagic...)
	dst = binary.BigEndian.AppendUint32(dst, segmentVersion)
	return binary.BigEndian.AppendUint64(dst, nonce)
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

// errTorn reports a segment that ends in a partial or corrupt entry.
var errTorn = errors.New("torn or corrupt entry")

// readWAL calls fn for each entry of the segment file b, in order. A file
// without a header (preallocated, never written) has none. It stops without
// error at a clean end (the end of b, or a zero length: the preallocated
// rest), and with an error wrapping errTorn at a partial or corrupt entry or
// one whose sequence number does not follow the previous one's (whatever
// follows is an earlier use's or a crash's leftover). The entry's key and
// value alias b.
func readWAL(b []byte, fn func(walEntry) error) error {
	if len(b) < segmentHeader || string(b[:4]) != segmentMagic {
		if len(b) >= 4 && binary.BigEndian.Uint32(b) != 0 {
			return fmt.Errorf("segment header: %w", errTorn)
		}
		return nil // never written
	}
	if v := binary.BigEndian.Uint32(b[4:]); v != segmentVersion {
		return fmt.Errorf("segment version %d (this build reads %d)", v, segmentVersion)
	}
	nonce := binary.BigEndian.Uint64(b[8:])
	var prev uint64
	for off := segmentHeader; off < len(b); {
		if len(b)-off < walHeader {
			if allZero(b[off:]) {
				return nil
			}
			return fmt.Errorf("offset %d: %w", off, errTorn)
		}
		n := int64(binary.BigEndian.Uint32(b[off:]))
		sum := binary.BigEndian.Uint32(b[off+4:])
		if n == 0 && sum == 0 {
			return nil // the preallocated, never written end
		}
		if n < 9 || n > int64(len(b)-off-walHeader) {
			return fmt.Errorf("offset %d: length %d: %w", off, n, errTorn)
		}
		body := b[off+walHeader : off+walHeader+int(n)]
		if entryChecksum(nonce, body) != sum {
			return fmt.Errorf("offset %d: checksum: %w", off, errTorn)
		}
		e := walEntry{seq: binary.BigEndian.Uint64(body)}
		if e.seq == 0 || e.seq == math.MaxUint64 || (prev != 0 && e.seq != prev+1) {
			return fmt.Errorf("offset %d: sequence %d after %d: %w", off, e.seq, prev, errTorn)
		}
		prev = e.seq
		kl, w := binary.Uvarint(body[8:])
		if w <= 0 || kl > uint64(len(body)-8-w) {
			return fmt.Errorf("offset %d: key length: %w", off, errTorn)
		}
		rest := body[8+w:]
		e.key = rest[:kl]
		if len(rest) > int(kl) {
			e.val = rest[kl:]
		}
		if err := fn(e); err != nil {
			return err
		}
		off += walHeader + int(n)
	}
	return nil
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
