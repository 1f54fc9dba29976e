package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/examples/echochat"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/server"
)

// TestAuthToken runs test/npm/auth.mjs against a server that requires a
// token (server.RequireToken, as `agentry serve --auth-token`): the real
// AgentClient is refused with 4001 and gives up without the token, and with
// query {token} it connects and chats; get-messages is refused without the
// token and admitted with the socket's query or a Bearer header.
func TestAuthToken(t *testing.T) {
	const token = "e2e-s3cret"
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{echochat.Class(echochat.Options{})},
		Setup:   func(rt *agent.Runtime) error { chat.Configure(rt, chat.Config{}); return nil },
		Server:  server.Options{Authorize: server.RequireToken(token)},
	})
	runScript(t, 60*time.Second, "PASS auth", "auth.mjs", env.Host, token, "auth")
	// Only the admitted client's turn reached the agent.
	a, err := env.RT.Get(context.Background(), agent.Root("EchoChat", "auth"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(a.(interface{ Messages() []message.Message }).Messages()); n != 2 {
		t.Errorf("transcript has %d messages, want 2 (one turn)", n)
	}
}
