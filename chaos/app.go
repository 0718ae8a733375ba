package chaos

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// AppConfig sets how often the upstream App fails on purpose. Each request
// draws one fate: 5xx, slow, reset or a normal 2xx.
type AppConfig struct {
	// FailRate is the fraction of requests answered 503. Zero means none.
	FailRate float64
	// SlowRate is the fraction of requests answered only after SlowDelay,
	// which should exceed the gateway's upstream_timeout. Zero means none.
	SlowRate float64
	// SlowDelay is how long a slow request waits before answering 2xx. A slow
	// request whose client goes away first is abandoned and not processed, as
	// an application that commits its work only when it answers would do.
	// Zero means 3s.
	SlowDelay time.Duration
	// Delay, when set, is how long every request not failed on purpose
	// waits before it is answered (abandoned if the client goes away first).
	Delay time.Duration
	// OnRequest, when set, is called with the event ID of every request
	// before it is answered (tests use it to change the world mid-flight).
	OnRequest func(id string)
	// ResetRate is the fraction of requests whose connection is reset without
	// an answer (and without processing). Zero means none.
	ResetRate float64
	// Seed seeds the fate draws. Runs with the same seed draw the same
	// sequence (the interleaving of requests still varies).
	Seed uint64
	// Body, when set, returns the body the simulator sends for an event ID;
	// the App then counts every request whose body differs (the gateway must
	// forward bodies byte for byte).
	Body func(id string) []byte
	// Namespace is the route namespace the App expects in Dedup-Key
	// ("<namespace>:<event id>"). Empty disables the check.
	Namespace string
}

// Processing is one time the App answered 2xx to an event: the App's record
// of having done the work.
type Processing struct {
	At time.Time
	// Via is the X-Forwarded-Host the gateway set: the replica's address.
	Via string
	// Incarnation is the replica process that forwarded the request, from
	// a /i<n>/ upstream path prefix (see IncarnationPlaceholder); 0 when
	// the path has none.
	Incarnation int
	// DedupKey is the Dedup-Key header the gateway sent.
	DedupKey string
}

// AppStats counts what the App saw.
type AppStats struct {
	Requests, Processed, Failed5xx, Resets int
	SlowAbandoned, SlowCompleted           int
	// BadBody counts requests whose body differed from the one sent.
	BadBody int
	// BadDedupKey counts requests whose Dedup-Key header was missing or wrong.
	BadDedupKey int
	// NoID counts requests whose body had no JSON "id".
	NoID int
}

// App is the upstream application behind the gateway: an httptest server on
// 127.0.0.1 that records every event it processed and fails on purpose.
type App struct {
	cfg AppConfig
	srv *httptest.Server

	mu        sync.Mutex
	rng       *rand.Rand
	processed map[string][]Processing
	stats     AppStats
}

// NewApp starts the App. Close stops it.
func NewApp(cfg AppConfig) *App {
	if cfg.SlowDelay == 0 {
		cfg.SlowDelay = 3 * time.Second
	}
	a := &App{
		cfg:       cfg,
		rng:       rand.New(rand.NewPCG(cfg.Seed, 0xa99)),
		processed: make(map[string][]Processing),
	}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serveHTTP))
	return a
}

// URL is the App's base URL, for the gateway route's upstream.
func (a *App) URL() string { return a.srv.URL }

// CloseClientConnections closes the gateway's idle and active connections to
// the App, so a leak check on the gateway does not count them.
func (a *App) CloseClientConnections() { a.srv.CloseClientConnections() }

// Close stops the App, abandoning slow requests still waiting.
func (a *App) Close() {
	a.srv.CloseClientConnections()
	a.srv.Close()
}

type fate int

const (
	fateOK fate = iota
	fate5xx
	fateSlow
	fateReset
)

func (a *App) draw() fate {
	a.mu.Lock()
	defer a.mu.Unlock()
	x := a.rng.Float64()
	switch {
	case x < a.cfg.FailRate:
		return fate5xx
	case x < a.cfg.FailRate+a.cfg.SlowRate:
		return fateSlow
	case x < a.cfg.FailRate+a.cfg.SlowRate+a.cfg.ResetRate:
		return fateReset
	}
	return fateOK
}

func (a *App) count(f func(s *AppStats)) {
	a.mu.Lock()
	f(&a.stats)
	a.mu.Unlock()
}

func (a *App) serveHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	a.count(func(s *AppStats) { s.Requests++ })
	if err != nil {
		return // the gateway went away mid-body: nothing processed
	}
	var ev struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(body, &ev) != nil || ev.ID == "" {
		a.count(func(s *AppStats) { s.NoID++ })
		http.Error(w, "no event id", http.StatusBadRequest)
		return
	}
	if a.cfg.Body != nil && string(a.cfg.Body(ev.ID)) != string(body) {
		a.count(func(s *AppStats) { s.BadBody++ })
	}
	dk := r.Header.Get("Dedup-Key")
	if a.cfg.Namespace != "" && dk != a.cfg.Namespace+":"+ev.ID {
		a.count(func(s *AppStats) { s.BadDedupKey++ })
	}

	if a.cfg.OnRequest != nil {
		a.cfg.OnRequest(ev.ID)
	}
	switch a.draw() {
	case fate5xx:
		a.count(func(s *AppStats) { s.Failed5xx++ })
		http.Error(w, "injected failure", http.StatusServiceUnavailable)
		return
	case fateReset:
		a.count(func(s *AppStats) { s.Resets++ })
		reset(w)
		return
	case fateSlow:
		t := time.NewTimer(a.cfg.SlowDelay)
		select {
		case <-r.Context().Done():
			t.Stop()
			a.count(func(s *AppStats) { s.SlowAbandoned++ })
			return
		case <-t.C:
			a.count(func(s *AppStats) { s.SlowCompleted++ })
		}
	}

	if a.cfg.Delay > 0 {
		t := time.NewTimer(a.cfg.Delay)
		select {
		case <-r.Context().Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	a.mu.Lock()
	a.processed[ev.ID] = append(a.processed[ev.ID], Processing{
		At:          time.Now(),
		Via:         r.Header.Get("X-Forwarded-Host"),
		Incarnation: incarnationOf(r.URL.Path),
		DedupKey:    dk,
	})
	a.stats.Processed++
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, `{"received":true}`)
}

// reset hijacks the connection and closes it with an RST.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	c, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// Processed returns, per event ID, every time the App answered it 2xx, in
// order.
func (a *App) Processed() map[string][]Processing {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string][]Processing, len(a.processed))
	for id, ps := range a.processed {
		cp := append([]Processing(nil), ps...)
		sort.Slice(cp, func(i, j int) bool { return cp[i].At.Before(cp[j].At) })
		out[id] = cp
	}
	return out
}

// Stats returns the App's counters.
func (a *App) Stats() AppStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// incarnationOf reads n from a path starting /i<n>/ (a replica's upstream
// path, see IncarnationPlaceholder), or returns 0.
func incarnationOf(path string) int {
	rest, ok := strings.CutPrefix(path, "/i")
	if !ok {
		return 0
	}
	digits, _, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(digits)
	if err != nil || n < 0 {
		return 0
	}
	return n
}
