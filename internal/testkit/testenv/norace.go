//go:build !race

package testenv

// Race reports whether the tests run with the race detector (-race), so
// that a server they build and start can be built with it too.
const Race = false
