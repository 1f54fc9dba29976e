//go:build race

package toolcrash

// raceEnabled builds the server under test with the race detector too.
const raceEnabled = true
