package proxy_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/dedupgw/dedupgw/dedup/memstore"
	"github.com/dedupgw/dedupgw/providers"
	"github.com/dedupgw/dedupgw/proxy"
)

// A gateway in front of an application: the first delivery of an event is
// forwarded, the provider's retry is answered by the gateway.
func Example() {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("app got", r.Header.Get("Dedup-Key"))
	}))
	defer app.Close()

	store := memstore.New(memstore.Options{})
	defer store.Close()
	gw, err := proxy.New(proxy.Config{Routes: []proxy.Route{{
		Name:     "stripe",
		Path:     "/webhooks/stripe",
		Upstream: app.URL,
		Provider: providers.Config{Provider: providers.Stripe}, // key: json:id
	}}}, store, proxy.Options{Backend: "memory"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer gw.Close()
	srv := httptest.NewServer(gw)
	defer srv.Close()

	for range 2 {
		resp, err := http.Post(srv.URL+"/webhooks/stripe", "application/json", strings.NewReader(`{"id":"evt_123","type":"charge.succeeded"}`))
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Dedup-Status"), strings.Contains(string(body), `"status":"duplicate"`))
	}
	// Output:
	// app got stripe:evt_123
	// 200 forwarded false
	// 200 duplicate true
}

// The admin handler serves health, readiness, metrics and the keys API.
func ExampleNewAdmin() {
	store := memstore.New(memstore.Options{})
	defer store.Close()
	gw, err := proxy.New(proxy.Config{Routes: []proxy.Route{{
		Name: "orders", Path: "/hooks/orders", Upstream: "http://127.0.0.1:3000",
		Provider: providers.Config{Provider: providers.Generic, Keys: []string{"header:Idempotency-Key"}},
	}}}, store, proxy.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer gw.Close()
	admin := httptest.NewServer(proxy.NewAdmin(gw, store, proxy.AdminOptions{Token: "t0ken"}))
	defer admin.Close()

	for _, path := range []string{"/readyz", "/v1/keys/orders/k1"} {
		resp, err := http.Get(admin.URL + path)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(path, resp.StatusCode)
	}
	// Output:
	// /readyz 200
	// /v1/keys/orders/k1 401
}

// An API idempotency route: a retry gets the first answer again, the same
// key with another payload gets 422, a request without a key gets 400.
func Example_apiIdempotency() {
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"pay_1"}`)
	}))
	defer app.Close()

	store := memstore.New(memstore.Options{})
	defer store.Close()
	gw, err := proxy.New(proxy.Config{Routes: []proxy.Route{{
		Name:                  "payments",
		Path:                  "/api/payments",
		Upstream:              app.URL,
		Provider:              providers.Config{Provider: providers.Generic, Keys: []string{"header:Idempotency-Key"}},
		OnMissingKey:          proxy.Reject,
		OnFingerprintMismatch: proxy.Reject,
		FingerprintExclude:    []string{"request_time"},
		DuplicateResponse:     proxy.Replay,
	}}}, store, proxy.Options{Backend: "memory"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer gw.Close()
	srv := httptest.NewServer(gw)
	defer srv.Close()

	for _, call := range []struct{ key, body string }{
		{"k1", `{"amount":100,"request_time":"10:00:00"}`},
		{"k1", `{"amount":100,"request_time":"10:00:09"}`},
		{"k1", `{"amount":500}`},
		{"", `{"amount":100}`},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/payments", strings.NewReader(call.body))
		if call.key != "" {
			req.Header.Set("Idempotency-Key", call.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode >= 400 {
			body = []byte(resp.Header.Get("Content-Type"))
		}
		fmt.Println(resp.StatusCode, resp.Header.Get("Dedup-Status"), string(body))
	}
	// Output:
	// 201 forwarded {"id":"pay_1"}
	// 201 duplicate {"id":"pay_1"}
	// 422 rejected application/problem+json
	// 400 rejected application/problem+json
}
