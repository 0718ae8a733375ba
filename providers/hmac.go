package providers

import (
	"crypto/ecdsa"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"hash"
	"io"
	"net/http"
	"strings"
	"time"
)

// Defaults of GenericSignature's zero-valued fields.
const (
	defaultGenericHeader   = "X-Signature"
	defaultGenericTemplate = "{body}"
)

// Validate checks a generic signature configuration. Its errors name the
// field as written in a route's YAML ("signature.algorithm: unknown algorithm
// \"md5\" (want sha1, sha256, sha512 or ecdsa-sha256)"), so a config loader
// can prefix them with the route.
func (s GenericSignature) Validate() error {
	_, err := newGenericVerifier(s, nil, clock{})
	return err
}

// genericVerifier checks an HMAC, or an ECDSA signature, over a templated
// content, carried hex or base64 encoded in one header after an optional
// prefix, or in the items of a structured header (see
// GenericSignature.SignatureField).
type genericVerifier struct {
	header string
	hash   func() hash.Hash
	// size is the decoded signature's length: the HMAC's, or 0 for an
	// ECDSA signature (ASN.1 DER, of varying length up to maxECDSASig).
	size      int
	ecdsaKeys []*ecdsa.PublicKey // ecdsa-sha256: the secrets, parsed
	base64    bool
	prefix    string
	tsHeader  string
	sigField  string // "": the header is one signature
	tsField   string
	rfc3339   bool // the timestamp is RFC 3339, not Unix seconds
	separator string
	template  []templatePart
	secrets   [][]byte
	clock     clock
	needsTime bool
}

// maxECDSASig bounds an ECDSA signature's DER encoding: P-521's takes at
// most 139 bytes.
const maxECDSASig = 144

// maxECDSAItems bounds the ECDSA signatures of one structured header that
// are checked, each costing a verification per key: two cover a rotation.
const maxECDSAItems = 2

// maxSignatureItems bounds the signature items of one structured header
// that are compared: a sender lists one per secret it holds (two during a
// rotation). Later ones are ignored.
const maxSignatureItems = 8

var _ Verifier = (*genericVerifier)(nil)

// templatePart is a literal, or a placeholder: {body}, {timestamp} or
// {header:NAME}.
type templatePart struct {
	kind    byte // 'l' literal, 'b' body, 't' timestamp, 'h' header
	literal string
}

func newGenericVerifier(s GenericSignature, secrets []string, c clock) (*genericVerifier, error) {
	v := &genericVerifier{
		header:    s.Header,
		prefix:    s.Prefix,
		tsHeader:  s.TimestampHeader,
		sigField:  s.SignatureField,
		tsField:   s.TimestampField,
		separator: s.Separator,
		secrets:   secretBytes(secrets),
		rfc3339:   strings.EqualFold(s.TimestampFormat, "rfc3339"),
		clock:     c,
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
	if err := v.checkFields(); err != nil {
		return nil, err
	}
	switch strings.ToLower(s.TimestampFormat) {
	case "", "unix", "rfc3339":
		if s.TimestampFormat != "" && v.tsHeader == "" && v.tsField == "" {
			return nil, fmt.Errorf("signature.timestamp_format: needs signature.timestamp_header (or timestamp_field)")
		}
	default:
		return nil, fmt.Errorf("signature.timestamp_format: unknown format %q (want unix or rfc3339)", s.TimestampFormat)
	}
	switch strings.ToLower(s.Algorithm) {
	case "", "sha256":
		v.hash, v.size = sha256.New, sha256.Size
	case "sha1":
		v.hash, v.size = sha1.New, sha1.Size
	case "sha512":
		v.hash, v.size = sha512.New, sha512.Size
	case ECDSASHA256:
		v.hash, v.secrets = sha256.New, nil
		for i, k := range secrets {
			key, err := parseECDSAKey(k)
			if err != nil {
				return nil, fmt.Errorf("secrets[%d]: %w", i, err)
			}
			v.ecdsaKeys = append(v.ecdsaKeys, key)
		}
	default:
		return nil, fmt.Errorf("signature.algorithm: unknown algorithm %q (want sha1, sha256, sha512 or ecdsa-sha256)", s.Algorithm)
	}
	if v.ecdsaKeys == nil {
		// A sender's public verification key (SendGrid's) taken for an
		// HMAC secret: whoever reads it, and anyone may, could sign.
		for i, k := range secrets {
			if _, err := parseECDSAKey(k); err == nil {
				return nil, fmt.Errorf("secrets[%d]: is an ECDSA public key, which anyone may hold: as an HMAC secret it would let anyone sign; set signature.algorithm: ecdsa-sha256", i)
			}
		}
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
	if v.needsTime && v.tsHeader == "" && v.tsField == "" {
		return nil, fmt.Errorf("signature.template: {timestamp} needs signature.timestamp_header (or timestamp_field)")
	}
	if v.tsField != "" && !v.needsTime {
		// As for timestamp_header: an unsigned timestamp stops no replay.
		return nil, fmt.Errorf("signature.timestamp_field: %s is not signed: put {timestamp} in signature.template", v.tsField)
	}
	if v.tsHeader != "" && !signsTS {
		// A tolerance checked on a header the signature does not cover
		// stops nothing: a replay just sends a fresh one.
		return nil, fmt.Errorf("signature.timestamp_header: %s is not signed: put {timestamp} (or {header:%s}) in signature.template", v.tsHeader, v.tsHeader)
	}
	v.template = parts
	return v, nil
}

// checkFields checks the structured-header fields (see
// GenericSignature.SignatureField) and sets the default separator.
func (v *genericVerifier) checkFields() error {
	if v.sigField == "" {
		for _, f := range []struct{ name, val string }{{"timestamp_field", v.tsField}, {"separator", v.separator}} {
			if f.val != "" {
				return fmt.Errorf("signature.%s: needs signature.signature_field (the header's items are read only then)", f.name)
			}
		}
		return nil
	}
	switch v.separator {
	case "":
		v.separator = ","
	case ",", ";":
	default:
		return fmt.Errorf("signature.separator: invalid separator %q (want \",\" or \";\")", v.separator)
	}
	for _, f := range []struct{ name, val string }{{"signature_field", v.sigField}, {"timestamp_field", v.tsField}} {
		if f.val != "" && !isItemKey(f.val) {
			return fmt.Errorf("signature.%s: invalid item key %q (want letters, digits, - or _)", f.name, f.val)
		}
	}
	switch {
	case v.tsField == v.sigField:
		return fmt.Errorf("signature.timestamp_field: %q is also signature_field", v.tsField)
	case v.prefix != "":
		return fmt.Errorf("signature.prefix: not used with signature_field, whose key %q= marks each signature", v.sigField)
	case v.tsField != "" && v.tsHeader != "":
		return fmt.Errorf("signature.timestamp_header: set timestamp_header or timestamp_field, not both")
	}
	return nil
}

// isItemKey reports whether k may name an item of a structured signature
// header: letters, digits, '-' and '_'.
func isItemKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
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
	h, err := signedHeader(r, v.header)
	if err != nil {
		return err
	}
	for _, p := range v.template {
		if p.kind == 'h' {
			if _, err := signedHeader(r, p.literal); err != nil {
				return err
			}
		}
	}
	if h == "" {
		return fmt.Errorf("%w: missing %s header", ErrNoSignature, v.header)
	}
	var (
		sigs   [][]byte
		tsText string
		ts     int64
		ok     bool
	)
	if v.sigField != "" {
		var err error
		if sigs, tsText, err = v.parseItems(h); err != nil {
			return fmt.Errorf("%w: %s header: %w", ErrBadSignature, v.header, err)
		}
	} else {
		enc, ok := strings.CutPrefix(h, v.prefix)
		if !ok {
			return fmt.Errorf("%w: %s header lacks the configured prefix", ErrBadSignature, v.header)
		}
		got, err := v.decode(enc)
		if err != nil || !v.sizeOK(len(got)) {
			return fmt.Errorf("%w: %s header does not hold an encoded signature of the configured size", ErrBadSignature, v.header)
		}
		sigs = [][]byte{got}
	}
	switch {
	case v.tsHeader != "":
		if tsText, err = signedHeader(r, v.tsHeader); err != nil {
			return err
		}
		if ts, ok = v.parseTimestamp(tsText); !ok {
			return fmt.Errorf("%w: missing or malformed %s header", ErrBadSignature, v.tsHeader)
		}
	case v.tsField != "":
		if ts, ok = v.parseTimestamp(tsText); !ok {
			return fmt.Errorf("%w: %s header: missing or malformed %s= item", ErrBadSignature, v.header, v.tsField)
		}
	}
	timed := v.tsHeader != "" || v.tsField != ""
	if timed && v.ecdsaKeys != nil {
		// An ECDSA check costs tens of µs a key, an HMAC's well under one:
		// a stale delivery is refused before it is paid for, the answer
		// being the same 401 either way.
		if err := v.clock.check(ts); err != nil {
			return err
		}
	}
	if v.matches(r, body, tsText, sigs) {
		if timed {
			return v.clock.check(ts)
		}
		return nil
	}
	return fmt.Errorf("%w: %s does not match", ErrBadSignature, v.header)
}

// matches reports whether one of sigs signs r's content (v.template) under
// one of v's secrets: an HMAC compared in constant time, or an ECDSA
// signature checked with each verification key.
func (v *genericVerifier) matches(r *http.Request, body []byte, tsText string, sigs [][]byte) bool {
	if v.ecdsaKeys != nil {
		h := v.hash()
		v.writeContent(h, r, body, tsText)
		digest := h.Sum(nil)
		for _, key := range v.ecdsaKeys {
			for _, got := range sigs {
				if ecdsa.VerifyASN1(key, digest, got) {
					return true
				}
			}
		}
		return false
	}
	for _, key := range v.secrets {
		m := hmac.New(v.hash, key)
		v.writeContent(m, r, body, tsText)
		want := m.Sum(nil)
		for _, got := range sigs {
			if hmac.Equal(got, want) {
				return true
			}
		}
	}
	return false
}

// writeContent writes the signed content, v.template filled in, to w.
func (v *genericVerifier) writeContent(w io.Writer, r *http.Request, body []byte, tsText string) {
	for _, p := range v.template {
		switch p.kind {
		case 'l':
			io.WriteString(w, p.literal)
		case 'b':
			w.Write(body)
		case 't':
			io.WriteString(w, tsText)
		case 'h':
			io.WriteString(w, r.Header.Get(p.literal))
		}
	}
}

// sizeOK reports whether a decoded signature of n bytes may be one of v's:
// an HMAC's exact size, or an ECDSA signature's DER encoding.
func (v *genericVerifier) sizeOK(n int) bool {
	if v.size == 0 {
		return 0 < n && n <= maxECDSASig
	}
	return n == v.size
}

// parseECDSAKey reads an ECDSA public key: the base64 of its DER
// (SubjectPublicKeyInfo) encoding, as SendGrid shows its verification
// key, or a PEM "PUBLIC KEY" block. White space around either is skipped.
// The error does not show the key.
func parseECDSAKey(s string) (*ecdsa.PublicKey, error) {
	s = strings.TrimSpace(s)
	var der []byte
	if strings.HasPrefix(s, "-----BEGIN") {
		b, _ := pem.Decode([]byte(s))
		if b == nil || b.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("not a PEM PUBLIC KEY block (want an ECDSA public key: base64 of its DER encoding, or PEM)")
		}
		der = b.Bytes
	} else {
		var err error
		if der, err = base64.StdEncoding.DecodeString(s); err != nil {
			return nil, fmt.Errorf("not base64 (want an ECDSA public key: base64 of its DER encoding, as SendGrid's verification key, or PEM)")
		}
	}
	key, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("not a public key (want an ECDSA public key: base64 of its DER encoding, as SendGrid's verification key, or PEM)")
	}
	ek, ok := key.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an ECDSA public key", key)
	}
	return ek, nil
}

// maxRFC3339 bounds an RFC 3339 timestamp's length: nanoseconds and a
// numeric offset take 35 bytes.
const maxRFC3339 = 40

// parseTimestamp reads the signed timestamp as Unix seconds, in v's
// format. An RFC 3339 one must parse whole and strictly: the header's
// exact text is what the signature covers, and a scheme that signs an ID
// and a timestamp with nothing between them (Twitch) lets whoever
// captured a delivery move characters from one to the other under the
// same signature, a new key each time, unless each must keep its form.
func (v *genericVerifier) parseTimestamp(s string) (int64, bool) {
	if !v.rfc3339 {
		return parseUnix(s)
	}
	if len(s) > maxRFC3339 {
		return 0, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, false
	}
	return t.Unix(), true
}

// parseItems reads a structured signature header: items separated by
// v.separator, each "key=value" (spaces around either trimmed). It returns
// the decoded values of the first maxSignatureItems (maxECDSAItems for an
// ECDSA scheme) items keyed
// v.sigField that decode to a signature of the configured size (others could
// never match, and are skipped, as stripe-go does), and the value of the
// v.tsField item, which must appear exactly once when v.tsField is set.
func (v *genericVerifier) parseItems(h string) (sigs [][]byte, ts string, err error) {
	seenSig, seenTS := false, false
	for item := range strings.SplitSeq(h, v.separator) {
		k, val, ok := strings.Cut(item, "=")
		if !ok {
			continue
		}
		switch k = strings.TrimSpace(k); {
		case k == v.sigField:
			seenSig = true
			if len(sigs) == maxSignatureItems || v.size == 0 && len(sigs) == maxECDSAItems {
				continue
			}
			if b, err := v.decode(strings.TrimSpace(val)); err == nil && v.sizeOK(len(b)) {
				sigs = append(sigs, b)
			}
		case v.tsField != "" && k == v.tsField:
			if seenTS {
				return nil, "", fmt.Errorf("more than one %s= item", v.tsField)
			}
			seenTS, ts = true, strings.TrimSpace(val)
		}
	}
	switch {
	case !seenSig:
		return nil, "", fmt.Errorf("no %s= item", v.sigField)
	case len(sigs) == 0:
		return nil, "", fmt.Errorf("no %s= item holds an encoded signature of the configured size", v.sigField)
	}
	return sigs, ts, nil
}

// decode reads a hex (either case) or base64 (standard alphabet, padding
// optional) signature.
func (v *genericVerifier) decode(s string) ([]byte, error) {
	if !v.base64 {
		return hex.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
}
