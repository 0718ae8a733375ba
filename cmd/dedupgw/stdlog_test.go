package main

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestStdLogKeepsPeerBytesOut: an upstream that sends bytes past its
// response (here a 204 with a body) makes net/http's Transport log them
// through the standard library's logger; the gateway logs the line as JSON
// at warn, without the bytes, which may be a body.
func TestStdLogKeepsPeerBytesOut(t *testing.T) {
	const secret = `{"card":"4111111111111111"}`
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		req, err := http.ReadRequest(r)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		_, _ = io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n"+secret)
		_, _ = r.ReadByte() // until the gateway closes the connection
	}()
	t.Cleanup(func() { ln.Close(); <-served })

	p := startInProcess(t, gwConfig(t, t.TempDir(), "http://"+ln.Addr().String(), "", ""))
	if a := deliver(t, "http://"+p.addr+"/hooks/orders", "evt_1", "{}"); a.status != http.StatusNoContent {
		t.Errorf("delivery: got %d, want the upstream's 204", a.status)
	}
	var line string
	eventually(t, 10*time.Second, func() bool {
		for _, e := range p.logs.FilterLoggerName("stdlib").All() {
			if strings.Contains(e.Message, "Unsolicited response") {
				line = e.Message
				return true
			}
		}
		return false
	}, func() string { return "net/http's line about the unsolicited bytes, in the gateway's log" })
	if strings.Contains(line, "4111") || !strings.Contains(line, "the bytes are not logged") {
		t.Errorf("logged %q, want the line without the upstream's bytes", line)
	}
	if err := p.stop(); err != nil {
		t.Errorf("run: got %v, want nil", err)
	}
}

// TestStdLogMessage: the peer's bytes net/http quotes are cut, the newline
// dropped and a long line bounded.
func TestStdLogMessage(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Unsolicited response received on idle HTTP channel starting with \"{\\\"card\\\":1}\"; err=<nil>\n",
			"Unsolicited response received on idle HTTP channel (the bytes are not logged)"},
		{"http: some other line\n", "http: some other line"},
		{strings.Repeat("x", maxStdLogLine+10), strings.Repeat("x", maxStdLogLine) + "…"},
	}
	for _, tt := range tests {
		if got := stdLogMessage(tt.in); got != tt.want {
			t.Errorf("stdLogMessage(%q): got %q, want %q", tt.in, got, tt.want)
		}
	}
}
