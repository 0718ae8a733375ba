package redistest

import (
	"net"
	"testing"
)

// TestPingPIDRejectsForeignServer: Start must not accept a redis-server that
// is not its own process (a foreign server that took the port first), or a
// test would go on against a Redis it does not control.
func TestPingPIDRejectsForeignServer(t *testing.T) {
	s := Start(t)
	s.mu.Lock()
	pid := s.proc.cmd.Process.Pid
	s.mu.Unlock()
	if err := pingPID(s.Addr(), pid); err != nil {
		t.Errorf("pingPID(own pid %d): got %v, want nil", pid, err)
	}
	if err := pingPID(s.Addr(), pid+1); err == nil {
		t.Errorf("pingPID(foreign pid %d): got nil, want an error", pid+1)
	}
}

// TestStartSurvivesATakenPort: another process may take the port between
// freePort and redis-server's bind (go test runs packages side by side);
// the server then starts on another port instead of failing the test.
func TestStartSurvivesATakenPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().(*net.TCPAddr).Port
	first := true
	s := startServer(t, func() int {
		if first {
			first = false
			return taken
		}
		return freePort(t, false)
	}, nil)
	if s.Port() == taken {
		t.Fatalf("Port: got the taken %d, want another", taken)
	}
	if err := pingPID(s.Addr(), s.proc.cmd.Process.Pid); err != nil {
		t.Errorf("the server on its new port: %v", err)
	}
}
