package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestScheduleInterleavesRounds: each round runs every workload over every
// target before the next round (A B C, A B C), and the first target rotates
// from round to round, so machine drift hits every target alike.
func TestScheduleInterleavesRounds(t *testing.T) {
	var got []string
	for _, st := range schedule(3, []string{"u", "d"}, 3) {
		got = append(got, fmt.Sprintf("%d%s%c", st.round, st.workload, 'A'+st.target))
	}
	want := "0uA 0uB 0uC 0dA 0dB 0dC 1uB 1uC 1uA 1dB 1dC 1dA 2uC 2uA 2uB 2dC 2dA 2dB"
	if g := strings.Join(got, " "); g != want {
		t.Errorf("schedule(3 rounds, u d, 3 targets):\n got %s\nwant %s", g, want)
	}
}
