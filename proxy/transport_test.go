package proxy

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestUpstreamConnectionsAreReused: the gateway keeps its upstream
// connections alive under concurrency. Two waves of 32 concurrent
// deliveries reuse the first wave's connections instead of opening new ones
// (a transport with Go's default of 2 idle connections per host closes 30 of
// them after each wave and dials again).
func TestUpstreamConnectionsAreReused(t *testing.T) {
	const senders = 32
	var dialed atomic.Int64
	arrived := make(chan struct{}, senders)
	var gate atomic.Pointer[chan struct{}]
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g := *gate.Load()
		arrived <- struct{}{}
		<-g
		_, _ = w.Write([]byte("ok"))
	}))
	up.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialed.Add(1)
		}
	}
	up.Start()
	t.Cleanup(up.Close)
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})

	id := 0
	for wave := range 2 {
		g := make(chan struct{})
		gate.Store(&g)
		errs := make(chan error, senders)
		for range senders {
			id++
			body := fmt.Sprintf(`{"id":"evt_%d"}`, id)
			go func() {
				resp, err := h.try(context.Background(), http.MethodPost, "/hooks/orders", body)
				if err == nil && resp.Status != http.StatusOK {
					err = fmt.Errorf("status %d", resp.Status)
				}
				errs <- err
			}()
		}
		// All 32 are at the upstream at once, so each holds a connection.
		deadline := time.After(10 * time.Second)
		for range senders {
			select {
			case <-arrived:
			case <-deadline:
				t.Fatalf("wave %d: not all %d deliveries reached the upstream within 10s", wave, senders)
			}
		}
		close(g)
		for range senders {
			if err := <-errs; err != nil {
				t.Fatalf("wave %d: delivery: %v", wave, err)
			}
		}
	}
	if got := dialed.Load(); got > senders+senders/4 {
		t.Errorf("upstream connections opened for 2 waves of %d concurrent deliveries: got %d, want about %d (reused)", senders, got, senders)
	}
}

// TestForwardIsOneWrite: a forwarded delivery's headers and buffered body
// leave in one write system call. (Through a plain ReverseProxy the
// Transport flushes the headers on their own first, because it cannot tell
// the proxy's body wrapper from a body that may block: one more system call
// per delivery, in the gateway and in the upstream.)
func TestForwardIsOneWrite(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte("ok"))
	}))
	t.Cleanup(up.Close)
	var writes atomic.Int64
	tr := newTransport()
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, writes: &writes}, nil
	}
	t.Cleanup(tr.CloseIdleConnections)
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{transport: tr})

	for i, body := range []string{`{"id":"evt_1"}`, `{"id":"evt_2","data":"` + strings.Repeat("x", 2000) + `"}`} {
		before := writes.Load()
		if got := h.send("/hooks/orders", body); got.Status != http.StatusOK {
			t.Fatalf("delivery %d: got status %d, want 200", i, got.Status)
		}
		if got := writes.Load() - before; got != 1 {
			t.Errorf("delivery %d (%d-byte body): got %d writes to the upstream connection, want 1", i, len(body), got)
		}
	}
}

// countingConn counts its Write calls.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// TestContentEncodingPassesThrough: the gateway neither asks the upstream for
// a compression the sender did not ask for nor undoes one it did, so the
// sender gets the upstream's response byte for byte. (Go's Transport, by
// default, adds "Accept-Encoding: gzip" to a request without one and then
// hands back the body decompressed, without its Content-Encoding and
// Content-Length.)
func TestContentEncodingPassesThrough(t *testing.T) {
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	_, _ = io.WriteString(zw, `{"received":true}`)
	_ = zw.Close()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Set("Content-Length", strconv.Itoa(zipped.Len()))
			_, _ = w.Write(zipped.Bytes())
			return
		}
		_, _ = io.WriteString(w, `{"received":true}`)
	})
	h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})
	// A sender that sends exactly the headers it is given and never
	// decompresses.
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	t.Cleanup(client.CloseIdleConnections)

	for i, tc := range []struct {
		acceptEncoding string // the sender's; "" sends none
		wantEncoding   string
		wantBody       []byte
	}{
		{"", "", []byte(`{"received":true}`)},
		{"gzip", "gzip", zipped.Bytes()},
	} {
		req, err := http.NewRequest(http.MethodPost, h.srv.URL+"/hooks/orders", strings.NewReader(fmt.Sprintf(`{"id":"evt_%d"}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		if tc.acceptEncoding != "" {
			req.Header.Set("Accept-Encoding", tc.acceptEncoding)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("Accept-Encoding %q: %v", tc.acceptEncoding, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("Accept-Encoding %q: read: %v", tc.acceptEncoding, err)
		}
		if got := up.request(i).Header.Get("Accept-Encoding"); got != tc.acceptEncoding {
			t.Errorf("sender's Accept-Encoding %q: upstream got Accept-Encoding %q, want %q", tc.acceptEncoding, got, tc.acceptEncoding)
		}
		if got := resp.Header.Get("Content-Encoding"); got != tc.wantEncoding {
			t.Errorf("sender's Accept-Encoding %q: got Content-Encoding %q, want %q", tc.acceptEncoding, got, tc.wantEncoding)
		}
		if !bytes.Equal(body, tc.wantBody) {
			t.Errorf("sender's Accept-Encoding %q: got body %q, want the upstream's %q", tc.acceptEncoding, body, tc.wantBody)
		}
	}
}
