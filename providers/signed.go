package providers

import (
	"net/http"
	"slices"
	"strings"
)

// UnsignedKeySources returns the entries of cfg.Keys that cfg's signature
// does not cover, in order: a query: source always; a header: source unless
// the scheme signs that header (Standard Webhooks' webhook-id and svix-id,
// or a generic route's {header:NAME} or timestamp header); json: and body
// unless the scheme leaves the body unsigned (a generic template without
// {body}). It returns nil when cfg has no secrets (nothing is verified, and
// that is said elsewhere), when cfg.Keys is empty or the provider's preset
// written out (the ID headers GitHub and Shopify do not sign are a
// documented trade-off), or when cfg does not build.
//
// On a signed route such a source lets whoever captured one genuine
// delivery resend it under any key it likes: the signature still verifies,
// so the application gets the event again, and a real event's key claimed
// that way before the event arrives makes its genuine delivery a duplicate
// that is never forwarded.
func UnsignedKeySources(cfg Config) []string {
	if len(cfg.Secrets) == 0 || len(cfg.Keys) == 0 || slices.Equal(cfg.Keys, PresetKeys(cfg.Provider)) {
		return nil
	}
	if _, err := New(cfg); err != nil {
		return nil
	}
	bodySigned := true
	signedHeaders := map[string]bool{}
	switch cfg.Provider {
	case StandardWebhooks:
		for _, h := range []string{webhookIDHeader, svixIDHeader, webhookTimestampHeader, svixTimestampHeader} {
			signedHeaders[http.CanonicalHeaderKey(h)] = true
		}
	case Generic, "":
		s := cfg.Signature
		tmpl := s.Template
		if tmpl == "" {
			tmpl = defaultGenericTemplate
		}
		parts, err := parseTemplate(tmpl)
		if err != nil {
			return nil
		}
		bodySigned = false
		for _, p := range parts {
			switch p.kind {
			case 'b':
				bodySigned = true
			case 'h':
				signedHeaders[p.literal] = true
			case 't':
				signedHeaders[http.CanonicalHeaderKey(s.TimestampHeader)] = true
			}
		}
	}
	var out []string
	for _, k := range cfg.Keys {
		kind, arg, _ := strings.Cut(k, ":")
		switch {
		case k == "body" || kind == "json":
			if !bodySigned {
				out = append(out, k)
			}
		case kind == "header":
			if !signedHeaders[http.CanonicalHeaderKey(arg)] {
				out = append(out, k)
			}
		default: // query:, which no scheme signs
			out = append(out, k)
		}
	}
	return out
}

// ShiftableKeySources returns the key sources of cfg, a signed generic
// route, that its template signs next to another value with nothing
// between them: a {header:NAME} key beside another {header:…} or {body},
// or the body key beside a {header:…}. Whoever captured one delivery can
// move characters from one value to the other ("msg-1" + "abc" as "msg-1a"
// + "bc"): the signed bytes do not change, the key does, so the delivery
// is forwarded again. A {timestamp} neighbour (or the timestamp header's
// own {header:…}) is safe, since a timestamp parses only in its one form.
// It returns nil when cfg has no secrets, is not generic, or does not
// build.
func ShiftableKeySources(cfg Config) []string {
	if len(cfg.Secrets) == 0 || (cfg.Provider != Generic && cfg.Provider != "") {
		return nil
	}
	p, err := New(cfg)
	if err != nil {
		return nil
	}
	v, ok := p.Verifier.(*genericVerifier)
	if !ok {
		return nil
	}
	parts := v.template // as parsed by New, the default template filled in
	// shiftable holds the headers (canonical names), and "" for the body,
	// signed beside another header or the body.
	shiftable := map[string]bool{}
	name := func(p templatePart) string {
		if p.kind == 'b' {
			return ""
		}
		return p.literal
	}
	ts := http.CanonicalHeaderKey(cfg.Signature.TimestampHeader)
	free := func(p templatePart) bool { // a value that may take any form
		return p.kind == 'b' || p.kind == 'h' && (ts == "" || p.literal != ts)
	}
	for i := 1; i < len(parts); i++ {
		if a, b := parts[i-1], parts[i]; free(a) && free(b) {
			shiftable[name(a)], shiftable[name(b)] = true, true
		}
	}
	var out []string
	for _, k := range cfg.Keys {
		kind, arg, _ := strings.Cut(k, ":")
		switch {
		case k == "body" && shiftable[""]:
			out = append(out, k)
		case kind == "header" && shiftable[http.CanonicalHeaderKey(arg)]:
			out = append(out, k)
		}
	}
	return out
}
