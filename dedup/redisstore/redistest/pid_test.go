package redistest

import "testing"

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
