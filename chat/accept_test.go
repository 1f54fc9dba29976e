package chat_test

import (
	"context"
	"database/sql"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
)

// transcriptReads wraps a store.DB and counts the statements of write
// transactions that read the stored transcript (chat_messages).
type transcriptReads struct {
	store.DB
	n atomic.Int64
}

func (d *transcriptReads) Update(ctx context.Context, fn func(store.Tx) error) error {
	return d.DB.Update(ctx, func(tx store.Tx) error { return fn(readCountingTx{tx, d}) })
}

type readCountingTx struct {
	store.Tx
	d *transcriptReads
}

func (t readCountingTx) count(q string) {
	if strings.Contains(q, "FROM chat_messages") {
		t.d.n.Add(1)
	}
}

func (t readCountingTx) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	t.count(q)
	return t.Tx.Query(ctx, q, args...)
}

func (t readCountingTx) QueryRow(ctx context.Context, q string, args ...any) *sql.Row {
	t.count(q)
	return t.Tx.QueryRow(ctx, q, args...)
}

// TestAcceptanceComparesOutsideTheWriter: a client's chat request carries
// the whole transcript, which the server compares with the stored one
// before its write transaction: that transaction writes what differs and
// reads no stored message (the writer serves every instance, and a long
// transcript read there would hold up all of them). What is stored is
// the client's transcript and the answer, edits included.
func TestAcceptanceComparesOutsideTheWriter(t *testing.T) {
	reads := &transcriptReads{}
	env := testenv.Start(t, testenv.Options{
		Postgres: &pg,
		Clock:    clockwork.NewFakeClock(),
		Classes:  []agent.Class{chatClass("Bot", &kit{model: scripted.New()})},
		Setup:    func(rt *agent.Runtime) error { chat.Configure(rt, chat.Config{}); return nil },
		WrapDB: func(db store.DB) store.DB {
			reads.DB = db
			return reads
		},
	})
	const path = "/agents/bot/accept"
	c := dialReady(t, env, path)
	var msgs []message.Message
	for i, text := range []string{"one", "two", "three"} {
		msgs = append(msgs, userMsgID("u"+text, text))
		if i == 2 {
			// The client edited its first message meanwhile.
			msgs[0] = userMsgID("uone", "one, edited")
		}
		before := reads.n.Load()
		id := "req-" + text
		c.request(id, msgs...)
		c.until(isDone(id))
		if n := reads.n.Load() - before; n != 0 {
			t.Fatalf("turn %q: %d reads of the stored transcript in write transactions, want 0", text, n)
		}
		msgs = getMessages(t, env.HTTP.URL, path)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, string(m.Role)+": "+chat.MessageText(m))
	}
	want := []string{"user: one, edited", "assistant: You said: one", "user: two", "assistant: You said: two",
		"user: three", "assistant: You said: three"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stored transcript:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
