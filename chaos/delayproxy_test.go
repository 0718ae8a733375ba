package chaos

import (
	"bufio"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// echoServer answers each line with the same line until the client closes.
func echoServer(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln
}

func TestDelayProxy(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln := echoServer(t)
	defer ln.Close()
	p, err := NewDelayProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	tests := []struct {
		name    string
		delay   time.Duration
		atLeast time.Duration
	}{
		{"no delay", 0, 0},
		// One chunk each way: the round trip pays the delay twice.
		{"100ms per chunk", 100 * time.Millisecond, 200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p.SetDelay(tt.delay)
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			start := time.Now()
			if _, err := c.Write([]byte("ping\n")); err != nil {
				t.Fatal(err)
			}
			got, err := bufio.NewReader(c).ReadString('\n')
			took := time.Since(start)
			if err != nil {
				t.Fatalf("read echo: %v", err)
			}
			if got != "ping\n" {
				t.Errorf("got %q, want %q", got, "ping\n")
			}
			if took < tt.atLeast {
				t.Errorf("round trip took %s, want at least %s", took, tt.atLeast)
			}
		})
	}
}

func TestDelayProxyTargetDown(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	for attempt := 1; ; attempt++ {
		target, n, err := readThroughProxyToFreePort(t)
		timedOut := false
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			timedOut = true
		}
		// go test runs packages side by side: another package's server may
		// take the port FreePort found free before the proxy dials it, and
		// the proxy then relays to it. Try another port then.
		if timedOut && attempt < 3 && listening(target) {
			t.Logf("attempt %d: %s was taken meanwhile; trying another port", attempt, target)
			continue
		}
		if err == nil || n != 0 {
			t.Errorf("got %d bytes, err %v from a proxy whose target is down, want 0 bytes and the connection closed", n, err)
		}
		if timedOut {
			t.Errorf("got a read timeout, want the proxy to close the connection at once")
		}
		return
	}
}

// readThroughProxyToFreePort reads from a DelayProxy to a port FreePort
// found free, for up to 5s, and returns the port's address and what the
// read returned.
func readThroughProxyToFreePort(t *testing.T) (target string, n int, err error) {
	t.Helper()
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	target = net.JoinHostPort("127.0.0.1", itoa(port))
	p, err := NewDelayProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err = c.Read(make([]byte, 1))
	return target, n, err
}

// listening reports whether something accepts connections on addr.
func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func TestDelayProxyCloseEndsConnections(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln := echoServer(t)
	defer ln.Close()
	p, err := NewDelayProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.SetDelay(time.Hour) // a relay stuck in its delay must still stop on Close
	if _, err := c.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5s with a relay waiting on its delay")
	}
}

// TestDelayProxyDropReplies: while replies are dropped, what the client sends
// still reaches the target and the target's answer never reaches the client;
// once they pass again, the next answer does.
func TestDelayProxyDropReplies(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ln := echoServer(t)
	defer ln.Close()
	p, err := NewDelayProxy(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)

	p.SetDropReplies(true)
	if _, err := c.Write([]byte("lost\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.DroppedReplies() == 0 { // the echo came back and was thrown away
		if time.Now().After(deadline) {
			t.Fatal("no reply dropped within 5s")
		}
		time.Sleep(time.Millisecond)
	}
	p.SetDropReplies(false)
	if _, err := c.Write([]byte("kept\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := r.ReadString('\n')
	if err != nil || got != "kept\n" {
		t.Errorf("after replies pass again: got %q, %v, want %q (the dropped %q never arrives)", got, err, "kept\n", "lost\n")
	}
}
