package providers

import (
	"errors"
	"unicode/utf8"
)

// MaxJSONDepth bounds the nesting of arrays and objects that Canonical and the
// json: key source accept. A deeper body is not treated as JSON: the body
// source hashes its raw bytes and a json: source finds nothing. The bound keeps
// recursion shallow, so a hostile 10,000-deep body cannot exhaust the stack.
const MaxJSONDepth = 128

// Errors returned for bodies that are not acceptable JSON.
var (
	ErrJSONSyntax = errors.New("providers: invalid json")
	ErrJSONDepth  = errors.New("providers: json nested too deep")
)

// scanner is a small validating JSON reader over a byte slice. It accepts
// exactly RFC 8259 JSON in valid UTF-8; \u escapes must not leave a lone
// surrogate (so every string decodes to valid UTF-8).
type scanner struct {
	data []byte
	pos  int
}

func (s *scanner) reset(data []byte) {
	s.data = data
	s.pos = 0
}

func (s *scanner) skipSpace() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the next byte, or 0 at the end of the input.
func (s *scanner) peek() byte {
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

// scanString reads a string starting at its opening quote and returns the
// span of its raw contents (between the quotes) and whether it holds escapes.
func (s *scanner) scanString() (start, end int, escaped bool, err error) {
	s.pos++ // opening quote
	start = s.pos
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		switch {
		case c == '"':
			end = s.pos
			s.pos++
			return start, end, escaped, nil
		case c == '\\':
			escaped = true
			if err := s.scanEscape(); err != nil {
				return 0, 0, false, err
			}
		case c < 0x20:
			return 0, 0, false, ErrJSONSyntax
		case c < utf8.RuneSelf:
			s.pos++
		default:
			r, size := utf8.DecodeRune(s.data[s.pos:])
			if r == utf8.RuneError && size == 1 {
				return 0, 0, false, ErrJSONSyntax
			}
			s.pos += size
		}
	}
	return 0, 0, false, ErrJSONSyntax
}

// scanEscape validates one escape sequence starting at the backslash.
func (s *scanner) scanEscape() error {
	if s.pos+1 >= len(s.data) {
		return ErrJSONSyntax
	}
	switch s.data[s.pos+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.pos += 2
		return nil
	case 'u':
	default:
		return ErrJSONSyntax
	}
	r, ok := hex4(s.data, s.pos+2)
	if !ok {
		return ErrJSONSyntax
	}
	s.pos += 6
	switch {
	case r >= 0xDC00 && r <= 0xDFFF: // lone low surrogate
		return ErrJSONSyntax
	case r >= 0xD800 && r <= 0xDBFF: // high surrogate: a low one must follow
		if s.pos+1 >= len(s.data) || s.data[s.pos] != '\\' || s.data[s.pos+1] != 'u' {
			return ErrJSONSyntax
		}
		lo, ok := hex4(s.data, s.pos+2)
		if !ok || lo < 0xDC00 || lo > 0xDFFF {
			return ErrJSONSyntax
		}
		s.pos += 6
	}
	return nil
}

// hex4 decodes four hex digits at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return r, true
}

// scanNumber reads a number in RFC 8259 grammar and returns its span.
func (s *scanner) scanNumber() (start, end int, err error) {
	start = s.pos
	if s.peek() == '-' {
		s.pos++
	}
	switch c := s.peek(); {
	case c == '0':
		s.pos++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return 0, 0, ErrJSONSyntax
	}
	if s.peek() == '.' {
		s.pos++
		if !s.digits() {
			return 0, 0, ErrJSONSyntax
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.pos++
		if c := s.peek(); c == '+' || c == '-' {
			s.pos++
		}
		if !s.digits() {
			return 0, 0, ErrJSONSyntax
		}
	}
	return start, s.pos, nil
}

// digits consumes one or more decimal digits and reports whether there was one.
func (s *scanner) digits() bool {
	n := s.pos
	for s.pos < len(s.data) && s.data[s.pos] >= '0' && s.data[s.pos] <= '9' {
		s.pos++
	}
	return s.pos > n
}

// scanLiteral consumes lit (true, false or null).
func (s *scanner) scanLiteral(lit string) error {
	if len(s.data)-s.pos < len(lit) || string(s.data[s.pos:s.pos+len(lit)]) != lit {
		return ErrJSONSyntax
	}
	s.pos += len(lit)
	return nil
}

// skipValue validates and skips one value of any kind.
func (s *scanner) skipValue(depth int) error {
	s.skipSpace()
	switch c := s.peek(); {
	case c == '{' || c == '[':
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		if depth+1 > MaxJSONDepth {
			return ErrJSONDepth
		}
		s.pos++
		s.skipSpace()
		if s.peek() == closer {
			s.pos++
			return nil
		}
		for {
			if c == '{' {
				s.skipSpace()
				if s.peek() != '"' {
					return ErrJSONSyntax
				}
				if _, _, _, err := s.scanString(); err != nil {
					return err
				}
				s.skipSpace()
				if s.peek() != ':' {
					return ErrJSONSyntax
				}
				s.pos++
			}
			if err := s.skipValue(depth + 1); err != nil {
				return err
			}
			s.skipSpace()
			switch s.peek() {
			case ',':
				s.pos++
			case closer:
				s.pos++
				return nil
			default:
				return ErrJSONSyntax
			}
		}
	case c == '"':
		_, _, _, err := s.scanString()
		return err
	case c == 't':
		return s.scanLiteral("true")
	case c == 'f':
		return s.scanLiteral("false")
	case c == 'n':
		return s.scanLiteral("null")
	case c == '-' || (c >= '0' && c <= '9'):
		_, _, err := s.scanNumber()
		return err
	default:
		return ErrJSONSyntax
	}
}

// appendUnescaped appends the decoded form of a validated raw string body.
func appendUnescaped(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch raw[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r, _ := hex4(raw, i+2)
			if r >= 0xD800 && r <= 0xDBFF {
				lo, _ := hex4(raw, i+8)
				r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
				i += 6
			}
			dst = utf8.AppendRune(dst, r)
			i += 6
			continue
		default: // '"', '\\', '/'
			dst = append(dst, raw[i+1])
		}
		i += 2
	}
	return dst
}
