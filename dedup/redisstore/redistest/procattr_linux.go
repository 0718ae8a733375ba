//go:build linux

package redistest

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill a started redis-server when the test
// binary dies without running its cleanups (a panic in another goroutine, a
// SIGKILL from `go test -timeout`), so no server outlives its test.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
