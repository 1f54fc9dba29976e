//go:build !race

package toolcrash

const raceEnabled = false
