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

// The journal is a write-ahead log in segment files beside the bbolt file,
// named <file>.wal.<first sequence number, 16 hex digits>. A Commit, Release
// or Forget is appended to the current segment and fdatasynced (one append
// and one fdatasync per group of concurrent writes) before it returns; the
// checkpointer later copies what the sealed segments hold into bbolt in one
// large, key-sorted transaction and deletes them. The bbolt meta bucket
// records the last sequence number a checkpoint covered, so a segment whose
// deletion did not survive a crash is skipped when replayed.
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
// A torn or corrupt entry ends its segment: it was being written when the
// process died, so it was never acknowledged.

// walSuffix separates the bbolt file name from a segment's sequence number.
const walSuffix = ".wal."

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

// segmentFile is one journal segment found on disk.
type segmentFile struct {
	path  string
	first uint64
}

// listSegments returns the journal segments of the bbolt file at dbPath,
// oldest first.
func listSegments(dbPath string) ([]segmentFile, error) {
	dir, base := filepath.Split(dbPath)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var segs []segmentFile
	prefix := base + walSuffix
	for _, e := range ents {
		name := e.Name()
		hex, ok := strings.CutPrefix(name, prefix)
		if !ok || len(hex) != 16 || !e.Type().IsRegular() {
			continue
		}
		first, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		segs = append(segs, segmentFile{path: filepath.Join(dir, name), first: first})
	}
	slices.SortFunc(segs, func(a, b segmentFile) int { return cmpUint(a.first, b.first) })
	return segs, nil
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

// segmentPath names the segment whose first entry is seq.
func segmentPath(dbPath string, seq uint64) string {
	return fmt.Sprintf("%s%s%016x", dbPath, walSuffix, seq)
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
