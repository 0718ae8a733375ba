package providers

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// KeySourceError reports an invalid entry of a route's keys: list. Its message
// names the entry ("keys[1]: unknown source \"foo:bar\""), so a config loader
// can prefix it with the route: fmt.Errorf("routes[%d].%w", i, err).
type KeySourceError struct {
	// Index is the entry's position in the list.
	Index int
	// Source is the entry as written.
	Source string
	// Reason says what is wrong with it.
	Reason string
}

func (e *KeySourceError) Error() string {
	return fmt.Sprintf("keys[%d]: %s %q", e.Index, e.Reason, e.Source)
}

// ValidateKeys checks a route's keys: list without building it. It returns nil
// for a valid list (an empty list is valid here; New requires keys only for
// the generic provider) and otherwise a *KeySourceError for the first bad entry.
func ValidateKeys(keys []string) error {
	for i, k := range keys {
		if _, err := parseKeySource(k); err != nil {
			return &KeySourceError{Index: i, Source: k, Reason: err.Error()}
		}
	}
	return nil
}

// ParseKeys turns an ordered list of key sources into a KeyFunc:
//
//   - "header:NAME": the request header NAME (case-insensitive). An
//     Idempotency-Key that is a Structured Field string ("k-1", as
//     draft-ietf-httpapi-idempotency-key-header writes it) is the string it
//     holds (k-1), the same key as sent unquoted. A header repeated with
//     different values (after that unquoting) makes the request ambiguous:
//     an application reading the last one would disagree with a gateway
//     reading the first, and a signature check may have read either;
//   - "json:PATH": the value at a dotted path in the JSON body (see LookupJSON:
//     strings as-is, numbers as written; null, booleans, objects and arrays are
//     absent);
//   - "query:NAME": the URL query parameter NAME;
//   - "body": BodyKey(body), the hex SHA-256 of the canonical JSON body (raw
//     bytes when not JSON). An empty body is absent.
//
// The KeyFunc returns the first non-empty value; an empty value counts as
// absent. An ambiguous header: source ends the search with an error wrapping
// ErrNoKey and ErrAmbiguousKey: falling through to the next source would
// key a request whose identity is in doubt. When every source is absent it
// returns an error wrapping ErrNoKey
// and, when a json: source found no value because the body is not JSON it
// can read, also ErrJSONSyntax or ErrJSONDepth (so the gateway can say why).
// ParseKeys fails with a *KeySourceError for an invalid entry, and with an
// error for an empty list.
func ParseKeys(keys []string) (KeyFunc, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("keys: at least one key source is required")
	}
	sources := make([]keySource, len(keys))
	for i, k := range keys {
		s, err := parseKeySource(k)
		if err != nil {
			return nil, &KeySourceError{Index: i, Source: k, Reason: err.Error()}
		}
		sources[i] = s
	}
	desc := strings.Join(keys, ", ")
	return func(r *http.Request, body []byte) (string, error) {
		var bodyErr error
		for _, s := range sources {
			v, err := s(r, body)
			if v != "" {
				return v, nil
			}
			if errors.Is(err, ErrAmbiguousKey) {
				return "", fmt.Errorf("%w (tried %s): %w", ErrNoKey, desc, err)
			}
			if bodyErr == nil {
				bodyErr = err
			}
		}
		if bodyErr != nil {
			return "", fmt.Errorf("%w (tried %s): %w", ErrNoKey, desc, bodyErr)
		}
		return "", fmt.Errorf("%w (tried %s)", ErrNoKey, desc)
	}, nil
}

// keySource extracts one candidate key; "" means absent. A json: source
// that could not read the body says why in err.
type keySource func(r *http.Request, body []byte) (key string, err error)

func parseKeySource(s string) (keySource, error) {
	if s == "body" {
		return func(_ *http.Request, body []byte) (string, error) {
			if len(body) == 0 {
				return "", nil
			}
			return BodyKey(body), nil
		}, nil
	}
	kind, arg, ok := strings.Cut(s, ":")
	if !ok {
		return nil, fmt.Errorf("unknown source")
	}
	switch kind {
	case "header":
		if !validHeaderName(arg) {
			return nil, fmt.Errorf("invalid header name in source")
		}
		name := http.CanonicalHeaderKey(arg)
		sfString := name == "Idempotency-Key"
		return func(r *http.Request, _ []byte) (string, error) {
			var normalize func(string) string
			if sfString {
				normalize = sfStringValue
			}
			v, ok := HeaderValue(r.Header, name, normalize)
			if !ok {
				return "", fmt.Errorf("%w: %s appears %d times", ErrAmbiguousKey, name, len(r.Header.Values(name)))
			}
			return v, nil
		}, nil
	case "query":
		if arg == "" {
			return nil, fmt.Errorf("empty query parameter name in source")
		}
		return func(r *http.Request, _ []byte) (string, error) {
			if r.URL == nil {
				return "", nil
			}
			return r.URL.Query().Get(arg), nil
		}, nil
	case "json":
		p, err := parseJSONPath(arg)
		if err != nil {
			return nil, fmt.Errorf("invalid json path (want dotted names like data.object.id) in source")
		}
		return func(_ *http.Request, body []byte) (string, error) {
			if len(body) == 0 {
				return "", nil // absent, like the body source's empty body
			}
			v, _, err := p.lookup(body)
			return v, err
		}, nil
	default:
		return nil, fmt.Errorf("unknown source")
	}
}

// HeaderValue returns the value of header name in h, normalized by
// normalize when it is not nil, and false when the header is repeated with
// values that differ (once normalized): the request is then ambiguous, since
// the gateway, a signature check and the application may each read another
// line. An absent header is "", true.
func HeaderValue(h http.Header, name string, normalize func(string) string) (string, bool) {
	vs := h.Values(name)
	if len(vs) == 0 {
		return "", true
	}
	if normalize == nil {
		normalize = func(v string) string { return v }
	}
	v := normalize(vs[0])
	for _, o := range vs[1:] {
		if normalize(o) != v {
			return "", false
		}
	}
	return v, true
}

// sfStringValue is the string the sf-string v holds, or v when it is not
// one (see unquoteSFString).
func sfStringValue(v string) string {
	if u, ok := unquoteSFString(v); ok {
		return u
	}
	return v
}

// unquoteSFString returns the string an RFC 8941 sf-string holds ("k-1"
// holds k-1; \" and \\ are escapes), and false when v is not one.
func unquoteSFString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	in := v[1 : len(v)-1]
	if !strings.ContainsAny(in, `"\`) {
		for i := 0; i < len(in); i++ {
			if in[i] < 0x20 || in[i] > 0x7e {
				return "", false
			}
		}
		return in, true
	}
	var b strings.Builder
	for i := 0; i < len(in); i++ {
		c := in[i]
		switch {
		case c == '\\':
			i++
			if i == len(in) || in[i] != '"' && in[i] != '\\' {
				return "", false
			}
			b.WriteByte(in[i])
		case c == '"', c < 0x20, c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// validHeaderName reports whether name is a non-empty RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
