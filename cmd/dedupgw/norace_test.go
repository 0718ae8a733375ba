//go:build !race

package main

// raceEnabled reports whether the tests run with -race; the end-to-end
// binary is then built with -race too.
const raceEnabled = false
