package boltstore

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

// The persisted record is a compact binary encoding, on the hot path of every
// duplicate and measured in bytes per key:
//
//	version    byte (recordVersion)
//	state      byte (1 processing, 2 processed, 3 failed), plus stateMaybe
//	           (0x80) when the record is MaybeProcessed
//	firstSeen  varint  unix milliseconds
//	completed  varint  milliseconds after firstSeen
//	expires    varint  milliseconds after completed
//	attempts   uvarint
//	lastStatus uvarint
//	lastError  string
//	bodySHA256 hexstr
//	fingerprint hexstr
//	response   uvarint status (0: none), then if non-zero:
//	           uvarint header count, per header: string name, uvarint value
//	           count, strings; then bytes body
//
// string and bytes are uvarint length ‖ bytes. hexstr is uvarint h ‖ h>>1
// bytes: when h is odd the bytes are the decoded lowercase hex (a SHA-256
// takes 32 bytes, not 64), when even they are the string itself.
//
// Times keep millisecond precision; the expiry index uses the same
// milliseconds so the sweeper can match a record to its index entry.
const recordVersion = 1

// Limits that keep a corrupt record from allocating without bound.
const (
	maxFieldLen   = 64 << 20
	maxHeaderKeys = 1 << 12
	maxHeaderVals = 1 << 12
	maxStatus     = 1 << 16
)

var errCorrupt = errors.New("boltstore: corrupt record")

var stateCodes = map[dedup.State]byte{
	dedup.StateProcessing: 1,
	dedup.StateProcessed:  2,
	dedup.StateFailed:     3,
}

var codeStates = [...]dedup.State{1: dedup.StateProcessing, 2: dedup.StateProcessed, 3: dedup.StateFailed}

// stateMaybe is the state byte's flag for a MaybeProcessed record. A
// reader from before it refuses such a record as corrupt (state > 3).
const stateMaybe = 0x80

// encodeRecord appends the encoding of r to dst. Owner and LeaseUntil are not
// persisted: leases live in memory.
func encodeRecord(dst []byte, r *dedup.Record) []byte {
	first := r.FirstSeen.UnixMilli()
	completed := first
	if !r.CompletedAt.IsZero() {
		completed = r.CompletedAt.UnixMilli()
	}
	expires := r.ExpiresAt.UnixMilli()
	code := stateCodes[r.State]
	if r.MaybeProcessed {
		code |= stateMaybe
	}
	dst = append(dst, recordVersion, code)
	dst = binary.AppendVarint(dst, first)
	dst = binary.AppendVarint(dst, completed-first)
	dst = binary.AppendVarint(dst, expires-completed)
	dst = binary.AppendUvarint(dst, uint64(max(r.Attempts, 0)))
	dst = binary.AppendUvarint(dst, uint64(min(max(r.LastStatus, 0), maxStatus)))
	dst = appendString(dst, r.LastError)
	dst = appendHex(dst, r.BodySHA256)
	dst = appendHex(dst, r.Fingerprint)
	if r.Response == nil || r.Response.Status <= 0 || r.Response.Status > maxStatus {
		return binary.AppendUvarint(dst, 0)
	}
	resp := r.Response
	dst = binary.AppendUvarint(dst, uint64(resp.Status))
	dst = binary.AppendUvarint(dst, uint64(len(resp.Header)))
	for name, vals := range resp.Header {
		dst = appendString(dst, name)
		dst = binary.AppendUvarint(dst, uint64(len(vals)))
		for _, v := range vals {
			dst = appendString(dst, v)
		}
	}
	return appendString(dst, string(resp.Body))
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendHex(dst []byte, s string) []byte {
	if len(s) > 0 && len(s)%2 == 0 && isLowerHex(s) {
		dst = binary.AppendUvarint(dst, uint64(len(s)/2)<<1|1)
		out, _ := hex.AppendDecode(dst, []byte(s)) // s is valid hex
		return out
	}
	dst = binary.AppendUvarint(dst, uint64(len(s))<<1)
	return append(dst, s...)
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// decoder reads the encoding; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = errCorrupt
	}
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) < 1 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

// int reads a uvarint that must fit an int no larger than limit.
func (d *decoder) int(limit uint64) int {
	v := d.uvarint()
	if v > limit {
		d.fail()
		return 0
	}
	return int(v)
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil || n > len(d.b) {
		d.fail()
		return nil
	}
	out := d.b[:n:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) string() string {
	return string(d.bytes(d.int(maxFieldLen)))
}

func (d *decoder) hex() string {
	h := d.uvarint()
	if h>>1 > maxFieldLen {
		d.fail()
		return ""
	}
	b := d.bytes(int(h >> 1))
	if h&1 == 1 {
		if len(b) == 0 {
			d.fail()
			return ""
		}
		return hex.EncodeToString(b)
	}
	return string(b)
}

// decodeRecord decodes b. The result shares no memory with b (bolt's bytes
// live only inside the transaction).
func decodeRecord(b []byte) (dedup.Record, error) {
	d := decoder{b: b}
	var r dedup.Record
	if v := d.byte(); d.err == nil && v != recordVersion {
		return r, fmt.Errorf("%w: version %d", errCorrupt, v)
	}
	code := d.byte()
	maybe := code&stateMaybe != 0
	code &^= stateMaybe
	if d.err == nil && (code == 0 || int(code) >= len(codeStates)) {
		return r, fmt.Errorf("%w: state %d", errCorrupt, code)
	}
	first := d.varint()
	completed := first + d.varint()
	expires := completed + d.varint()
	r.Attempts = d.int(1 << 31)
	r.LastStatus = d.int(maxStatus)
	r.LastError = d.string()
	r.BodySHA256 = d.hex()
	r.Fingerprint = d.hex()
	if status := d.int(maxStatus); status > 0 {
		resp := &dedup.Response{Status: status}
		if n := d.int(maxHeaderKeys); n > 0 {
			resp.Header = make(map[string][]string, n)
			for range n {
				name := d.string()
				m := d.int(maxHeaderVals)
				if d.err != nil {
					break
				}
				vals := make([]string, m)
				for i := range vals {
					vals[i] = d.string()
				}
				resp.Header[name] = vals
			}
		}
		if body := d.bytes(d.int(maxFieldLen)); len(body) > 0 {
			resp.Body = append([]byte(nil), body...)
		}
		r.Response = resp
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail()
	}
	if d.err != nil {
		return dedup.Record{}, d.err
	}
	r.State = codeStates[code]
	r.MaybeProcessed = maybe
	r.FirstSeen = time.UnixMilli(first).UTC()
	if r.State != dedup.StateProcessing {
		r.CompletedAt = time.UnixMilli(completed).UTC()
	}
	r.ExpiresAt = time.UnixMilli(expires).UTC()
	return r, nil
}

// recordExpiry reads only the expiry (unix milliseconds) of an encoded
// record, for the sweeper and the duplicate fast path.
func recordExpiry(b []byte) (int64, bool) {
	d := decoder{b: b}
	if d.byte() != recordVersion {
		return 0, false
	}
	d.byte()
	first := d.varint()
	completed := first + d.varint()
	expires := completed + d.varint()
	return expires, d.err == nil
}
