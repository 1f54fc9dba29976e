package ids

import (
	"strings"
	"testing"
)

func TestSortedIncreases(t *testing.T) {
	prev := Sorted()
	for range 100000 {
		id := Sorted()
		if len(id) != SortedLen {
			t.Fatalf("len(%q) = %d, want %d", id, len(id), SortedLen)
		}
		if id <= prev {
			t.Fatalf("%q after %q: not increasing", id, prev)
		}
		prev = id
	}
}

func TestRandomShape(t *testing.T) {
	seen := map[string]bool{}
	for range 100000 {
		id := Random()
		if len(id) != RandomLen {
			t.Fatalf("len(%q) = %d, want %d", id, len(id), RandomLen)
		}
		if strings.Trim(id, alphabet) != "" {
			t.Fatalf("%q has a character outside the alphabet", id)
		}
		if seen[id] {
			t.Fatalf("%q twice", id)
		}
		seen[id] = true
	}
}

func TestAlphabetSorted(t *testing.T) {
	if len(alphabet) != 64 {
		t.Fatalf("alphabet has %d characters", len(alphabet))
	}
	for i := 1; i < len(alphabet); i++ {
		if alphabet[i-1] >= alphabet[i] {
			t.Fatalf("alphabet not in ASCII order at %d", i)
		}
	}
}
