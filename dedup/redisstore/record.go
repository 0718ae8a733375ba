package redisstore

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

// A record is one Redis string value, compact so that a remembered key costs
// little memory:
//
//	state,first_seen,expires_at,attempts,aux,claim_len,<claim part><result part>
//
// state is one letter: p (processing), d (processed, "done") or f (failed).
// Times are milliseconds since the Unix epoch in base 36 (8 characters until
// the year 2059). expires_at is the lease end while processing, the window
// end when processed, the retention end when failed. aux is the owner token
// while processing and completed_at (base 36) otherwise. claim_len is the
// decimal length of the claim part. The header is all the Lua scripts parse;
// the two binary parts are opaque to them and are encoded here:
//
//	claim part:  field(body_sha256) field(fingerprint)
//	field:       0x00 (empty) | 0x01 + 32 raw bytes (64-digit lower-case hex)
//	             | 0x02 + uvarint length + bytes (anything else)
//	result part: empty (never completed) |
//	             uvarint last_status, uvarint len, last_error,
//	             then 0x02 when the record is MaybeProcessed (a failed
//	             record, or a claim that carried it over),
//	             then optionally 0x01 + response
//	response:    uvarint status, uvarint header count, per header (sorted by
//	             name) uvarint len + name, uvarint value count, per value
//	             uvarint len + value; the rest of the string is the body.
//
// A new format must change the state letters so old readers refuse it.
const (
	stateProcessing = "p"
	stateProcessed  = "d"
	stateFailed     = "f"
)

// Field tags of the claim part.
const (
	fieldEmpty = 0x00
	fieldHex   = 0x01
	fieldRaw   = 0x02
)

// errBadRecord reports a value that is not a record of this format.
var errBadRecord = errors.New("redisstore: undecodable record")

// encodeClaim returns the claim part for a record.
func encodeClaim(bodySHA256, fingerprint string) string {
	b := make([]byte, 0, 2+32+32)
	b = appendField(b, bodySHA256)
	b = appendField(b, fingerprint)
	return string(b)
}

// appendField appends one claim field, packing lower-case hex SHA-256 digests
// into 32 raw bytes.
func appendField(b []byte, s string) []byte {
	switch {
	case s == "":
		return append(b, fieldEmpty)
	case len(s) == 64 && isLowerHex(s):
		b = append(b, fieldHex)
		b, _ = hex.AppendDecode(b, []byte(s)) // isLowerHex checked it
		return b
	default:
		b = append(b, fieldRaw)
		b = binary.AppendUvarint(b, uint64(len(s)))
		return append(b, s...)
	}
}

// isLowerHex reports whether s is made of 0-9 and a-f only, so that hex
// decoding and re-encoding gives s back.
func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Tags that may follow last_error in the result part, in this order.
const (
	resultResponse = 0x01
	resultMaybe    = 0x02
)

// encodeResult returns the result part written by commit and release.
func encodeResult(status int, errText string, maybe bool, resp *dedup.Response) string {
	b := make([]byte, 0, 9+len(errText))
	b = binary.AppendUvarint(b, uint64(max(status, 0)))
	b = binary.AppendUvarint(b, uint64(len(errText)))
	b = append(b, errText...)
	if maybe {
		b = append(b, resultMaybe)
	}
	if resp == nil {
		return string(b)
	}
	b = append(b, resultResponse)
	b = binary.AppendUvarint(b, uint64(max(resp.Status, 0)))
	names := make([]string, 0, len(resp.Header))
	for name := range resp.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		vals := resp.Header[name]
		b = binary.AppendUvarint(b, uint64(len(vals)))
		for _, v := range vals {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return string(append(b, resp.Body...))
}

// decodeRecord parses a stored value into a Record. It never panics on
// malformed input.
func decodeRecord(s string) (dedup.Record, error) {
	var rec dedup.Record
	parts := strings.SplitN(s, ",", 7)
	if len(parts) != 7 {
		return rec, fmt.Errorf("%w: %d header fields, want 7", errBadRecord, len(parts))
	}
	state, fs, exp, att, aux, clen, rest := parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], parts[6]
	first, err1 := parse36(fs)
	expires, err2 := parse36(exp)
	attempts, err3 := strconv.Atoi(att)
	claimLen, err4 := strconv.Atoi(clen)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return rec, fmt.Errorf("%w: %w", errBadRecord, err)
	}
	if claimLen < 0 || claimLen > len(rest) {
		return rec, fmt.Errorf("%w: claim length %d beyond %d bytes", errBadRecord, claimLen, len(rest))
	}
	rec.FirstSeen = first
	rec.ExpiresAt = expires
	rec.Attempts = attempts
	switch state {
	case stateProcessing:
		rec.State = dedup.StateProcessing
		rec.Owner = aux
		rec.LeaseUntil = expires
	case stateProcessed, stateFailed:
		rec.State = dedup.StateProcessed
		if state == stateFailed {
			rec.State = dedup.StateFailed
		}
		if rec.CompletedAt, err1 = parse36(aux); err1 != nil {
			return rec, fmt.Errorf("%w: completed_at: %w", errBadRecord, err1)
		}
	default:
		return rec, fmt.Errorf("%w: state %q", errBadRecord, state)
	}
	claim := rest[:claimLen]
	var err error
	if rec.BodySHA256, claim, err = readField(claim); err != nil {
		return rec, err
	}
	if rec.Fingerprint, claim, err = readField(claim); err != nil {
		return rec, err
	}
	if claim != "" {
		return rec, fmt.Errorf("%w: %d bytes after the claim fields", errBadRecord, len(claim))
	}
	if err := decodeResult(rest[claimLen:], &rec); err != nil {
		return rec, err
	}
	return rec, nil
}

// parse36 parses base-36 epoch milliseconds.
func parse36(s string) (time.Time, error) {
	ms, err := strconv.ParseInt(s, 36, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(ms).UTC(), nil
}

// readField reads one claim field from the front of s.
func readField(s string) (string, string, error) {
	if s == "" {
		return "", s, fmt.Errorf("%w: claim field missing", errBadRecord)
	}
	switch s[0] {
	case fieldEmpty:
		return "", s[1:], nil
	case fieldHex:
		if len(s) < 33 {
			return "", s, fmt.Errorf("%w: short digest", errBadRecord)
		}
		return hex.EncodeToString([]byte(s[1:33])), s[33:], nil
	case fieldRaw:
		return readString(s[1:])
	}
	return "", s, fmt.Errorf("%w: claim field tag %#x", errBadRecord, s[0])
}

// readUvarint reads a uvarint from the front of s.
func readUvarint(s string) (uint64, string, error) {
	var buf [binary.MaxVarintLen64]byte
	n := copy(buf[:], s)
	v, k := binary.Uvarint(buf[:n])
	if k <= 0 {
		return 0, s, fmt.Errorf("%w: bad varint", errBadRecord)
	}
	return v, s[k:], nil
}

// readString reads a uvarint length and that many bytes from the front of s.
func readString(s string) (string, string, error) {
	n, s, err := readUvarint(s)
	if err != nil {
		return "", s, err
	}
	if n > uint64(len(s)) {
		return "", s, fmt.Errorf("%w: string of %d bytes beyond %d", errBadRecord, n, len(s))
	}
	return s[:n], s[n:], nil
}

// readInt reads a uvarint that must fit an HTTP status or a count.
func readInt(s string) (int, string, error) {
	v, s, err := readUvarint(s)
	if err != nil {
		return 0, s, err
	}
	if v > 1<<31-1 {
		return 0, s, fmt.Errorf("%w: number %d too large", errBadRecord, v)
	}
	return int(v), s, nil
}

// decodeResult parses the result part into rec.
func decodeResult(s string, rec *dedup.Record) error {
	if s == "" {
		return nil
	}
	var err error
	if rec.LastStatus, s, err = readInt(s); err != nil {
		return err
	}
	if rec.LastError, s, err = readString(s); err != nil {
		return err
	}
	if s != "" && s[0] == resultMaybe {
		rec.MaybeProcessed = true
		s = s[1:]
	}
	if s == "" {
		return nil
	}
	if s[0] != resultResponse {
		return fmt.Errorf("%w: response tag %#x", errBadRecord, s[0])
	}
	s = s[1:]
	resp := &dedup.Response{}
	if resp.Status, s, err = readInt(s); err != nil {
		return err
	}
	var nh int
	if nh, s, err = readInt(s); err != nil {
		return err
	}
	if nh > len(s) { // every header takes at least one byte
		return fmt.Errorf("%w: %d headers in %d bytes", errBadRecord, nh, len(s))
	}
	if nh > 0 {
		resp.Header = make(map[string][]string, nh)
	}
	for range nh {
		var name string
		var nv int
		if name, s, err = readString(s); err != nil {
			return err
		}
		if nv, s, err = readInt(s); err != nil {
			return err
		}
		if nv > len(s) {
			return fmt.Errorf("%w: %d values in %d bytes", errBadRecord, nv, len(s))
		}
		vals := make([]string, nv)
		for i := range vals {
			if vals[i], s, err = readString(s); err != nil {
				return err
			}
		}
		resp.Header[name] = vals
	}
	if s != "" {
		resp.Body = []byte(s)
	}
	rec.Response = resp
	return nil
}
