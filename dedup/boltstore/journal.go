package boltstore

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The journal is a write-ahead log in a few preallocated segment files
// beside the bbolt file, <file>.journal.<slot>. A Commit, Release or Forget
// is written to the current segment and fdatasynced (one write and one
// fdatasync per group of concurrent writes) before it returns; the
// checkpointer later copies what the sealed segments hold into bbolt in one
// large, key-sorted transaction, records in bbolt's meta bucket the last
// sequence number it covered, and hands the segment's file back for reuse.
//
// Segment files are zero-filled to segmentBytes when created and then
// overwritten in place, never extended in the common case, so an fdatasync
// flushes data only: no file size or block allocation to journal in the
// filesystem, which halves its latency on ext4. A reused file still holds
// older entries after the new ones; those were checkpointed before the file
// was reused, so replay skips them by sequence number, as it skips anything
// at or below the checkpoint.
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
// A zero length is the preallocated end of the data. A torn or corrupt entry
// also ends its segment: it was being written when the process died, so it
// was never acknowledged (or, in a reused file, it is an older entry partly
// overwritten).

// walSuffix separates the bbolt file name from a segment file's slot number.
const walSuffix = ".journal."

// segmentBytes is the size segment files are preallocated to; a segment is
// sealed before a write would pass it (a larger single group extends it).
const segmentBytes = 4 << 20

// walHeader is the length and checksum in front of every entry.
const walHeader = 8

// maxWALEntry bounds one entry when reading, so a corrupt length cannot
// allocate without limit: a record holds at most a stored response.
const maxWALEntry = 256 << 20

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

// appendWALEntry appends the encoding of one entry to dst.
func appendWALEntry(dst []byte, seq uint64, key, val []byte) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, walHeader)...)
	dst = binary.BigEndian.AppendUint64(dst, seq)
	dst = binary.AppendUvarint(dst, uint64(len(key)))
	dst = append(dst, key...)
	dst = append(dst, val...)
	body := dst[start+walHeader:]
	binary.BigEndian.PutUint32(dst[start:], uint32(len(body)))
	binary.BigEndian.PutUint32(dst[start+4:], crc32.Checksum(body, castagnoli))
	return dst
}

// errTorn reports a segment that ends in a partial or corrupt entry.
var errTorn = errors.New("torn or corrupt entry")

// readWAL calls fn for each entry of the segment in r, in order. It stops
// without error at a clean end, and with an error wrapping errTorn at a
// partial or corrupt entry (whatever follows it is ignored). The entry's key
// and value are only valid during fn.
func readWAL(r io.Reader, fn func(walEntry) error) error {
	br := bufio.NewReaderSize(r, 1<<16)
	var hdr [walHeader]byte
	var body []byte
	for off := int64(0); ; {
		if _, err := io.ReadFull(br, hdr[:]); err == io.EOF {
			return nil
		} else if err != nil {
			return fmt.Errorf("offset %d: %w", off, errTorn)
		}
		n := binary.BigEndian.Uint32(hdr[:4])
		if n == 0 && binary.BigEndian.Uint32(hdr[4:]) == 0 {
			return nil // the preallocated, never written end
		}
		if n < 9 || n > maxWALEntry {
			return fmt.Errorf("offset %d: length %d: %w", off, n, errTorn)
		}
		if cap(body) < int(n) {
			body = make([]byte, n)
		}
		body = body[:n]
		if _, err := io.ReadFull(br, body); err != nil {
			return fmt.Errorf("offset %d: %w", off, errTorn)
		}
		if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(hdr[4:]) {
			return fmt.Errorf("offset %d: checksum: %w", off, errTorn)
		}
		e := walEntry{seq: binary.BigEndian.Uint64(body)}
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
		off += walHeader + int64(n)
	}
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
