package chat

import (
	"context"
	"fmt"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/store"
)

// AppendMessages adds msgs to the transcript without running a turn (a
// status line, a notice) and tells every connection. A message whose id is
// already in the transcript is skipped, so appending is idempotent by id.
// It reports how many messages were added.
func (b *Base) AppendMessages(ctx context.Context, msgs []message.Message) (int, error) {
	c := b.c
	c.acceptMu.Lock()
	defer c.acceptMu.Unlock()
	c.mu.Lock()
	have := make(map[string]bool, len(c.msgs))
	for _, m := range c.msgs {
		have[m.ID] = true
	}
	base := len(c.msgs)
	c.mu.Unlock()
	var add []message.Message
	for _, m := range msgs {
		if m.ID == "" {
			m.ID = newID()
		}
		if have[m.ID] {
			continue
		}
		have[m.ID] = true
		add = append(add, m)
	}
	if len(add) == 0 {
		return 0, nil
	}
	plan, err := encodeMessages(base, add)
	if err != nil {
		return 0, fmt.Errorf("chat: append messages: %w", err)
	}
	err = c.b.DB().Update(ctx, func(tx store.Tx) error { return plan.apply(ctx, tx, c.iid) })
	c.stored.wrote(plan, err)
	if err != nil {
		return 0, fmt.Errorf("chat: append messages: %w", err)
	}
	c.mu.Lock()
	c.msgs = append(c.msgs, add...)
	c.mu.Unlock()
	c.broadcastTranscript(nil)
	return len(add), nil
}
