package testenv

import (
	"context"
	"fmt"

	"github.com/agentry/agentry/agent"
)

// Parker is an agent for flood tests and benchmarks: its park() call waits
// at an await point (agent.Await) until the test closes the class's
// release channel, so a client can pipeline many calls that are all in
// flight at once. ping() answers at once.
type Parker struct {
	agent.Base
	release <-chan struct{}
	parked  chan<- struct{}
}

// ParkerClass returns the Parker class. Each park() call signals parked
// (when not nil, without blocking if it is full) once it waits.
func ParkerClass(release <-chan struct{}, parked chan<- struct{}) agent.Class {
	return agent.Class{
		Name:     "Parker",
		New:      func() agent.Agent { return &Parker{release: release, parked: parked} },
		Callable: []string{"park", "ping"},
		Public:   true,
	}
}

// Park waits until the release channel is closed.
func (p *Parker) Park(ctx context.Context) (string, error) {
	err := agent.Await(ctx, func() error {
		if p.parked != nil {
			select {
			case p.parked <- struct{}{}:
			default:
			}
		}
		select {
		case <-p.release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	return "released", err
}

// Ping answers "pong".
func (p *Parker) Ping() string { return "pong" }

// Replayer is an agent for slow-reader tests and benchmarks: on connect it
// sends a big replay, Frames frames of about FrameBytes each, every one its
// own allocation as a real replay's are:
// {"type":"replay","i":<index>,"pad":"…"}.
type Replayer struct {
	agent.Base
	o ReplayOptions
}

// ReplayOptions configure ReplayerClass.
type ReplayOptions struct {
	Frames, FrameBytes int
	// Sent receives the connection id once the whole replay was queued
	// (or refused by the transport).
	Sent chan<- string
}

// ReplayerClass returns the Replayer class.
func ReplayerClass(o ReplayOptions) agent.Class {
	return agent.Class{Name: "Replayer", New: func() agent.Agent { return &Replayer{o: o} }, Public: true}
}

// OnConnect sends the replay.
func (r *Replayer) OnConnect(ctx context.Context, c *agent.Conn) error {
	pad := max(r.o.FrameBytes-40, 0)
	for i := range r.o.Frames {
		b := fmt.Appendf(make([]byte, 0, pad+48), `{"type":"replay","i":%d,"pad":"`, i)
		for range pad {
			b = append(b, 'x')
		}
		c.SendRaw(append(b, `"}`...))
	}
	if r.o.Sent != nil {
		r.o.Sent <- c.ID()
	}
	return nil
}
