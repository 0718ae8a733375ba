//go:build !race

package main

// raceEnabled reports whether the race detector is on; it changes allocation counts.
const raceEnabled = false
