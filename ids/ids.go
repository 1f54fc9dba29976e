// Package ids makes the short identifiers that Agentry puts on the wire:
// run ids, stream and message ids, part ids. They are shorter than UUIDs
// (every agent-tool frame carries a run id, and every chunk of a text part
// its part id), and use only the URL-safe characters A–Z, a–z, 0–9, '-' and
// '_', so that they can name instances in URL paths.
package ids

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/google/uuid"
)

// alphabet is in ASCII order, so that fixed-width ids compare as their
// values do.
const alphabet = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"

// SortedLen and RandomLen are the lengths of the two kinds of id.
const (
	SortedLen = 16
	RandomLen = 12
)

// Sorted returns a 16-character id that sorts after every id Sorted returned
// before in this process (and before ids made later than it in other
// processes, to the millisecond). It holds the first 96 bits of a version 7
// UUID: a 48-bit Unix time in milliseconds, a 12-bit sequence that keeps the
// ids of one process strictly increasing, and 30 random bits.
func Sorted() string {
	u, err := uuid.NewV7()
	if err != nil {
		// No randomness: the order matters more than the random bits.
		u = uuid.Must(uuid.NewRandom())
	}
	hi := binary.BigEndian.Uint64(u[0:8])
	lo := uint64(binary.BigEndian.Uint32(u[8:12]))
	var b [SortedLen]byte
	// 96 bits in 16 groups of 6, most significant first: 10 groups from
	// hi's first 60 bits, 1 from hi's last 4 and lo's first 2, 5 from lo.
	for i := range 10 {
		b[i] = alphabet[(hi>>(58-6*i))&63]
	}
	b[10] = alphabet[((hi&15)<<2)|(lo>>30)]
	for i := range 5 {
		b[11+i] = alphabet[(lo>>(24-6*i))&63]
	}
	return string(b[:])
}

// Random returns a 12-character id of 72 random bits (a collision is
// expected after about 2^36 ids).
func Random() string {
	var r [RandomLen]byte
	if _, err := rand.Read(r[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	for i, v := range r {
		r[i] = alphabet[v&63]
	}
	return string(r[:])
}
