//go:build !linux

package main

import (
	"errors"
	"syscall"
	"time"
)

// childAttr returns nil: only Linux can tie a child's life to the runner's.
func childAttr() *syscall.SysProcAttr { return nil }

// cpuTime is not implemented outside Linux.
func cpuTime(int) (time.Duration, error) {
	return 0, errors.New("cpu time is only measured on linux")
}

// hostCPU is not implemented outside Linux.
func hostCPU() (hostTimes, error) {
	return hostTimes{}, errors.New("host cpu time is only measured on linux")
}
