package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupgw/dedupgw/dedup"
)

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestDedupKeyHeader: a key that is a valid header value of at most
// maxHeaderKey bytes is sent as it is; any other is sent hashed, keeping the
// namespace and the client scope.
func TestDedupKeyHeader(t *testing.T) {
	long := strings.Repeat("a", maxHeaderKey+1)
	scope := strings.Repeat("0", clientScopeLen)
	tests := []struct {
		name      string
		key       dedup.Key
		clientKey string
		want      string
	}{
		{"plain", dedup.Key{Namespace: "stripe", ID: "evt_1"}, "evt_1", "stripe:evt_1"},
		{"tab and spaces stay", dedup.Key{Namespace: "ns", ID: "a\tb c"}, "a\tb c", "ns:a\tb c"},
		{"UTF-8 stays", dedup.Key{Namespace: "ns", ID: "evt_ü_日本"}, "evt_ü_日本", "ns:evt_ü_日本"},
		{"exactly the bound stays", dedup.Key{Namespace: "ns", ID: long[1:]}, long[1:], "ns:" + long[1:]},
		{"CR LF", dedup.Key{Namespace: "ns", ID: "evt\r\nX-Injected: 1"}, "evt\r\nX-Injected: 1", "ns:sha256:" + sha256Hex("evt\r\nX-Injected: 1")},
		{"NUL", dedup.Key{Namespace: "ns", ID: "evt\x00"}, "evt\x00", "ns:sha256:" + sha256Hex("evt\x00")},
		{"DEL", dedup.Key{Namespace: "ns", ID: "evt\x7f"}, "evt\x7f", "ns:sha256:" + sha256Hex("evt\x7f")},
		{"longer than the bound", dedup.Key{Namespace: "ns", ID: long}, long, "ns:sha256:" + sha256Hex(long)},
		{"looks hashed already", dedup.Key{Namespace: "ns", ID: "sha256:abc"}, "sha256:abc", "ns:sha256:" + sha256Hex("sha256:abc")},
		{"trailing space", dedup.Key{Namespace: "ns", ID: "abc "}, "abc ", "ns:sha256:" + sha256Hex("abc ")},
		{"trailing tab", dedup.Key{Namespace: "ns", ID: "abc\t"}, "abc\t", "ns:sha256:" + sha256Hex("abc\t")},
		{"leading space stays", dedup.Key{Namespace: "ns", ID: " abc"}, " abc", "ns: abc"},
		{"client scope plain", dedup.Key{Namespace: "pay", ID: scope + ":k1"}, "k1", "pay:" + scope + ":k1"},
		{"client scope kept, key hashed", dedup.Key{Namespace: "pay", ID: scope + ":" + long}, long, "pay:" + scope + ":sha256:" + sha256Hex(long)},
		{"client scope with a 255-byte key stays", dedup.Key{Namespace: "pay", ID: scope + ":" + long[2:]}, long[2:], "pay:" + scope + ":" + long[2:]},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := dedupKeyHeader(tt.key, tt.clientKey); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if got := dedupKeyHeader(tt.key, tt.clientKey); !validHeaderValue(got) {
				t.Errorf("got %q, not a valid header value", got)
			}
		})
	}
}

// TestHostileKeysAreDelivered: an event ID that cannot travel in a header
// (control characters), is very long, or would lose its trailing space in
// one (becoming another ID's Dedup-Key) is still forwarded once, with a
// hashed Dedup-Key, and its copy is a duplicate. Before, Go's transport
// refused the request and the event could never be delivered.
func TestHostileKeysAreDelivered(t *testing.T) {
	tests := []struct {
		name, id, wantHeader string
	}{
		{"control characters", "evt_ctl\x00\r\n\x07x", "orders:sha256:" + sha256Hex("evt_ctl\x00\r\n\x07x")},
		{"header injection", "evt_nl\nX-Injected: 1", "orders:sha256:" + sha256Hex("evt_nl\nX-Injected: 1")},
		{"40 KiB", "evt_" + strings.Repeat("c", 40<<10), "orders:sha256:" + sha256Hex("evt_"+strings.Repeat("c", 40<<10))},
		{"trailing space", "evt_plain ", "orders:sha256:" + sha256Hex("evt_plain ")},
		{"plain", "evt_plain", "orders:evt_plain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newUpstream(t, nil)
			h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})
			body, err := json.Marshal(map[string]string{"id": tt.id})
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []struct {
				status int
				dedup  string
			}{{http.StatusOK, statusForwarded}, {http.StatusOK, statusDuplicate}} {
				resp := h.send("/hooks/orders", string(body))
				if resp.Status != want.status || resp.Header.Get(HeaderDedupStatus) != want.dedup {
					t.Errorf("delivery %d: got %d %q, want %d %q", i+1, resp.Status, resp.Header.Get(HeaderDedupStatus), want.status, want.dedup)
				}
			}
			if got := up.count(); got != 1 {
				t.Fatalf("got %d requests upstream, want 1", got)
			}
			if got := up.request(0).Header.Get(HeaderDedupKey); got != tt.wantHeader {
				t.Errorf("got Dedup-Key %q, want %q", got, tt.wantHeader)
			}
			if got := up.request(0).Header.Get("X-Injected"); got != "" {
				t.Errorf("got X-Injected %q upstream, want none", got)
			}
		})
	}
}

// TestDedupStatusAfterAnInformationalAnswer: the ReverseProxy relays a 1xx
// (103 Early Hints) and then clears the response headers; the final answer
// must still carry Dedup-Status, whether the upstream's or the gateway's own.
func TestDedupStatusAfterAnInformationalAnswer(t *testing.T) {
	tests := []struct {
		name       string
		then       func(w http.ResponseWriter)
		wantStatus int
	}{
		{"then 200", func(w http.ResponseWriter) {
			w.Header().Set("Dedup-Status", "upstream-made-this-up")
			_, _ = io.WriteString(w, "ok")
		}, 200},
		{"then the connection drops", func(w http.ResponseWriter) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}, 502},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
				w.Header().Set("Link", "</style.css>; rel=preload")
				w.WriteHeader(http.StatusEarlyHints)
				w.Header().Del("Link")
				tc.then(w)
			})
			h := newHarness(t, Config{Routes: []Route{genericRoute("orders", "/hooks/orders", up.URL)}}, harnessOpts{})
			resp := h.send("/hooks/orders", "{}", "Idempotency-Key: k1")
			if resp.Status != tc.wantStatus || resp.Header.Get(HeaderDedupStatus) != "forwarded" {
				t.Errorf("got %d with Dedup-Status %q, want %d forwarded", resp.Status, resp.Header.Get(HeaderDedupStatus), tc.wantStatus)
			}
		})
	}
}

// TestSenderThatStopsReadingDoesNotHoldClose: a sender that never reads a
// large answer must not keep the handler, and so the drain and Close, for
// as long as it stays connected; the write is bounded by the forward's
// deadline plus the store timeout. The event is processed all the same.
func TestSenderThatStopsReadingDoesNotHoldClose(t *testing.T) {
	cut := make(chan struct{})
	big := bytes.Repeat([]byte("x"), 32<<20) // far more than loopback's socket buffers
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		// The write blocks once the gateway stops reading, and fails when
		// the forward's deadline closes the upstream connection: from then
		// on the gateway's handler only writes to the sender.
		_, _ = w.Write(big)
		close(cut)
	})
	r := genericRoute("orders", "/hooks/orders", up.URL)
	r.UpstreamTimeout = 500 * time.Millisecond
	r.Lease = 2 * time.Second
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{storeTimeout: 200 * time.Millisecond})

	c := nonReadingSender(t, h, "k1")
	recv(t, cut, "the upstream to cut the answer")
	waitFor(t, "the answer to be committed", func() bool {
		rec, err := h.record("orders", "k1")
		return err == nil && rec.State == dedup.StateProcessed
	})

	wantCloseReturns(t, h, c, "after the forward's deadline for a sender that does not read")
}

// nonReadingSender posts an orders delivery with key to h on a connection
// with a small receive buffer, and never reads the answer. The connection
// is closed when the test ends.
func nonReadingSender(t *testing.T, h *harness, key string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	if _, err := io.WriteString(c, "POST /hooks/orders HTTP/1.1\r\nHost: x\r\nIdempotency-Key: "+key+"\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
		t.Fatal(err)
	}
	return c
}

// wantCloseReturns closes h's gateway and wants it to return while c, a
// sender that does not read, stays connected. Past 20s (a deadline, not a
// measurement: it returns in well under a second) it reports what it was
// still waiting for and closes c to let the test end.
func wantCloseReturns(t *testing.T, h *harness, c net.Conn, waiting string) {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- h.gw.Close() }()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Errorf("Close: still waiting after 20s %s", waiting)
		c.Close()
		<-closed
	}
}

// writeSignal signals once, on the first Write larger than bigReplay: the
// gateway is then writing a large answer. Unwrap keeps ResponseController
// working through it.
type writeSignal struct {
	http.ResponseWriter
	once  *sync.Once
	large chan struct{}
}

func (w writeSignal) Write(p []byte) (int, error) {
	if len(p) > bigReplay {
		w.once.Do(func() { close(w.large) })
	}
	return w.ResponseWriter.Write(p)
}

func (w writeSignal) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestSenderThatStopsReadingAReplayDoesNotHoldClose: a large stored answer
// replayed to a sender that never reads it must not keep the handler, and
// so the drain and Close: Close cuts the write.
func TestSenderThatStopsReadingAReplayDoesNotHoldClose(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 32<<20) // far more than loopback's socket buffers
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) { _, _ = w.Write(big) })
	r := genericRoute("orders", "/hooks/orders", up.URL)
	r.DuplicateResponse = Replay
	r.MaxReplayBytes = 64 << 20
	large, once := make(chan struct{}), &sync.Once{}
	var replaying atomic.Bool
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{wrap: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if replaying.Load() {
				w = writeSignal{ResponseWriter: w, once: once, large: large}
			}
			next.ServeHTTP(w, req)
		})
	}})
	if resp := h.send("/hooks/orders", "{}", "Idempotency-Key: k1"); resp.Status != 200 || len(resp.Body) != len(big) {
		t.Fatalf("first delivery: got %d with %d bytes, want 200 with %d", resp.Status, len(resp.Body), len(big))
	}
	replaying.Store(true)

	c := nonReadingSender(t, h, "k1")
	recv(t, large, "the large replay to reach the sender")

	wantCloseReturns(t, h, c, "for a replay to a sender that does not read")
}

// deadlineWriter is a ResponseWriter that supports write deadlines and
// reports, at each Write, whether the gateway had registered the write for
// Close to cut.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	deadlines  []time.Time
	registered func() bool
	wasCut     bool
}

func (w *deadlineWriter) SetWriteDeadline(t time.Time) error {
	w.deadlines = append(w.deadlines, t)
	return nil
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.wasCut = w.wasCut || w.registered()
	return w.ResponseRecorder.Write(p)
}

// TestReplayWriteIsBoundedAboveTheServersBuffer: net/http buffers an answer
// up to 2 KiB whole and writes it after the handler returned; a larger one
// is written from the handler, where a sender that pipelines requests and
// reads no answer blocks it. Those are written under a deadline Close can
// cut, which is cleared afterwards for the connection's next request.
func TestReplayWriteIsBoundedAboveTheServersBuffer(t *testing.T) {
	up := newUpstream(t, nil)
	r := genericRoute("orders", "/hooks/orders", up.URL)
	r.DuplicateResponse = Replay
	h := newHarness(t, Config{Routes: []Route{r}}, harnessOpts{})
	rt := h.gw.routes.Load().byName["orders"]
	for _, tc := range []struct {
		size      int
		wantBound bool
	}{
		{0, false},
		{bigReplay, false},
		{bigReplay + 1, true},
		{60 << 10, true},
	} {
		req := httptest.NewRequest(http.MethodPost, "/hooks/orders", nil)
		w := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
		w.registered = func() bool {
			h.gw.writing.mu.Lock()
			defer h.gw.writing.mu.Unlock()
			_, ok := h.gw.writing.writers[req]
			return ok
		}
		rec := dedup.Record{State: dedup.StateProcessed, Response: &dedup.Response{Status: 200, Body: bytes.Repeat([]byte("x"), tc.size)}}
		h.gw.answerDuplicate(w, req, &delivery{rt: rt, clientKey: "k"}, nil, rec)
		if bound := len(w.deadlines) > 0; bound != tc.wantBound || w.wasCut != tc.wantBound {
			t.Errorf("a %d-byte replay: got deadlines %v, registered for Close %v; want bound %v", tc.size, w.deadlines, w.wasCut, tc.wantBound)
		}
		if n := len(w.deadlines); tc.wantBound && (n != 2 || !w.deadlines[1].IsZero()) {
			t.Errorf("a %d-byte replay: got deadlines %v, want one and then a cleared one", tc.size, w.deadlines)
		}
	}
}
