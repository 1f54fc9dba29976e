package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// noticeChat streams a reply in two halves and waits between them for the
// script's finish call; its notice callable appends a notice line (like an
// agent tool's milestone notice) while the reply streams.
type noticeChat struct {
	chat.Base
	finish chan struct{}
}

// The reply noticeChat streams, and the notice it appends.
const (
	noticeReplyHead = "Working on it"
	noticeReplyTail = ": the research is done."
	noticeID        = "notice-1"
	noticeText      = `Background task "Researcher" (run r-1) reached milestone "sources-gathered".`
)

func (n *noticeChat) OnChatMessage(ctx context.Context, t *chat.Turn) error {
	id := "reply"
	for _, ch := range []message.Chunk{message.TextStart(id), message.TextDelta(id, noticeReplyHead)} {
		if err := t.Write(ch); err != nil {
			return err
		}
	}
	// Waiting inside a handler is an await point: the agent takes its
	// RPCs (notice, finish) meanwhile.
	err := agent.Await(ctx, func() error {
		select {
		case <-n.finish:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		return err
	}
	for _, ch := range []message.Chunk{message.TextDelta(id, noticeReplyTail), message.TextEnd(id)} {
		if err := t.Write(ch); err != nil {
			return err
		}
	}
	return nil
}

// Notice appends the notice and returns how many messages were added.
func (n *noticeChat) Notice(ctx context.Context) (int, error) {
	return n.AppendMessages(ctx, []message.Message{{ID: noticeID, Role: message.RoleAssistant,
		Parts: []message.Part{{Type: message.PartText, Text: noticeText}}}})
}

// Finish lets the streaming reply end; it returns once the turn took it.
func (n *noticeChat) Finish(ctx context.Context) (ok bool, err error) {
	err = agent.Await(ctx, func() error {
		select {
		case n.finish <- struct{}{}:
			ok = true
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	return ok, err
}

// TestNoticeDuringTurnAfterReply runs test/npm/notice.mjs: a notice
// appended with AppendMessages while a reply streams never shows above
// that reply. No transcript broadcast during the turn lists the notice
// without the streaming reply before it, and at the end the streaming tab,
// another tab and the stored transcript all read user, reply, notice.
func TestNoticeDuringTurnAfterReply(t *testing.T) {
	finish := make(chan struct{})
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{{Name: "NoticeChat", New: func() agent.Agent { return &noticeChat{finish: finish} },
			Callable: []string{"notice", "finish"}, Public: true}},
		Setup: func(rt *agent.Runtime) error { chat.Configure(rt, chat.Config{}); return nil },
	})
	runScript(t, 60*time.Second, "PASS notice", "notice.mjs", env.Host, "notice-e2e")
	a, err := env.RT.Get(context.Background(), agent.Root("NoticeChat", "notice-e2e"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := a.(*noticeChat).Messages()
	if len(msgs) != 3 || msgs[0].Role != message.RoleUser || chat.MessageText(msgs[1]) != noticeReplyHead+noticeReplyTail || msgs[2].ID != noticeID {
		t.Errorf("stored transcript = %+v; want user, reply, notice", msgs)
	}
}
