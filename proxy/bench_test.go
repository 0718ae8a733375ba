package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupgw/dedupgw/dedup/memstore"
)

// BenchmarkHandler measures the handler in process (httptest recorder in,
// real loopback upstream out) on a memstore: first deliveries (claim,
// forward, commit) and duplicates (one claim, no forward).
func BenchmarkHandler(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer up.Close()
	store := memstore.New(memstore.Options{})
	defer store.Close()
	gw, err := New(Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, store,
		Options{Registerer: prometheus.NewRegistry(), Backend: "memory"})
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	body := bytes.Repeat([]byte("x"), 1024)

	run := func(b *testing.B, key func() string, want string) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req := httptest.NewRequest(http.MethodPost, "/hooks/orders", bytes.NewReader(body))
				req.Header.Set("Idempotency-Key", key())
				rec := httptest.NewRecorder()
				gw.ServeHTTP(rec, req)
				if got := rec.Header().Get(HeaderDedupStatus); got != want {
					b.Fatalf("got Dedup-Status %q, want %q", got, want)
				}
			}
		})
	}
	var n atomic.Int64
	b.Run("first", func(b *testing.B) {
		run(b, func() string { return fmt.Sprint("evt_", n.Add(1)) }, statusForwarded)
	})
	gw.ServeHTTP(httptest.NewRecorder(), func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/hooks/orders", bytes.NewReader(body))
		r.Header.Set("Idempotency-Key", "dup")
		return r
	}())
	b.Run("duplicate", func(b *testing.B) {
		run(b, func() string { return "dup" }, statusDuplicate)
	})
}

// BenchmarkAPIDuplicate measures a retry of a completed request with a 1 KiB
// JSON body on a memstore: a plain keyed route (one claim, JSON ack) against
// an API idempotency route (fingerprint with an excluded field, client scope,
// a read before the claim, replayed answer), and the same route with its
// client scope keyed by a client_identity_secret.
func BenchmarkAPIDuplicate(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"pay_1"}`)
	}))
	defer up.Close()
	store := memstore.New(memstore.Options{})
	defer store.Close()
	plain := genericRoute("plain", "/plain", up.URL)
	api := paymentsRoute(up.URL)
	api.ClientIdentity = "Authorization"
	keyed := api
	keyed.Name, keyed.Path, keyed.ClientIdentitySecret = "keyed", "/api/keyed/*", "0123456789abcdef"
	gw, err := New(Config{Routes: []Route{plain, api, keyed}}, store, Options{Registerer: prometheus.NewRegistry(), Backend: "memory"})
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Close()
	body := []byte(fmt.Sprintf(`{"amount":1000,"currency":"eur","request_time":"2026-11-30T10:00:00Z","description":%q}`, bytes.Repeat([]byte("x"), 940)))
	send := func(path string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
		req.Header.Set("Idempotency-Key", "k1")
		req.Header.Set("Authorization", "Bearer sk_test")
		rec := httptest.NewRecorder()
		gw.ServeHTTP(rec, req)
		return rec
	}
	for _, path := range []string{"/plain", payCharge, "/api/keyed/charge"} {
		if got := send(path).Header().Get(HeaderDedupStatus); got != statusForwarded {
			b.Fatalf("%s first request: got Dedup-Status %q, want forwarded", path, got)
		}
		b.Run(path, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if got := send(path).Header().Get(HeaderDedupStatus); got != statusDuplicate {
					b.Fatalf("got Dedup-Status %q, want duplicate", got)
				}
			}
		})
	}
}

// BenchmarkClientScope measures a client scope alone: the SHA-256 of the
// Authorization value, and its HMAC-SHA256 with a client_identity_secret.
func BenchmarkClientScope(b *testing.B) {
	for _, tt := range []struct{ name, secret string }{
		{"sha256", ""},
		{"hmac-sha256", "0123456789abcdef"},
	} {
		b.Run(tt.name, func(b *testing.B) {
			rt := scopedRoute(b, tt.secret)
			req := httptest.NewRequest(http.MethodPost, payCharge, nil)
			req.Header.Set("Authorization", "Basic YWxpY2U6aHVudGVyMg==")
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, ok, _ := rt.clientScope(req); !ok {
						b.Fatal("got no scope")
					}
				}
			})
		})
	}
}
