package providers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"hash"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func genericMAC(h func() hash.Hash, secret, content string) []byte {
	m := hmac.New(h, []byte(secret))
	m.Write([]byte(content))
	return m.Sum(nil)
}

func TestGenericVerify(t *testing.T) {
	const body = `{"id":"evt_1"}`
	rfc3339Sig := GenericSignature{TimestampHeader: "X-Ts", TimestampFormat: "RFC3339", Template: "{timestamp}.{body}"}
	sha256Hex := hex.EncodeToString(genericMAC(sha256.New, "s", body))
	tests := []struct {
		name    string
		sig     GenericSignature
		secrets []string
		now     int64
		headers map[string]string
		body    string
		want    error
	}{
		{"defaults: X-Signature, sha256, hex", GenericSignature{}, []string{"s"}, 0,
			map[string]string{"X-Signature": sha256Hex}, body, nil},
		{"RFC 4231 test case 2 (sha256)", GenericSignature{Header: "Sig"}, []string{"Jefe"}, 0,
			map[string]string{"Sig": "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"}, "what do ya want for nothing?", nil},
		{"RFC 4231 test case 2 (sha512)", GenericSignature{Header: "Sig", Algorithm: "sha512"}, []string{"Jefe"}, 0,
			map[string]string{"Sig": "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"}, "what do ya want for nothing?", nil},
		{"RFC 2202 test case 2 (sha1)", GenericSignature{Header: "Sig", Algorithm: "sha1"}, []string{"Jefe"}, 0,
			map[string]string{"Sig": "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"}, "what do ya want for nothing?", nil},
		{"base64 with prefix", GenericSignature{Header: "X-Hook-Sig", Algorithm: "sha512", Encoding: "base64", Prefix: "sha512="}, []string{"s"}, 0,
			map[string]string{"X-Hook-Sig": "sha512=" + base64.StdEncoding.EncodeToString(genericMAC(sha512.New, "s", body))}, body, nil},
		{"base64 without padding", GenericSignature{Encoding: "base64", Algorithm: "sha1"}, []string{"s"}, 0,
			map[string]string{"X-Signature": base64.RawStdEncoding.EncodeToString(genericMAC(sha1.New, "s", body))}, body, nil},
		{"template with timestamp and header", GenericSignature{TimestampHeader: "X-Ts", Template: "{timestamp}:{header:X-Id}:{body}"}, []string{"s"}, 1000,
			map[string]string{"X-Ts": "990", "X-Id": "abc", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "990:abc:"+body))}, body, nil},
		{"template header changed", GenericSignature{TimestampHeader: "X-Ts", Template: "{timestamp}:{header:X-Id}:{body}"}, []string{"s"}, 1000,
			map[string]string{"X-Ts": "990", "X-Id": "abd", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "990:abc:"+body))}, body, ErrBadSignature},
		{"stale timestamp", GenericSignature{TimestampHeader: "X-Ts", Template: "{timestamp}.{body}"}, []string{"s"}, 1301,
			map[string]string{"X-Ts": "1000", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "1000."+body))}, body, ErrStale},
		{"future timestamp", GenericSignature{TimestampHeader: "X-Ts", Template: "{timestamp}.{body}"}, []string{"s"}, 699,
			map[string]string{"X-Ts": "1000", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "1000."+body))}, body, ErrStale},
		{"missing timestamp", GenericSignature{TimestampHeader: "X-Ts", Template: "{timestamp}.{body}"}, []string{"s"}, 1000,
			map[string]string{"X-Signature": sha256Hex}, body, ErrBadSignature},
		// An ID and a timestamp signed with nothing between them: the ID's
		// trailing zero moved into the timestamp signs the same bytes,
		// under another key. A Unix timestamp has no leading zero.
		{"id and timestamp adjacent", GenericSignature{TimestampHeader: "X-Ts", Template: "{header:X-Id}{timestamp}{body}"}, []string{"s"}, 1000,
			map[string]string{"X-Id": "msg-880", "X-Ts": "990", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "msg-880990"+body))}, body, nil},
		{"id's trailing zero moved into the timestamp", GenericSignature{TimestampHeader: "X-Ts", Template: "{header:X-Id}{timestamp}{body}"}, []string{"s"}, 1000,
			map[string]string{"X-Id": "msg-88", "X-Ts": "0990", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "msg-880990"+body))}, body, ErrBadSignature},
		// RFC 3339 timestamps: 1000 is 1970-01-01T00:16:40Z.
		{"rfc3339 timestamp", rfc3339Sig, []string{"s"}, 1001,
			map[string]string{"X-Ts": "1970-01-01T00:16:40.634234626Z", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "1970-01-01T00:16:40.634234626Z."+body))}, body, nil},
		{"rfc3339 timestamp with an offset", rfc3339Sig, []string{"s"}, 1001,
			map[string]string{"X-Ts": "1970-01-01T01:16:40+01:00", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "1970-01-01T01:16:40+01:00."+body))}, body, nil},
		{"stale rfc3339 timestamp", rfc3339Sig, []string{"s"}, 1301,
			map[string]string{"X-Ts": "1970-01-01T00:16:40Z", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "1970-01-01T00:16:40Z."+body))}, body, ErrStale},
		{"future rfc3339 timestamp", rfc3339Sig, []string{"s"}, 699,
			map[string]string{"X-Ts": "1970-01-01T00:16:40Z", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "1970-01-01T00:16:40Z."+body))}, body, ErrStale},
		{"unix seconds where rfc3339 is configured", rfc3339Sig, []string{"s"}, 1000,
			map[string]string{"X-Ts": "1000", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "1000."+body))}, body, ErrBadSignature},
		{"rfc3339 timestamp that lost its first character", rfc3339Sig, []string{"s"}, 1000,
			map[string]string{"X-Ts": "970-01-01T00:16:40Z", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "970-01-01T00:16:40Z."+body))}, body, ErrBadSignature},
		{"rfc3339 timestamp that gained a character", rfc3339Sig, []string{"s"}, 1000,
			map[string]string{"X-Ts": "b1970-01-01T00:16:40Z", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "b1970-01-01T00:16:40Z."+body))}, body, ErrBadSignature},
		{"rfc3339 timestamp with a space for T", rfc3339Sig, []string{"s"}, 1000,
			map[string]string{"X-Ts": "1970-01-01 00:16:40Z", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "1970-01-01 00:16:40Z."+body))}, body, ErrBadSignature},
		{"unix timestamp in rfc3339", GenericSignature{TimestampHeader: "X-Ts", Template: "{timestamp}.{body}"}, []string{"s"}, 1000,
			map[string]string{"X-Ts": "1970-01-01T00:16:40Z", "X-Signature": hex.EncodeToString(genericMAC(sha256.New, "s", "1970-01-01T00:16:40Z."+body))}, body, ErrBadSignature},
		{"rotation", GenericSignature{}, []string{"old", "s"}, 0,
			map[string]string{"X-Signature": sha256Hex}, body, nil},
		{"uppercase hex", GenericSignature{}, []string{"s"}, 0,
			map[string]string{"X-Signature": strings.ToUpper(sha256Hex)}, body, nil},
		{"wrong secret", GenericSignature{}, []string{"x"}, 0,
			map[string]string{"X-Signature": sha256Hex}, body, ErrBadSignature},
		{"tampered body", GenericSignature{}, []string{"s"}, 0,
			map[string]string{"X-Signature": sha256Hex}, body + " ", ErrBadSignature},
		{"missing header", GenericSignature{}, []string{"s"}, 0, nil, body, ErrNoSignature},
		{"missing prefix", GenericSignature{Prefix: "sha256="}, []string{"s"}, 0,
			map[string]string{"X-Signature": sha256Hex}, body, ErrBadSignature},
		{"wrong length for algorithm", GenericSignature{Algorithm: "sha512"}, []string{"s"}, 0,
			map[string]string{"X-Signature": sha256Hex}, body, ErrBadSignature},
		{"not hex", GenericSignature{}, []string{"s"}, 0,
			map[string]string{"X-Signature": "nothex"}, body, ErrBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Keys: []string{"json:id"}, Secrets: tt.secrets, Signature: tt.sig, Now: fixedClock(tt.now)})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			err = p.Verifier.Verify(newRequest(tt.headers), []byte(tt.body))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
		})
	}
}

// TestGenericStructuredHeader: with signature_field, the header is a list
// of key=value items (Paddle's "ts=…;h1=…", Calendly's "t=…,v1=…"): any
// signature item may match (a rotation lists two), the timestamp item is
// {timestamp} and is checked against the tolerance, and a malformed list
// is refused.
func TestGenericStructuredHeader(t *testing.T) {
	const body = `{"event_id":"evt_01h"}`
	paddle := GenericSignature{Header: "Paddle-Signature", SignatureField: "h1", TimestampField: "ts", Separator: ";", Template: "{timestamp}:{body}"}
	calendly := GenericSignature{Header: "Calendly-Webhook-Signature", SignatureField: "v1", TimestampField: "t", Template: "{timestamp}.{body}"}
	mac := func(secret, content string) string {
		return hex.EncodeToString(genericMAC(sha256.New, secret, content))
	}
	good := mac("pdl_ntfset_s", "1671552777:"+body)
	tests := []struct {
		name   string
		sig    GenericSignature
		now    int64
		header string
		body   string
		want   error
	}{
		{"paddle", paddle, 1671552780, "ts=1671552777;h1=" + good, body, nil},
		{"paddle, items in another order and spaced", paddle, 1671552780, " h1 = " + good + " ; ts = 1671552777 ", body, nil},
		{"paddle, during a rotation", paddle, 1671552780, "ts=1671552777;h1=" + mac("other", "1671552777:"+body) + ";h1=" + good, body, nil},
		{"paddle, an h1 that is not hex is skipped", paddle, 1671552780, "ts=1671552777;h1=zz;h1=" + good, body, nil},
		{"paddle, tampered body", paddle, 1671552780, "ts=1671552777;h1=" + good, body + " ", ErrBadSignature},
		{"paddle, another timestamp", paddle, 1671552780, "ts=1671552778;h1=" + good, body, ErrBadSignature},
		{"paddle, stale", paddle, 1671552777 + 301, "ts=1671552777;h1=" + good, body, ErrStale},
		{"paddle, no timestamp", paddle, 1671552780, "h1=" + good, body, ErrBadSignature},
		{"paddle, two timestamps", paddle, 1671552780, "ts=1671552777;ts=1671552777;h1=" + good, body, ErrBadSignature},
		{"paddle, no signature", paddle, 1671552780, "ts=1671552777", body, ErrBadSignature},
		{"paddle, no signature of the right size", paddle, 1671552780, "ts=1671552777;h1=abcd", body, ErrBadSignature},
		{"paddle, the wrong separator", paddle, 1671552780, "ts=1671552777,h1=" + good, body, ErrBadSignature},
		{"paddle, items of the wrong size do not count toward the bound", paddle, 1671552780, "ts=1671552777" + strings.Repeat(";h1=abcd", maxSignatureItems) + ";h1=" + good, body, nil},
		{"paddle, past the bound of signature items", paddle, 1671552780, "ts=1671552777" + strings.Repeat(";h1="+mac("x", "y"), maxSignatureItems) + ";h1=" + good, body, ErrBadSignature},
		{"paddle, no header", paddle, 1671552780, "", body, ErrNoSignature},
		{"calendly", calendly, 1492774580, "t=1492774577,v1=" + mac("pdl_ntfset_s", "1492774577."+body), body, nil},
		{"without a timestamp field", GenericSignature{SignatureField: "sig"}, 0, "kid=1,sig=" + mac("pdl_ntfset_s", body), body, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Keys: []string{"json:event_id"}, Secrets: []string{"pdl_ntfset_s"}, Signature: tt.sig, Now: fixedClock(tt.now)})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			headers := map[string]string{}
			if tt.header != "" {
				name := tt.sig.Header
				if name == "" {
					name = "X-Signature"
				}
				headers[name] = tt.header
			}
			err = p.Verifier.Verify(newRequest(headers), []byte(tt.body))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestGenericSignatureValidate(t *testing.T) {
	tests := []struct {
		sig  GenericSignature
		want string // "" means valid
	}{
		{GenericSignature{}, ""},
		{GenericSignature{Algorithm: "SHA512", Encoding: "Base64"}, ""},
		{GenericSignature{Algorithm: "md5"}, `signature.algorithm: unknown algorithm "md5" (want sha1, sha256, sha512 or ecdsa-sha256)`},
		{GenericSignature{Algorithm: "ECDSA-SHA256", Encoding: "base64", TimestampHeader: "X-Ts", Template: "{timestamp}{body}"}, ""},
		{GenericSignature{Encoding: "base32"}, `signature.encoding: unknown encoding "base32" (want hex or base64)`},
		{GenericSignature{Header: "Bad Header"}, `signature.header: invalid header name "Bad Header"`},
		{GenericSignature{TimestampHeader: "a:b"}, `signature.timestamp_header: invalid header name "a:b"`},
		{GenericSignature{Template: "{timestamp}.{body}"}, "signature.template: {timestamp} needs signature.timestamp_header (or timestamp_field)"},
		{GenericSignature{Template: "{bodyx}"}, "signature.template: unknown placeholder {bodyx} (want {body}, {timestamp} or {header:NAME})"},
		{GenericSignature{Template: "{header:}"}, "signature.template: unknown placeholder {header:} (want {body}, {timestamp} or {header:NAME})"},
		{GenericSignature{Template: "{body"}, "signature.template: unclosed '{' in template"},
		{GenericSignature{Template: "v0:{header:X-Ts}:{body}"}, ""},
		{GenericSignature{TimestampHeader: "X-Ts"}, "signature.timestamp_header: X-Ts is not signed: put {timestamp} (or {header:X-Ts}) in signature.template"},
		{GenericSignature{TimestampHeader: "X-Ts", Template: "{header:X-Other}.{body}"}, "signature.timestamp_header: X-Ts is not signed: put {timestamp} (or {header:X-Ts}) in signature.template"},
		{GenericSignature{TimestampHeader: "X-Ts", Template: "{timestamp}.{body}"}, ""},
		{GenericSignature{TimestampHeader: "x-ts", Template: "v0:{header:X-Ts}:{body}"}, ""},
		{GenericSignature{SignatureField: "h1", TimestampField: "ts", Separator: ";", Template: "{timestamp}:{body}"}, ""},
		{GenericSignature{SignatureField: "v1"}, ""},
		{GenericSignature{TimestampField: "ts", Template: "{timestamp}:{body}"}, "signature.timestamp_field: needs signature.signature_field (the header's items are read only then)"},
		{GenericSignature{Separator: ";"}, "signature.separator: needs signature.signature_field (the header's items are read only then)"},
		{GenericSignature{TimestampFormat: "rfc3339"}, "signature.timestamp_format: needs signature.timestamp_header (or timestamp_field)"},
		{GenericSignature{TimestampHeader: "X-Ts", TimestampFormat: "iso8601", Template: "{timestamp}.{body}"}, `signature.timestamp_format: unknown format "iso8601" (want unix or rfc3339)`},
		{GenericSignature{SignatureField: "t", TimestampField: "ts", TimestampFormat: "unix", Template: "{timestamp}.{body}"}, ""},
		{GenericSignature{SignatureField: "h1", Separator: "|"}, `signature.separator: invalid separator "|" (want "," or ";")`},
		{GenericSignature{SignatureField: "h 1"}, `signature.signature_field: invalid item key "h 1" (want letters, digits, - or _)`},
		{GenericSignature{SignatureField: "h1", TimestampField: "h1", Template: "{timestamp}:{body}"}, `signature.timestamp_field: "h1" is also signature_field`},
		{GenericSignature{SignatureField: "h1", Prefix: "h1="}, `signature.prefix: not used with signature_field, whose key "h1"= marks each signature`},
		{GenericSignature{SignatureField: "h1", TimestampField: "ts", TimestampHeader: "X-Ts", Template: "{timestamp}:{body}"}, "signature.timestamp_header: set timestamp_header or timestamp_field, not both"},
		{GenericSignature{SignatureField: "h1", TimestampField: "ts"}, "signature.timestamp_field: ts is not signed: put {timestamp} in signature.template"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			err := tt.sig.Validate()
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Validate(%+v): got %q, want %q", tt.sig, got, tt.want)
			}
		})
	}
}

// FuzzGenericSignature checks that generic header, prefix, timestamp and
// template handling never panic and only ever return sentinels.
func FuzzGenericSignature(f *testing.F) {
	f.Add("sha256=00", "1000", "{timestamp}.{body}")
	f.Add("", "", "{body}")
	f.Add("sha256=", "abc", "{header:X-Ts}{body}{")
	f.Add("sha256=AAAA====", "99999999999999", "}{")
	f.Fuzz(func(t *testing.T, sig, ts, template string) {
		p, err := New(Config{Keys: []string{"body"}, Secrets: []string{"s"}, Now: fixedClock(1000), Signature: GenericSignature{
			Prefix: "sha256=", Encoding: "base64", TimestampHeader: "X-Ts", Template: template,
		}})
		if err != nil {
			return
		}
		err = p.Verifier.Verify(newRequest(map[string]string{"X-Signature": sig, "X-Ts": ts}), []byte("{}"))
		if err != nil && !errors.Is(err, ErrNoSignature) && !errors.Is(err, ErrBadSignature) && !errors.Is(err, ErrStale) {
			t.Fatalf("Verify(%q, %q): got %v, want a sentinel", sig, ts, err)
		}
	})
}

// FuzzGenericStructuredHeader: whatever the structured header holds, Verify
// answers without panicking, and accepts only a header holding an h1= item
// whose value is the right HMAC.
func FuzzGenericStructuredHeader(f *testing.F) {
	const body = `{"event_id":"evt_1"}`
	good := hex.EncodeToString(genericMAC(sha256.New, "s", "1000:"+body))
	f.Add("ts=1000;h1=" + good)
	f.Add("ts=1000;ts=1000;h1=" + good)
	f.Add(" h1 = " + good + " ;ts=1000;;=;h1")
	f.Add("ts=99999999999999;h1=zz")
	f.Fuzz(func(t *testing.T, header string) {
		p, err := New(Config{Keys: []string{"body"}, Secrets: []string{"s"},
			Signature: GenericSignature{Header: "Paddle-Signature", SignatureField: "h1", TimestampField: "ts", Separator: ";", Template: "{timestamp}:{body}"},
			Now:       fixedClock(1000)})
		if err != nil {
			t.Fatal(err)
		}
		err = p.Verifier.Verify(newRequest(map[string]string{"Paddle-Signature": header}), []byte(body))
		if err == nil && !strings.Contains(strings.ToLower(header), good) {
			t.Errorf("Verify(%q): got nil, want an error (no h1= item holds the HMAC)", header)
		}
	})
}

// SendGrid's Signed Event Webhook vector (sendgrid/sendgrid-go,
// helpers/eventwebhook/eventwebhook_test.go): ECDSA P-256 over SHA-256 of
// the timestamp followed by the body, base64 DER in a header, verified
// with the base64 DER public key SendGrid shows as the verification key.
const (
	sendgridKey       = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA=="
	sendgridSignature = "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0="
	sendgridTimestamp = "1588788367"
	sendgridBody      = `{"category":"example_payload","event":"test_event","message_id":"message_id"}`
)

// TestGenericECDSA: algorithm ecdsa-sha256 checks a public-key signature
// with the verification keys given as secrets (base64 DER or PEM; any may
// verify), and refuses a tampered body, timestamp or signature, another
// key, and a stale timestamp.
func TestGenericECDSA(t *testing.T) {
	sig := GenericSignature{
		Header: "X-Twilio-Email-Event-Webhook-Signature", Algorithm: "ecdsa-sha256", Encoding: "base64",
		TimestampHeader: "X-Twilio-Email-Event-Webhook-Timestamp", Template: "{timestamp}{body}",
	}
	pemKey := "-----BEGIN PUBLIC KEY-----\n" + sendgridKey + "\n-----END PUBLIC KEY-----\n"
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherDER, err := x509.MarshalPKIXPublicKey(&other.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	otherKey := base64.StdEncoding.EncodeToString(otherDER)
	headers := func(sig, ts string) map[string]string {
		return map[string]string{"X-Twilio-Email-Event-Webhook-Signature": sig, "X-Twilio-Email-Event-Webhook-Timestamp": ts}
	}
	tests := []struct {
		name    string
		secrets []string
		now     int64
		headers map[string]string
		body    string
		want    error
	}{
		{"SendGrid's vector", []string{sendgridKey}, 1588788400, headers(sendgridSignature, sendgridTimestamp), sendgridBody, nil},
		{"the key as PEM", []string{pemKey}, 1588788400, headers(sendgridSignature, sendgridTimestamp), sendgridBody, nil},
		{"the key with a trailing newline", []string{sendgridKey + "\n"}, 1588788400, headers(sendgridSignature, sendgridTimestamp), sendgridBody, nil},
		{"the key with spaces around it", []string{" " + sendgridKey + " "}, 1588788400, headers(sendgridSignature, sendgridTimestamp), sendgridBody, nil},
		{"the PEM key after a blank line", []string{"\n" + pemKey}, 1588788400, headers(sendgridSignature, sendgridTimestamp), sendgridBody, nil},
		{"rotation: the second key verifies", []string{otherKey, sendgridKey}, 1588788400, headers(sendgridSignature, sendgridTimestamp), sendgridBody, nil},
		// The verification key is public: an HMAC keyed with it must never
		// verify, or anyone could sign.
		{"an HMAC keyed with the verification key", []string{sendgridKey}, 1588788400, headers(base64.StdEncoding.EncodeToString(genericMAC(sha256.New, sendgridKey, sendgridTimestamp+sendgridBody)), sendgridTimestamp), sendgridBody, ErrBadSignature},
		{"another key", []string{otherKey}, 1588788400, headers(sendgridSignature, sendgridTimestamp), sendgridBody, ErrBadSignature},
		{"tampered body", []string{sendgridKey}, 1588788400, headers(sendgridSignature, sendgridTimestamp), strings.Replace(sendgridBody, "test_event", "test_evenu", 1), ErrBadSignature},
		{"tampered timestamp", []string{sendgridKey}, 1588788400, headers(sendgridSignature, "1588788368"), sendgridBody, ErrBadSignature},
		{"tampered signature", []string{sendgridKey}, 1588788400, headers(strings.Replace(sendgridSignature, "MEUCIQCt", "MEUCIQCu", 1), sendgridTimestamp), sendgridBody, ErrBadSignature},
		{"not DER", []string{sendgridKey}, 1588788400, headers(base64.StdEncoding.EncodeToString([]byte("not a signature")), sendgridTimestamp), sendgridBody, ErrBadSignature},
		{"too long to be a signature", []string{sendgridKey}, 1588788400, headers(base64.StdEncoding.EncodeToString(make([]byte, maxECDSASig+1)), sendgridTimestamp), sendgridBody, ErrBadSignature},
		{"stale", []string{sendgridKey}, 1588788367 + 301, headers(sendgridSignature, sendgridTimestamp), sendgridBody, ErrStale},
		{"no signature", []string{sendgridKey}, 1588788400, nil, sendgridBody, ErrNoSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Config{Keys: []string{"body"}, Secrets: tt.secrets, Signature: sig, Now: fixedClock(tt.now)})
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			err = p.Verifier.Verify(newRequest(tt.headers), []byte(tt.body))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Errorf("Verify: got %v, want %v", err, tt.want)
			}
		})
	}
}

// TestGenericECDSAKeys: a verification key that is not an ECDSA public key
// fails New, naming the secret and never showing it.
func TestGenericECDSAKeys(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	rsaDER, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, key, want string
	}{
		{"an HMAC secret", "whsec_not-base64!", "secrets[1]: not base64 (want an ECDSA public key: base64 of its DER encoding, as SendGrid's verification key, or PEM)"},
		{"base64 of something else", base64.StdEncoding.EncodeToString([]byte("a shared secret")), "secrets[1]: not a public key (want an ECDSA public key: base64 of its DER encoding, as SendGrid's verification key, or PEM)"},
		{"an RSA key", base64.StdEncoding.EncodeToString(rsaDER), "secrets[1]: a *rsa.PublicKey, not an ECDSA public key"},
		{"a PEM private key", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIEQmZgBEh9DcU9zMl34czK3xov4AYvm9P3r7rNB2dNXtoAoGCCqGSM49\n-----END EC PRIVATE KEY-----\n", "secrets[1]: not a PEM PUBLIC KEY block (want an ECDSA public key: base64 of its DER encoding, or PEM)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(Config{Keys: []string{"body"}, Secrets: []string{sendgridKey, tt.key}, Signature: GenericSignature{Algorithm: "ecdsa-sha256", Encoding: "base64"}})
			if err == nil || err.Error() != tt.want {
				t.Errorf("New: got %v, want %q", err, tt.want)
			}
		})
	}
}

// TestGenericECDSACost: an ECDSA check costs far more than an HMAC, so a
// forgery is refused as cheaply as can be: a stale timestamp before any
// signature is checked (ErrStale for a forged signature too), and of a
// structured header's signature items only the first maxECDSAItems.
func TestGenericECDSACost(t *testing.T) {
	single := GenericSignature{
		Header: "X-Twilio-Email-Event-Webhook-Signature", Algorithm: "ecdsa-sha256", Encoding: "base64",
		TimestampHeader: "X-Twilio-Email-Event-Webhook-Timestamp", Template: "{timestamp}{body}",
	}
	p, err := New(Config{Keys: []string{"body"}, Secrets: []string{sendgridKey}, Signature: single, Now: fixedClock(1588788367 + 301)})
	if err != nil {
		t.Fatal(err)
	}
	forged := base64.StdEncoding.EncodeToString([]byte("0\x06\x02\x01\x01\x02\x01\x01")) // DER of r = s = 1
	err = p.Verifier.Verify(newRequest(map[string]string{"X-Twilio-Email-Event-Webhook-Signature": forged, "X-Twilio-Email-Event-Webhook-Timestamp": sendgridTimestamp}), []byte(sendgridBody))
	if !errors.Is(err, ErrStale) {
		t.Errorf("a forged, stale delivery: got %v, want %v (refused before its signature is checked)", err, ErrStale)
	}

	items := GenericSignature{Header: "Sig", Algorithm: "ecdsa-sha256", Encoding: "base64", SignatureField: "v1", TimestampField: "t", Template: "{timestamp}{body}"}
	p, err = New(Config{Keys: []string{"body"}, Secrets: []string{sendgridKey}, Signature: items, Now: fixedClock(1588788400)})
	if err != nil {
		t.Fatal(err)
	}
	header := func(n int) string { // n forged items, then the genuine one
		h := "t=" + sendgridTimestamp
		for range n {
			h += ",v1=" + forged
		}
		return h + ",v1=" + sendgridSignature
	}
	for n, want := range map[int]error{0: nil, maxECDSAItems - 1: nil, maxECDSAItems: ErrBadSignature} {
		err := p.Verifier.Verify(newRequest(map[string]string{"Sig": header(n)}), []byte(sendgridBody))
		if !errors.Is(err, want) || (want == nil) != (err == nil) {
			t.Errorf("the genuine signature after %d forged items: got %v, want %v", n, err, want)
		}
	}
}

// TestHMACSecretThatIsAPublicKey: a sender's public key (SendGrid's
// verification key, which anyone may read) given as an HMAC secret, the
// algorithm left out, would let anyone sign: New refuses it, naming the
// secret and the fix.
func TestHMACSecretThatIsAPublicKey(t *testing.T) {
	pemKey := "-----BEGIN PUBLIC KEY-----\n" + sendgridKey + "\n-----END PUBLIC KEY-----\n"
	for _, alg := range []string{"", "sha1", "sha256", "sha512"} {
		for _, key := range []string{sendgridKey, pemKey} {
			_, err := New(Config{Keys: []string{"body"}, Secrets: []string{"an-hmac-secret", key}, Signature: GenericSignature{Algorithm: alg}})
			want := "secrets[1]: is an ECDSA public key, which anyone may hold: as an HMAC secret it would let anyone sign; set signature.algorithm: ecdsa-sha256"
			if err == nil || err.Error() != want {
				t.Errorf("algorithm %q, secret a public key: got %v, want %q", alg, err, want)
			}
		}
	}
	if _, err := New(Config{Keys: []string{"body"}, Secrets: []string{"c2VjcmV0"}}); err != nil {
		t.Errorf("a base64 HMAC secret: got %v, want it accepted", err)
	}
}

// FuzzECDSAKey: parseECDSAKey never panics, accepts only ECDSA keys, and
// its error is one of a few fixed messages, so it never shows what the
// secret held.
func FuzzECDSAKey(f *testing.F) {
	f.Add(sendgridKey)
	f.Add("-----BEGIN PUBLIC KEY-----\n" + sendgridKey + "\n-----END PUBLIC KEY-----\n")
	f.Add("-----BEGIN")
	f.Add("")
	f.Add("MCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=") // an Ed25519 key
	fixed := []string{
		"not a PEM PUBLIC KEY block (want an ECDSA public key: base64 of its DER encoding, or PEM)",
		"not base64 (want an ECDSA public key: base64 of its DER encoding, as SendGrid's verification key, or PEM)",
		"not a public key (want an ECDSA public key: base64 of its DER encoding, as SendGrid's verification key, or PEM)",
	}
	ofType := regexp.MustCompile(`^a \*?[a-z0-9]+\.[A-Za-z0-9]+, not an ECDSA public key$`)
	f.Fuzz(func(t *testing.T, s string) {
		k, err := parseECDSAKey(s)
		if (k == nil) == (err == nil) {
			t.Fatalf("parseECDSAKey(%q): got %v, %v; want a key or an error", s, k, err)
		}
		if err != nil && !slices.Contains(fixed, err.Error()) && !ofType.MatchString(err.Error()) {
			t.Fatalf("parseECDSAKey(%q): got error %q, want one of the fixed messages (never the key)", s, err)
		}
	})
}
