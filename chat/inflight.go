package chat

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/agentry/agentry/agent"
)

// DefaultMaxTurnsInFlight is Config.MaxTurnsInFlight's default: as many as
// the runtime's default of resident instances (agent.Options.MaxInstances),
// since every turn in flight holds its instance in memory.
const DefaultMaxTurnsInFlight = 10000

// ErrTooManyTurns refuses a client's chat request while
// Config.MaxTurnsInFlight turns are in flight on the runtime (the node).
var ErrTooManyTurns = errors.New("chat: too many turns in flight on this server")

// turnSlots counts the chat turns of one runtime, every instance's, from
// their acceptance (or their recovery at load) to their end.
type turnSlots struct{ n atomic.Int64 }

type turnSlotsKey struct{}

func turnSlotsOf(rt *agent.Runtime) *turnSlots {
	return rt.ValueOr(turnSlotsKey{}, func() any { return &turnSlots{} }).(*turnSlots)
}

// reserve takes a slot for a client's request unless max are taken (max
// <= 0: no limit). The caller gives it back with release unless a turn
// takes it over (turnSlot.adopt).
func (s *turnSlots) reserve(max int) bool {
	if max <= 0 {
		s.n.Add(1)
		return true
	}
	if s.n.Add(1) > int64(max) {
		s.n.Add(-1)
		return false
	}
	return true
}

func (s *turnSlots) release() { s.n.Add(-1) }

// InFlightTurns returns how many chat turns are in flight on rt: accepted
// or recovered, running or queued, and not ended.
func InFlightTurns(rt *agent.Runtime) int { return int(turnSlotsOf(rt).n.Load()) }

// turnSlot is a turn's hold on its runtime's count; it is given back once,
// whichever way the turn leaves (it ends, it is dropped from the queue by a
// cancel or a clear, or the runtime shuts down with it queued).
type turnSlot struct {
	slots *turnSlots
	once  sync.Once
}

// take counts the turn (a turn recovered at load).
func (ts *turnSlot) take(s *turnSlots) {
	s.n.Add(1)
	ts.slots = s
}

// adopt makes the turn hold a slot reserved for its request.
func (ts *turnSlot) adopt(s *turnSlots) { ts.slots = s }

// release gives the slot back; later calls do nothing.
func (ts *turnSlot) release() {
	ts.once.Do(func() {
		if ts.slots != nil {
			ts.slots.release()
		}
	})
}
