package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/providers"
)

// documentedStatus lists every status the gateway itself may answer (the
// test upstream only answers 200).
var documentedStatus = map[int]bool{
	200: true, 400: true, 401: true, 404: true, 405: true, 408: true, 409: true,
	413: true, 422: true, 502: true, 503: true, 504: true,
}

var documentedDedupStatus = map[string]bool{
	statusForwarded: true, statusDuplicate: true, statusInFlight: true,
	statusUnkeyed: true, statusRejected: true, statusStoreError: true,
}

// FuzzHandler sends random methods, paths, headers and bodies through the
// whole handler on a memstore: no panic, only documented statuses, a
// Dedup-Status exactly on matched routes.
func FuzzHandler(f *testing.F) {
	deep := strings.Repeat("[", 10000) + strings.Repeat("]", 10000)
	deepObj := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	seeds := []struct{ method, path, headers, body string }{
		{"POST", "/hooks/orders", "Idempotency-Key: k1", `{"id":"1"}`},
		{"POST", "/hooks/orders", "", `{"data":{"object":{"id":"obj_1"}}}`},
		{"POST", "/hooks/orders?id=q1", "", ``},
		{"POST", "/hooks/orders", "", deep},
		{"POST", "/hooks/orders", "", deepObj},
		{"POST", "/hooks/orders", "Idempotency-Key: \x00\x01\x7f", "\xff\xfe invalid utf-8"},
		{"POST", "/hooks/orders", "Idempotency-Key: " + strings.Repeat("k", 70000), ``},
		{"POST", "/hooks/orders", "Dedup-Key: forged\nX-Forwarded-For: 1.2.3.4", `{"id":"x"}`},
		{"POST", "/hooks/api", "Idempotency-Key: bad\tkey", `{}`},
		{"POST", "/hooks/api", "", `{}`},
		{"POST", "/hooks/api", "Idempotency-Key: k1\nAuthorization: Bearer a", `{"amount":1,"ts":2}`},
		{"POST", "/hooks/api", "Idempotency-Key: k1\nAuthorization: Bearer a", `{"ts":3, "amount":1}`},
		{"POST", "/hooks/api", "Idempotency-Key: k1\nAuthorization: Bearer a", `{"amount":2}`},
		{"POST", "/hooks/api", "Idempotency-Key: k1\nAuthorization: Bearer b", `{"\u0074s":1,"amount":2}`},
		{"POST", "/hooks/api", "Idempotency-Key: k1", `{"amount":1}`},
		{"POST", "/hooks/stripe", "Stripe-Signature: t=1,v1=00", `{"id":"evt_1"}`},
		{"POST", "/hooks/stripe", "Stripe-Signature: t=99999999999999999999,v1=zz,v1=", `{"id":"evt_1"}`},
		{"GET", "/hooks/orders", "", ``},
		{"POST", "/nowhere", "", ``},
		{"POST", "/prefix/a/../../hooks/orders", "", `{"id":"1"}`},
		{"POST", "/prefix/", "Content-Length: 5", `{"id":"toolong-for-the-limit"}`},
		{"PATCH", "//", "", ``},
		{"POST", "/hooks/Stripe/", "", `{"id":"evt_1"}`},
		{"POST", "/hooks/orders/../stripe", "", `{"id":"evt_1"}`},
		{"POST", "/hooks/x/%252e%252e/stripe", "", `{"id":"evt_1"}`},
		{"POST", "/hooks/stripe;a=b.json", "", `{"id":"evt_1"}`},
		{"POST", "/prefix/x;jsessionid=1.json", "", `{}`},
	}
	for _, s := range seeds {
		f.Add(s.method, s.path, s.headers, []byte(s.body))
	}

	var reached atomic.Int64 // requests the upstream received
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	f.Cleanup(up.Close)
	store := memstore.New(memstore.Options{SweepInterval: -1})
	f.Cleanup(func() { store.Close() })
	orders := genericRoute("orders", "/hooks/orders", up.URL)
	orders.Provider.Keys = []string{"header:Idempotency-Key", "json:data.object.id", "query:id", "body"}
	api := genericRoute("api", "/hooks/api", up.URL)
	api.OnMissingKey = Reject
	api.OnFingerprintMismatch = Reject
	api.FingerprintExclude = []string{"ts"}
	api.ClientIdentity = "Authorization"
	api.DuplicateResponse = Replay
	stripe := genericRoute("stripe", "/hooks/stripe", up.URL)
	stripe.Provider = providers.Config{Provider: providers.Stripe, Secrets: []string{stripeSecret}}
	prefix := genericRoute("prefix", "/prefix/*", up.URL)
	prefix.MaxBodyBytes = 16
	prefix.Methods = []string{"POST", "PATCH", "PUT"}
	open := genericRoute("open", "/hooks/*", up.URL) // unsigned, around the signed stripe route
	gw, err := New(Config{Routes: []Route{orders, api, stripe, prefix, open}}, store, Options{Registerer: prometheus.NewRegistry()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { gw.Close() })

	f.Fuzz(func(t *testing.T, method, path, headers string, body []byte) {
		req, err := http.NewRequest(method, "http://gateway.test"+path, bytes.NewReader(body))
		if err != nil {
			t.Skip()
		}
		for line := range strings.SplitSeq(headers, "\n") {
			k, v, ok := strings.Cut(line, ":")
			if ok && k != "" {
				req.Header.Add(k, strings.TrimSpace(v))
			}
		}
		req.RemoteAddr = "127.0.0.1:12345"
		rec := httptest.NewRecorder()
		before := reached.Load()
		gw.ServeHTTP(rec, req)

		// No seed carries a valid Stripe signature, so nothing an upstream
		// could read as the stripe route's path may reach it, whichever route
		// the gateway chose. The reading here is independent of the
		// gateway's: path.Clean, lower case, no ;params, trailing / or
		// extension.
		if reached.Load() != before && lenientlyStripe(req.URL.Path) {
			t.Fatalf("path %q reached the upstream unsigned; an upstream may route it to /hooks/stripe", req.URL.Path)
		}

		if !documentedStatus[rec.Code] {
			t.Fatalf("got status %d, want a documented one (body %s)", rec.Code, rec.Body)
		}
		table := gw.routes.Load()
		rt, ambiguous := table.lookup(req.URL.Path)
		canonical := canonicalPath(req.URL) && !ambiguous
		matched := canonical && rt != nil
		ds := rec.Header().Values(HeaderDedupStatus)
		switch {
		case !canonical && (rec.Code != http.StatusBadRequest || len(ds) != 0):
			t.Fatalf("path %q not canonical: got %d with Dedup-Status %q, want 400 and none", req.URL.Path, rec.Code, ds)
		case matched && (len(ds) != 1 || !documentedDedupStatus[ds[0]]):
			t.Fatalf("matched route: got Dedup-Status %q, want exactly one documented value", ds)
		case !matched && len(ds) != 0:
			t.Fatalf("no route: got Dedup-Status %q, want none", ds)
		case canonical && !matched && rec.Code != http.StatusNotFound:
			t.Fatalf("no route: got %d, want 404", rec.Code)
		}
	})
}

// lenientlyStripe reports whether an upstream that decodes up to three more
// times, cleans dot segments and ignores case, ;params, a trailing slash and
// an extension would read p as /hooks/stripe.
func lenientlyStripe(p string) bool {
	for range 3 {
		if u, err := url.PathUnescape(p); err == nil {
			p = u
		}
	}
	p = strings.ReplaceAll(p, "\\", "/")
	segs := strings.Split(p, "/")
	for i, seg := range segs {
		seg, _, _ = strings.Cut(seg, ";")
		segs[i] = seg
	}
	p = strings.ToLower(path.Clean("/" + strings.Join(segs, "/")))
	if dot := strings.LastIndexByte(p, '.'); dot > strings.LastIndexByte(p, '/')+1 {
		p = p[:dot]
	}
	return p == "/hooks/stripe"
}
