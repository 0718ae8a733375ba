package proxy

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// TestNoHiddenTransportRetry: when the upstream reads a request and then drops
// the kept-alive connection without answering, Go's Transport would resend a
// request carrying Idempotency-Key on a new connection if it could rewind the
// body: the application would process one delivery twice behind the
// gateway's back. The gateway must answer 502 (the key stays claimable, the
// provider's retry is visible) with the upstream having seen the request
// once.
func TestNoHiddenTransportRetry(t *testing.T) {
	// An empty body too: net/http resends a request without a body
	// (http.NoBody) that carries Idempotency-Key.
	for _, body := range []string{`{"a":1}`, ""} {
		t.Run(fmt.Sprintf("body %q", body), func(t *testing.T) { testNoHiddenTransportRetry(t, body, fmt.Sprintf("len%d-", len(body))) })
	}
}

func testNoHiddenTransportRetry(t *testing.T, body, keyPrefix string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int32 // requests read by the upstream
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = req.Body.Read(make([]byte, 1024))
					if n := seen.Add(1); n == 2 {
						return // the second request: read it, then drop the connection
					}
					_, _ = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
				}
			}()
		}
	}()

	h := newHarness(t, Config{Routes: []Route{genericRoute("api", "/api", "http://"+ln.Addr().String())}}, harnessOpts{})
	if got := h.send("/api", body, "Idempotency-Key: "+keyPrefix+"first"); got.Status != 200 {
		t.Fatalf("first delivery: got %d, want 200", got.Status)
	}
	got := h.send("/api", body, "Idempotency-Key: "+keyPrefix+"second")
	if got.Status != http.StatusBadGateway {
		t.Errorf("delivery whose connection the upstream dropped: got %d, want 502", got.Status)
	}
	if n := seen.Load(); n != 2 {
		t.Errorf("requests the upstream read: got %d, want 2 (the dropped one exactly once, no hidden resend)", n)
	}
}
