package providers

import "slices"

// CanonicalWithout returns the canonical form of a JSON document (see
// Canonical) with the top-level object members named in exclude left out, so
// that fields which legitimately differ between retries of one request
// (timestamps, nonces) do not change it.
//
//   - Names are compared with the decoded member names, exactly (case
//     sensitive): "ts" also removes a member written "\u0074s".
//   - Every member with an excluded name is removed, also when a name repeats.
//   - Only the top level is affected; nested members of the same name stay.
//   - When exclude is empty or the document is not an object, the result is
//     Canonical(body).
//
// The result is itself canonical. Errors are Canonical's: ErrJSONSyntax or
// ErrJSONDepth, wrapped.
func CanonicalWithout(body []byte, exclude []string) ([]byte, error) {
	canon, err := Canonical(body)
	if err != nil || len(exclude) == 0 || canon[0] != '{' || len(canon) == 2 {
		return canon, err
	}
	// canon is valid, compact JSON: scan its members without re-validating.
	s := scanner{data: canon, pos: 1}
	out := make([]byte, 1, len(canon))
	out[0] = '{'
	var name []byte
	for {
		member := s.pos
		start, end, escaped, _ := s.scanString()
		name = canon[start:end]
		if escaped {
			name = appendUnescaped(name[:0:0], canon[start:end])
		}
		s.pos++ // ':'
		_ = s.skipValue(1)
		if !slices.Contains(exclude, string(name)) {
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(out, canon[member:s.pos]...)
		}
		if s.peek() != ',' {
			break // '}'
		}
		s.pos++
	}
	return append(out, '}'), nil
}
