package main

import (
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
)

// countPath is the upstream's own endpoint that reports how many deliveries it
// has received. Proxies are never pointed at it: the runner asks the upstream
// directly.
const countPath = "/__bench/count"

// upstreamBody is the upstream's answer to every delivery: small, JSON, 200.
var upstreamBody = []byte(`{"received":true}`)

// upstream is the application behind every target: it reads each delivery's
// body fully and answers 200 with a small JSON body, counting the POSTs it got.
type upstream struct {
	received atomic.Int64
}

// ServeHTTP answers GET countPath with the number of POSTs received so far and
// every other request with 200 {"received":true}.
func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == countPath {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(strconv.AppendInt(nil, u.received.Load(), 10))
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	if r.Method == http.MethodPost {
		u.received.Add(1)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(upstreamBody)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(upstreamBody)
}
