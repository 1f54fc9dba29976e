package chat_test

import (
	"slices"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model/scripted"
)

// TestResentRequestReplaysItsTurn: a client that lost the answer to a
// request (its socket dropped) and sends the same request id again, on a
// new connection, gets that turn's stream and its end; the turn does not
// run again and the transcript is unchanged.
func TestResentRequestReplaysItsTurn(t *testing.T) {
	m := scripted.New()
	env, turns := startEnv(t, "", clockwork.NewFakeClock(), chat.Config{}, chatClass("Bot", &kit{model: m}))
	const path = "/agents/bot/resend"
	c1 := dialReady(t, env, path)
	c1.request("req-r", userMsgID("u-r", "hi"))
	first := c1.until(isDone("req-r"))
	turns.wait(t, "turn", "stream", "req-r")

	c2 := dialReady(t, env, path)
	c2.request("req-r", userMsgID("u-r", "hi"))
	again := c2.until(isDone("req-r"))

	bodies := func(fs []frame) []string {
		var out []string
		for _, f := range fs {
			if isResponse(f) && f.ID == "req-r" && f.Failed() {
				t.Fatalf("error frame for the re-sent request: %s", f.Raw)
			}
			if f.IsChatChunk() && f.ID == "req-r" {
				out = append(out, f.Body)
			}
		}
		return out
	}
	if b1, b2 := bodies(first), bodies(again); len(b1) == 0 || !slices.Equal(b1, b2) {
		t.Fatalf("re-sent request got chunks %q, want the turn's %q", b2, b1)
	}
	if d := again[len(again)-1]; d.Outcome != chat.OutcomeCompleted {
		t.Fatalf("re-sent request's end %s, want completed", d.Raw)
	}
	if n := len(m.Calls()); n != 1 {
		t.Fatalf("the model was called %d times, want once", n)
	}
	msgs := getMessages(t, env.HTTP.URL, path)
	if len(msgs) != 2 || msgs[0].ID != "u-r" || msgs[1].Role != message.RoleAssistant {
		t.Fatalf("transcript %s", dump(msgs))
	}
}
