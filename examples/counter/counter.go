// Package counter is the runtime's demo agent: a durable counter with
// callable methods, a streaming method, a schedule and a sub-agent gate.
package counter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/agentry/agentry/agent"
)

// State is the Counter's synced state.
type State struct {
	Count int `json:"count"`
}

// Counter is a durable counter. Clients call increment(by), get(),
// countTo(n) (streaming) and incrementLater(seconds, by) (a durable
// schedule), and may set the state {count} themselves. It admits child
// Counters whose names start with "ok-".
type Counter struct {
	agent.Base
}

// Class registers Counter with a runtime.
func Class() agent.Class {
	return agent.Class{
		Name:     "Counter",
		New:      func() agent.Agent { return &Counter{} },
		Callable: []string{"increment", "get", "countTo", "incrementLater"},
		Public:   true,
	}
}

// Increment adds by to the count and returns the new count. It takes no
// lock: the runtime runs one input of an agent at a time.
func (c *Counter) Increment(ctx context.Context, by int) (int, error) {
	var s State
	if err := c.DecodeState(&s); err != nil {
		return 0, err
	}
	s.Count += by
	if err := c.SetState(ctx, s); err != nil {
		return 0, err
	}
	return s.Count, nil
}

// Get returns the current count.
func (c *Counter) Get(ctx context.Context) (int, error) {
	var s State
	err := c.DecodeState(&s)
	return s.Count, err
}

// CountTo streams 1..n and returns n.
func (c *Counter) CountTo(ctx context.Context, s *agent.Stream, n int) (int, error) {
	if n < 0 || n > 10000 {
		return 0, agent.Publicf("n must be between 0 and 10000")
	}
	for i := 1; i <= n; i++ {
		if err := s.Send(i); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// IncrementLater schedules an increment by by after the given number of
// seconds and returns the schedule id.
func (c *Counter) IncrementLater(ctx context.Context, seconds float64, by int) (string, error) {
	sc, err := c.ScheduleAfter(ctx, time.Duration(seconds*float64(time.Second)), "ScheduledIncrement", by)
	if err != nil {
		return "", err
	}
	return sc.ID, nil
}

// ScheduledIncrement is the schedule callback of IncrementLater.
func (c *Counter) ScheduledIncrement(ctx context.Context, by int) error {
	_, err := c.Increment(ctx, by)
	return err
}

// ValidateState accepts a state sent by a client (useAgent's setState) when
// it is exactly a State with a count between -1e9 and 1e9: without this
// hook the runtime refuses every client state write.
func (c *Counter) ValidateState(ctx context.Context, next json.RawMessage, from *agent.Conn) error {
	var s State
	dec := json.NewDecoder(bytes.NewReader(next))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("counter state: %w", err)
	}
	if s.Count < -1e9 || s.Count > 1e9 {
		return fmt.Errorf("counter state: count %d out of range", s.Count)
	}
	return nil
}

// OnBeforeSubAgent admits child Counters whose names start with "ok-".
func (c *Counter) OnBeforeSubAgent(ctx context.Context, r *http.Request, class, name string) error {
	if class == "Counter" && strings.HasPrefix(name, "ok-") {
		return nil
	}
	return &agent.HTTPError{Status: http.StatusNotFound, Message: "no such sub-agent"}
}
