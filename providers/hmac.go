package providers

import (
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash"
	"net/http"
	"strings"
)

// Defaults of GenericSignature's zero-valued fields.
const (
	defaultGenericHeader   = "X-Signature"
	defaultGenericTemplate = "{body}"
)

// Validate checks a generic signature configuration. Its errors name the
// field as written in a route's YAML ("signature.algorithm: unknown algorithm
// \"md5\" (want sha1, sha256 or sha512)"), so a config loader can prefix them
// with the route.
func (s GenericSignature) Validate() error {
	_, err := newGenericVerifier(s, nil, clock{})
	return err
}

// genericVerifier checks an HMAC over a templated content, carried hex or
// base64 encoded in one header after an optional prefix.
type genericVerifier struct {
	header    string
	hash      func() hash.Hash
	size      int
	base64    bool
	prefix    string
	tsHeader  string
	template  []templatePart
	secrets   [][]byte
	clock     clock
	needsTime bool
}

var _ Verifier = (*genericVerifier)(nil)

// templatePart is a literal, or a placeholder: {body}, {timestamp} or
// {header:NAME}.
type templatePart struct {
	kind    byte // 'l' literal, 'b' body, 't' timestamp, 'h' header
	literal string
}

func newGenericVerifier(s GenericSignature, secrets []string, c clock) (*genericVerifier, error) {
	v := &genericVerifier{
		header:   s.Header,
		prefix:   s.Prefix,
		tsHeader: s.TimestampHeader,
		secrets:  secretBytes(secrets),
		clock:    c,
	}
	if v.header == "" {
		v.header = defaultGenericHeader
	}
	if !validHeaderName(v.header) {
		return nil, fmt.Errorf("signature.header: invalid header name %q", v.header)
	}
	if v.tsHeader != "" && !validHeaderName(v.tsHeader) {
		return nil, fmt.Errorf("signature.timestamp_header: invalid header name %q", v.tsHeader)
	}
	switch strings.ToLower(s.Algorithm) {
	case "", "sha256":
		v.hash, v.size = sha256.New, sha256.Size
	case "sha1":
		v.hash, v.size = sha1.New, sha1.Size
	case "sha512":
		v.hash, v.size = sha512.New, sha512.Size
	default:
		return nil, fmt.Errorf("signature.algorithm: unknown algorithm %q (want sha1, sha256 or sha512)", s.Algorithm)
	}
	switch strings.ToLower(s.Encoding) {
	case "", "hex":
	case "base64":
		v.base64 = true
	default:
		return nil, fmt.Errorf("signature.encoding: unknown encoding %q (want hex or base64)", s.Encoding)
	}
	tmpl := s.Template
	if tmpl == "" {
		tmpl = defaultGenericTemplate
	}
	parts, err := parseTemplate(tmpl)
	if err != nil {
		return nil, fmt.Errorf("signature.template: %w", err)
	}
	signsTS := false // the template covers the timestamp header's value
	for _, p := range parts {
		switch {
		case p.kind == 't':
			v.needsTime, signsTS = true, true
		case p.kind == 'h' && v.tsHeader != "" && p.literal == http.CanonicalHeaderKey(v.tsHeader):
			signsTS = true
		}
	}
	if v.needsTime && v.tsHeader == "" {
		return nil, fmt.Errorf("signature.template: {timestamp} needs signature.timestamp_header")
	}
	if v.tsHeader != "" && !signsTS {
		// A tolerance checked on a header the signature does not cover
		// stops nothing: a replay just sends a fresh one.
		return nil, fmt.Errorf("signature.timestamp_header: %s is not signed: put {timestamp} (or {header:%s}) in signature.template", v.tsHeader, v.tsHeader)
	}
	v.template = parts
	return v, nil
}

// parseTemplate splits a signed-content template into parts. Every '{' must
// open {body}, {timestamp} or {header:NAME}.
func parseTemplate(t string) ([]templatePart, error) {
	var parts []templatePart
	for t != "" {
		i := strings.IndexByte(t, '{')
		if i < 0 {
			parts = append(parts, templatePart{kind: 'l', literal: t})
			break
		}
		if i > 0 {
			parts = append(parts, templatePart{kind: 'l', literal: t[:i]})
		}
		j := strings.IndexByte(t[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("unclosed '{' in template")
		}
		name := t[i+1 : i+j]
		switch {
		case name == "body":
			parts = append(parts, templatePart{kind: 'b'})
		case name == "timestamp":
			parts = append(parts, templatePart{kind: 't'})
		case strings.HasPrefix(name, "header:") && validHeaderName(name[len("header:"):]):
			parts = append(parts, templatePart{kind: 'h', literal: http.CanonicalHeaderKey(name[len("header:"):])})
		default:
			return nil, fmt.Errorf("unknown placeholder {%s} (want {body}, {timestamp} or {header:NAME})", name)
		}
		t = t[i+j+1:]
	}
	return parts, nil
}

// Verify implements Verifier.
func (v *genericVerifier) Verify(r *http.Request, body []byte) error {
	h := r.Header.Get(v.header)
	if h == "" {
		return fmt.Errorf("%w: missing %s header", ErrNoSignature, v.header)
	}
	enc, ok := strings.CutPrefix(h, v.prefix)
	if !ok {
		return fmt.Errorf("%w: %s header lacks the configured prefix", ErrBadSignature, v.header)
	}
	got, err := v.decode(enc)
	if err != nil || len(got) != v.size {
		return fmt.Errorf("%w: %s header does not hold an encoded HMAC of the configured size", ErrBadSignature, v.header)
	}
	var (
		tsText string
		ts     int64
	)
	if v.tsHeader != "" {
		tsText = r.Header.Get(v.tsHeader)
		if ts, ok = parseUnix(tsText); !ok {
			return fmt.Errorf("%w: missing or malformed %s header", ErrBadSignature, v.tsHeader)
		}
	}
	for _, key := range v.secrets {
		m := hmac.New(v.hash, key)
		for _, p := range v.template {
			switch p.kind {
			case 'l':
				m.Write([]byte(p.literal))
			case 'b':
				m.Write(body)
			case 't':
				m.Write([]byte(tsText))
			case 'h':
				m.Write([]byte(r.Header.Get(p.literal)))
			}
		}
		if hmac.Equal(got, m.Sum(nil)) {
			if v.tsHeader != "" {
				return v.clock.check(ts)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: %s does not match", ErrBadSignature, v.header)
}

// decode reads a hex (either case) or base64 (standard alphabet, padding
// optional) signature.
func (v *genericVerifier) decode(s string) ([]byte, error) {
	if !v.base64 {
		return hex.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
}
