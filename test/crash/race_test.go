//go:build race

package crash

// raceEnabled builds the server under test with the race detector too, when
// the tests themselves run with -race.
const raceEnabled = true
