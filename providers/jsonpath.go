package providers

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// jsonPath is a parsed dotted path ("data.object.id"). A segment that is a
// plain decimal number ("items.0.id") also indexes into an array.
type jsonPath struct {
	segs []string
	idx  []int // array index of each segment, or -1
}

// parseJSONPath splits a dotted path. Empty segments are an error.
func parseJSONPath(p string) (jsonPath, error) {
	if p == "" {
		return jsonPath{}, fmt.Errorf("empty json path")
	}
	segs := strings.Split(p, ".")
	idx := make([]int, len(segs))
	for i, s := range segs {
		if s == "" {
			return jsonPath{}, fmt.Errorf("empty segment in json path %q", p)
		}
		idx[i] = -1
		if s == "0" || (s[0] >= '1' && s[0] <= '9') {
			if n, err := strconv.Atoi(s); err == nil && strconv.Itoa(n) == s {
				idx[i] = n
			}
		}
	}
	return jsonPath{segs: segs, idx: idx}, nil
}

// LookupJSON returns the value at a dotted path in a JSON body ("id",
// "data.object.id", "items.0.id": a decimal segment also indexes an array).
//
// A string is returned decoded, as-is; a number exactly as written. The value
// is absent (ok false) when the path does not exist, when it names null, a
// boolean, an object or an array (none of which identifies an event), when the
// body is not valid JSON, or when it nests deeper than MaxJSONDepth. When an
// object repeats a key, the last occurrence wins, as in encoding/json and
// JavaScript's JSON.parse. The body is validated in full with a bounded,
// allocation-light scan; it is never unmarshalled.
func LookupJSON(body []byte, path string) (value string, ok bool) {
	p, err := parseJSONPath(path)
	if err != nil {
		return "", false
	}
	v, ok, err := p.lookup(body)
	if err != nil {
		return "", false
	}
	return v, ok
}

var walkerPool = sync.Pool{New: func() any { return new(pathWalker) }}

// lookup walks body and returns the value at p; err is non-nil when body is
// not acceptable JSON.
func (p jsonPath) lookup(body []byte) (string, bool, error) {
	w := walkerPool.Get().(*pathWalker)
	defer func() {
		w.data = nil
		if cap(w.buf) <= maxPooledBuffer {
			walkerPool.Put(w)
		}
	}()
	w.reset(body)
	w.path = p
	w.found = false
	w.val = ""
	if err := w.walk(0, 0, true); err != nil {
		return "", false, err
	}
	w.skipSpace()
	if w.pos != len(w.data) {
		return "", false, ErrJSONSyntax
	}
	return w.val, w.found, nil
}

type pathWalker struct {
	scanner
	path  jsonPath
	found bool
	val   string
	buf   []byte
}

// walk scans one value. onPath reports that this value sits at path[:level].
func (w *pathWalker) walk(depth, level int, onPath bool) error {
	w.skipSpace()
	if !onPath {
		return w.skipValue(depth)
	}
	// A later occurrence of a key on the path replaces an earlier one.
	w.val, w.found = "", false
	c := w.peek()
	if level == len(w.path.segs) { // the target
		switch {
		case c == '"':
			start, end, escaped, err := w.scanString()
			if err != nil {
				return err
			}
			if escaped {
				w.buf = appendUnescaped(w.buf[:0], w.data[start:end])
				w.val = string(w.buf)
			} else {
				w.val = string(w.data[start:end])
			}
			w.found = true
			return nil
		case c == '-' || (c >= '0' && c <= '9'):
			start, end, err := w.scanNumber()
			if err != nil {
				return err
			}
			w.val, w.found = string(w.data[start:end]), true
			return nil
		default: // null, booleans, objects and arrays are absent
			return w.skipValue(depth)
		}
	}
	switch c {
	case '{':
		return w.object(depth+1, level)
	case '[':
		return w.array(depth+1, level)
	default:
		return w.skipValue(depth)
	}
}

func (w *pathWalker) object(depth, level int) error {
	if depth > MaxJSONDepth {
		return ErrJSONDepth
	}
	w.pos++
	w.skipSpace()
	if w.peek() == '}' {
		w.pos++
		return nil
	}
	seg := w.path.segs[level]
	for {
		w.skipSpace()
		if w.peek() != '"' {
			return ErrJSONSyntax
		}
		start, end, escaped, err := w.scanString()
		if err != nil {
			return err
		}
		var match bool
		if escaped {
			w.buf = appendUnescaped(w.buf[:0], w.data[start:end])
			match = string(w.buf) == seg
		} else {
			match = string(w.data[start:end]) == seg
		}
		w.skipSpace()
		if w.peek() != ':' {
			return ErrJSONSyntax
		}
		w.pos++
		if err := w.walk(depth, level+1, match); err != nil {
			return err
		}
		w.skipSpace()
		switch w.peek() {
		case ',':
			w.pos++
		case '}':
			w.pos++
			return nil
		default:
			return ErrJSONSyntax
		}
	}
}

func (w *pathWalker) array(depth, level int) error {
	if depth > MaxJSONDepth {
		return ErrJSONDepth
	}
	w.pos++
	w.skipSpace()
	if w.peek() == ']' {
		w.pos++
		return nil
	}
	want := w.path.idx[level]
	for i := 0; ; i++ {
		if err := w.walk(depth, level+1, i == want); err != nil {
			return err
		}
		w.skipSpace()
		switch w.peek() {
		case ',':
			w.pos++
		case ']':
			w.pos++
			return nil
		default:
			return ErrJSONSyntax
		}
	}
}
