package chaos

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DelayProxy is an in-process TCP proxy that forwards every connection to a
// target address and can add a fixed delay to each chunk of data it relays, in
// both directions. Tests put it between the gateway and Redis to make the store
// slow without touching either. The zero delay relays at full speed.
//
// It can also throw away what the target answers (SetDropReplies): a lost
// reply, the command applied and its sender never told.
//
// When the target refuses a connection, DelayProxy closes the client's
// connection at once, so a stopped target looks stopped through the proxy.
type DelayProxy struct {
	target  string
	ln      net.Listener
	delay   atomic.Int64 // nanoseconds
	relays  atomic.Int64 // client connections being relayed
	drop    atomic.Bool  // throw away what the target sends
	dropped atomic.Int64 // chunks from the target thrown away

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool

	done chan struct{}
	wg   sync.WaitGroup
}

// NewDelayProxy listens on a free 127.0.0.1 port and relays to target. Close
// stops it and closes every relayed connection.
func NewDelayProxy(target string) (*DelayProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("delay proxy listen: %w", err)
	}
	p := &DelayProxy{
		target: target,
		ln:     ln,
		conns:  make(map[net.Conn]struct{}),
		done:   make(chan struct{}),
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *DelayProxy) Addr() string { return p.ln.Addr().String() }

// SetDelay sets the delay added before each relayed chunk. Zero removes it.
// Connections already open pick up the new delay with their next chunk.
func (p *DelayProxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Delay returns the current delay.
func (p *DelayProxy) Delay() time.Duration { return time.Duration(p.delay.Load()) }

// SetDropReplies makes the proxy read and throw away everything the target
// sends while on (what the client sends still reaches the target), and relay
// it again once off.
func (p *DelayProxy) SetDropReplies(on bool) { p.drop.Store(on) }

// DroppedReplies returns how many chunks from the target were thrown away.
func (p *DelayProxy) DroppedReplies() int64 { return p.dropped.Load() }

// Conns returns how many client connections are being relayed now.
func (p *DelayProxy) Conns() int { return int(p.relays.Load()) }

// DropConnections closes every relayed connection without stopping the
// listener, as a network blip would.
func (p *DelayProxy) DropConnections() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Close stops accepting, closes every relayed connection and waits for the
// relaying goroutines to end.
func (p *DelayProxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	err := p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *DelayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *DelayProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *DelayProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !p.track(c) {
			_ = c.Close()
			return
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

func (p *DelayProxy) relay(client net.Conn) {
	defer p.wg.Done()
	defer p.untrack(client)
	p.relays.Add(1)
	defer p.relays.Add(-1)
	d := net.Dialer{Timeout: time.Second}
	server, err := d.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		_ = server.Close()
		return
	}
	defer p.untrack(server)
	var inner sync.WaitGroup
	inner.Add(2)
	go func() { defer inner.Done(); p.pipe(server, client, false) }()
	go func() { defer inner.Done(); p.pipe(client, server, true) }()
	inner.Wait()
}

// pipe copies src to dst, waiting the current delay before each chunk; a
// chunk from the target (fromTarget) is thrown away while replies are
// dropped. When either side fails both are closed, so the opposite pipe ends
// too.
func (p *DelayProxy) pipe(dst, src net.Conn, fromTarget bool) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && fromTarget && p.drop.Load() {
			p.dropped.Add(1)
		} else if n > 0 {
			if d := p.Delay(); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-p.done:
					t.Stop()
					return
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or error: Redis's protocol never half-closes
		}
	}
}
