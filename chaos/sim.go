package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Answer is what one HTTP attempt got back.
type Answer struct {
	// Status is the HTTP status, 0 when the attempt failed without an answer.
	Status int
	// DedupStatus is the gateway's Dedup-Status header.
	DedupStatus string
	// Target is the base URL the attempt went to.
	Target string
	// Err is the transport error when Status is 0.
	Err error
}

// Sender delivers one attempt of an event. Implementations must be safe for
// concurrent use.
type Sender interface {
	Send(ctx context.Context, body []byte) Answer
}

// RoundRobin is a Sender that spreads attempts over several gateway replicas
// in turn, like a load balancer. When a replica refuses the connection (it is
// down) the same attempt moves on to the next one; any other failure is
// returned to the simulator, which retries later as a provider would.
type RoundRobin struct {
	// URLs are the replicas' delivery URLs (…/webhooks/stripe).
	URLs []string
	// Client sends the requests. Nil means a client with a 5s timeout and its
	// own transport; call CloseIdleConnections when done.
	Client *http.Client

	next atomic.Uint64
	once sync.Once
}

// NewRoundRobin returns a RoundRobin over urls with its own HTTP client whose
// attempts time out after timeout.
func NewRoundRobin(timeout time.Duration, urls ...string) *RoundRobin {
	return &RoundRobin{
		URLs: urls,
		Client: &http.Client{
			Timeout: timeout,
			Transport: &http.Transport{
				MaxIdleConnsPerHost: 64,
				IdleConnTimeout:     5 * time.Second,
			},
		},
	}
}

// CloseIdleConnections closes the client's idle keep-alive connections so no
// goroutine outlives the run.
func (rr *RoundRobin) CloseIdleConnections() { rr.Client.CloseIdleConnections() }

// Send implements Sender.
func (rr *RoundRobin) Send(ctx context.Context, body []byte) Answer {
	start := rr.next.Add(1)
	var last Answer
	for i := range len(rr.URLs) {
		url := rr.URLs[(int(start)+i)%len(rr.URLs)]
		last = post(ctx, rr.Client, url, body)
		if last.Status != 0 || !errors.Is(last.Err, syscall.ECONNREFUSED) {
			return last
		}
	}
	return last
}

func post(ctx context.Context, c *http.Client, url string, body []byte) Answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return Answer{Target: url, Err: err}
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	resp, err := c.Do(req)
	if err != nil {
		return Answer{Target: url, Err: err}
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	a := Answer{Status: resp.StatusCode, DedupStatus: resp.Header.Get("Dedup-Status"), Target: url}
	if err != nil && resp.StatusCode/100 == 2 {
		// A 2xx whose body broke off is not a success for a provider.
		return Answer{Target: url, Err: fmt.Errorf("read answer: %w", err)}
	}
	return a
}

// SimConfig shapes a simulated provider's traffic. Zero values take the
// defaults noted.
type SimConfig struct {
	// Events is how many distinct events are delivered.
	Events int
	// Rate is events started per second. Zero means 50.
	Rate float64
	// DuplicateRate is the fraction of events resent once after they got a
	// 2xx (spontaneous duplicates). Zero means none.
	DuplicateRate float64
	// DuplicateDelay bounds the random wait before a spontaneous duplicate.
	// Zero means 500ms.
	DuplicateDelay time.Duration
	// BurstRate is the fraction of events whose first delivery is BurstSize
	// copies sent at once. Zero means none.
	BurstRate float64
	// BurstSize is the number of concurrent copies in a burst. Zero means 5.
	BurstSize int
	// BackoffMin and BackoffMax bound the exponential backoff between
	// attempts of a delivery without a 2xx. Zero means 50ms and 1s.
	BackoffMin, BackoffMax time.Duration
	// Seed seeds every random choice.
	Seed uint64
	// IDPrefix prefixes event IDs so runs never share keys. Zero means "evt_".
	IDPrefix string
}

// Attempt is one HTTP attempt of one copy of an event.
type Attempt struct {
	At      time.Time
	Latency time.Duration
	Answer  Answer
}

// Event is the simulator's record of one event.
type Event struct {
	ID string
	// Copies is how many times the provider delivered the event: 1, plus the
	// extra copies of a burst, plus a spontaneous duplicate.
	Copies int
	// Attempts lists every HTTP attempt of every copy, in the order they ended.
	Attempts []Attempt
	// FirstOK is when the event first got a 2xx; zero if it never did.
	FirstOK time.Time
	// Unfinished counts copies that never got a 2xx before the run ended.
	Unfinished int
	// Retries counts attempts beyond the first of each copy.
	Retries int
}

// Simulator delivers events like a webhook provider: steady rate, retries with
// exponential backoff until a 2xx, spontaneous duplicates and concurrent
// bursts.
type Simulator struct {
	cfg  SimConfig
	send Sender

	mu     sync.Mutex
	rng    *rand.Rand
	events []*Event
}

// NewSimulator returns a Simulator that delivers through send.
func NewSimulator(cfg SimConfig, send Sender) *Simulator {
	if cfg.Rate == 0 {
		cfg.Rate = 50
	}
	if cfg.DuplicateDelay == 0 {
		cfg.DuplicateDelay = 500 * time.Millisecond
	}
	if cfg.BurstSize == 0 {
		cfg.BurstSize = 5
	}
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = 50 * time.Millisecond
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = time.Second
	}
	if cfg.IDPrefix == "" {
		cfg.IDPrefix = "evt_"
	}
	return &Simulator{cfg: cfg, send: send, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed))}
}

// EventID returns the ID of event i.
func (s *Simulator) EventID(i int) string { return fmt.Sprintf("%s%06d", s.cfg.IDPrefix, i) }

// Body returns the Stripe-shaped JSON body of the event with the given ID. It
// is a pure function of the ID, so the upstream can check it arrived intact.
func Body(id string) []byte {
	return fmt.Appendf(nil, `{"id":%q,"object":"event","api_version":"2024-06-20","type":"charge.succeeded","livemode":false,"data":{"object":{"id":"ch_%s","object":"charge","amount":1999,"currency":"eur"}}}`, id, id)
}

func (s *Simulator) float() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.Float64()
}

// Run delivers every event and returns when every copy got a 2xx or ctx ends,
// whichever comes first; copies cut short by ctx are counted as unfinished.
// Every goroutine Run starts has ended when it returns.
func (s *Simulator) Run(ctx context.Context) []*Event {
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) / s.cfg.Rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	s.events = make([]*Event, s.cfg.Events)
	for i := range s.cfg.Events {
		ev := &Event{ID: s.EventID(i)}
		s.events[i] = ev
		copies := 1
		if s.float() < s.cfg.BurstRate {
			copies = s.cfg.BurstSize
		}
		dup := s.float() < s.cfg.DuplicateRate
		ev.Copies = copies
		if dup {
			ev.Copies++
		}
		body := Body(ev.ID)
		// The burst's copies start together; the spontaneous duplicate
		// follows the first copy that succeeds.
		var okOnce sync.Once
		for range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if !s.deliver(ctx, ev, body) || !dup {
					return
				}
				okOnce.Do(func() {
					wait := time.Duration(s.float() * float64(s.cfg.DuplicateDelay))
					wg.Add(1)
					go func() {
						defer wg.Done()
						t := time.NewTimer(wait)
						defer t.Stop()
						select {
						case <-ctx.Done():
							s.mu.Lock()
							ev.Unfinished++
							s.mu.Unlock()
							return
						case <-t.C:
						}
						s.deliver(ctx, ev, body)
					}()
				})
			}()
		}
		if i == s.cfg.Events-1 {
			break
		}
		select {
		case <-ctx.Done():
			// Events never started are returned without attempts: the
			// report counts them as lost.
			for j := i + 1; j < s.cfg.Events; j++ {
				s.events[j] = &Event{ID: s.EventID(j), Copies: 1, Unfinished: 1}
			}
			wg.Wait()
			return s.events
		case <-tick.C:
		}
	}
	wg.Wait()
	return s.events
}

// deliver sends one copy until it gets a 2xx or ctx ends, and reports whether
// it got one.
func (s *Simulator) deliver(ctx context.Context, ev *Event, body []byte) bool {
	for n := 0; ; n++ {
		start := time.Now()
		ans := s.send.Send(ctx, body)
		end := time.Now()
		ok := ans.Status/100 == 2
		s.mu.Lock()
		ev.Attempts = append(ev.Attempts, Attempt{At: start, Latency: end.Sub(start), Answer: ans})
		if n > 0 {
			ev.Retries++
		}
		if ok && ev.FirstOK.IsZero() {
			ev.FirstOK = end
		}
		if !ok && ctx.Err() != nil {
			ev.Unfinished++
		}
		s.mu.Unlock()
		if ok {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		back := min(s.cfg.BackoffMax, s.cfg.BackoffMin<<min(n, 20))
		back = time.Duration(float64(back) * (0.5 + 0.5*s.float()))
		t := time.NewTimer(back)
		select {
		case <-ctx.Done():
			t.Stop()
			s.mu.Lock()
			ev.Unfinished++
			s.mu.Unlock()
			return false
		case <-t.C:
		}
	}
}
