package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// errExitedAtStart reports a server (a replica, redis-server) that exited
// before it answered.
var errExitedAtStart = errors.New("exited during start-up")

// lostPortRace reports whether err is a start that failed because another
// process held the port: go test runs packages side by side, and a port
// FreePort found free may be taken before the server binds it. logPath
// holds the failed attempt's output, which is then removed so that the next
// attempt's is read alone.
func lostPortRace(err error, logPath string) bool {
	if !errors.Is(err, errExitedAtStart) {
		return false
	}
	b, rerr := os.ReadFile(logPath)
	if rerr != nil || !bytes.Contains(bytes.ToLower(b), []byte("address already in use")) {
		return false
	}
	_ = os.Remove(logPath)
	return true
}
