package main

import "syscall"

// childAttr makes the kernel kill a child when the runner dies, so an
// interrupted run leaves no server behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
