package providers

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sync"
)

// Canonical returns the canonical form of a JSON document, so that the same
// logical payload written with another key order or spacing gives the same
// bytes:
//
//   - insignificant white space is removed;
//   - object members are sorted by their canonically encoded key (byte order;
//     this is UTF-8 byte order for keys without control characters, quotes or
//     backslashes); members with equal keys keep their order;
//   - numbers are kept exactly as written (1.0 and 1 stay different);
//   - strings are decoded and re-encoded one way: only '"', '\\' and control
//     characters are escaped (as \b \f \n \r \t or \u00xx); everything else,
//     including '/' and non-ASCII, is written as UTF-8.
//
// Canonical is idempotent. It returns an error wrapping ErrJSONSyntax when body
// is not one valid JSON value in valid UTF-8 (a \u escape leaving a lone
// surrogate counts as invalid), and ErrJSONDepth when arrays and objects nest
// deeper than MaxJSONDepth.
func Canonical(body []byte) ([]byte, error) {
	c := canonPool.Get().(*canonicalizer)
	defer c.release()
	if err := c.run(body); err != nil {
		return nil, err
	}
	return bytes.Clone(c.out), nil
}

// BodyKey returns the hex SHA-256 of body's canonical form (see Canonical), or
// of its raw bytes when body is not acceptable JSON. It is the value of the
// "body" key source.
func BodyKey(body []byte) string {
	c := canonPool.Get().(*canonicalizer)
	defer c.release()
	var sum [sha256.Size]byte
	if err := c.run(body); err != nil {
		sum = sha256.Sum256(body)
	} else {
		sum = sha256.Sum256(c.out)
	}
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

var canonPool = sync.Pool{New: func() any { return new(canonicalizer) }}

// maxPooledBuffer keeps huge one-off bodies from pinning memory in the pool.
const maxPooledBuffer = 1 << 20

// canonicalizer holds reusable buffers for one canonicalisation.
type canonicalizer struct {
	scanner
	out     []byte
	scratch []byte
	members []memberSpan
}

// memberSpan locates one canonical `"key":value` member in out; the key's
// contents (without quotes) are out[start+1 : keyEnd-1].
type memberSpan struct{ start, keyEnd, end int }

func (c *canonicalizer) release() {
	c.data = nil
	if cap(c.out) > maxPooledBuffer || cap(c.scratch) > maxPooledBuffer {
		return
	}
	canonPool.Put(c)
}

func (c *canonicalizer) run(body []byte) error {
	c.reset(body)
	c.out = c.out[:0]
	c.members = c.members[:0]
	if err := c.value(0); err != nil {
		return err
	}
	c.skipSpace()
	if c.pos != len(c.data) {
		return ErrJSONSyntax
	}
	return nil
}

func (c *canonicalizer) value(depth int) error {
	c.skipSpace()
	switch ch := c.peek(); {
	case ch == '{':
		return c.object(depth + 1)
	case ch == '[':
		return c.array(depth + 1)
	case ch == '"':
		return c.str()
	case ch == 't', ch == 'f', ch == 'n':
		start := c.pos
		if err := c.skipValue(depth); err != nil {
			return err
		}
		c.out = append(c.out, c.data[start:c.pos]...)
		return nil
	case ch == '-' || (ch >= '0' && ch <= '9'):
		start, end, err := c.scanNumber()
		if err != nil {
			return err
		}
		c.out = append(c.out, c.data[start:end]...)
		return nil
	default:
		return ErrJSONSyntax
	}
}

func (c *canonicalizer) str() error {
	start, end, escaped, err := c.scanString()
	if err != nil {
		return err
	}
	c.out = append(c.out, '"')
	if escaped {
		c.scratch = appendUnescaped(c.scratch[:0], c.data[start:end])
		c.out = appendCanonicalString(c.out, c.scratch)
	} else {
		// Unescaped raw contents hold no quote, backslash or control
		// character, so they are already canonical.
		c.out = append(c.out, c.data[start:end]...)
	}
	c.out = append(c.out, '"')
	return nil
}

func (c *canonicalizer) array(depth int) error {
	if depth > MaxJSONDepth {
		return ErrJSONDepth
	}
	c.pos++
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.peek() == ']' {
		c.pos++
		c.out = append(c.out, ']')
		return nil
	}
	for {
		if err := c.value(depth); err != nil {
			return err
		}
		c.skipSpace()
		switch c.peek() {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			return nil
		default:
			return ErrJSONSyntax
		}
	}
}

func (c *canonicalizer) object(depth int) error {
	if depth > MaxJSONDepth {
		return ErrJSONDepth
	}
	c.pos++
	c.out = append(c.out, '{')
	region := len(c.out)
	base := len(c.members)
	defer func() { c.members = c.members[:base] }()
	c.skipSpace()
	if c.peek() == '}' {
		c.pos++
		c.out = append(c.out, '}')
		return nil
	}
	sorted := true
	for {
		c.skipSpace()
		if c.peek() != '"' {
			return ErrJSONSyntax
		}
		start := len(c.out)
		if err := c.str(); err != nil {
			return err
		}
		keyEnd := len(c.out)
		c.skipSpace()
		if c.peek() != ':' {
			return ErrJSONSyntax
		}
		c.pos++
		c.out = append(c.out, ':')
		if err := c.value(depth); err != nil {
			return err
		}
		m := memberSpan{start, keyEnd, len(c.out)}
		if len(c.members) > base && c.compareKeys(c.members[len(c.members)-1], m) > 0 {
			sorted = false
		}
		c.members = append(c.members, m)
		c.skipSpace()
		if c.peek() == ',' {
			c.pos++
			c.out = append(c.out, ',')
			continue
		}
		if c.peek() != '}' {
			return ErrJSONSyntax
		}
		c.pos++
		break
	}
	if !sorted {
		members := c.members[base:]
		slices.SortStableFunc(members, c.compareKeys)
		c.scratch = append(c.scratch[:0], c.out[region:]...)
		c.out = c.out[:region]
		for i, m := range members {
			if i > 0 {
				c.out = append(c.out, ',')
			}
			c.out = append(c.out, c.scratch[m.start-region:m.end-region]...)
		}
	}
	c.out = append(c.out, '}')
	return nil
}

func (c *canonicalizer) compareKeys(a, b memberSpan) int {
	return bytes.Compare(c.out[a.start+1:a.keyEnd-1], c.out[b.start+1:b.keyEnd-1])
}

// appendCanonicalString appends the canonical encoding of the decoded string s,
// without quotes.
func appendCanonicalString(dst, s []byte) []byte {
	const hexDigits = "0123456789abcdef"
	for _, b := range s {
		switch {
		case b == '"' || b == '\\':
			dst = append(dst, '\\', b)
		case b >= 0x20:
			dst = append(dst, b)
		case b == '\b':
			dst = append(dst, '\\', 'b')
		case b == '\f':
			dst = append(dst, '\\', 'f')
		case b == '\n':
			dst = append(dst, '\\', 'n')
		case b == '\r':
			dst = append(dst, '\\', 'r')
		case b == '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
		}
	}
	return dst
}
