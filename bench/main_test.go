package main

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain lets the test binary play the runner's child roles, so the process
// tests start real children the way the runner does, and checks that no test
// leaks a goroutine.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == roleUpstream || os.Args[1] == roleBareProxy) {
		if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}
