//go:build !linux

package redistest

import "os/exec"

// setProcAttr does nothing outside Linux: there is no parent-death signal, and
// the test's cleanups alone stop the servers.
func setProcAttr(*exec.Cmd) {}
