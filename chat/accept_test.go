package chat_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
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

// transcriptWatch wraps a store.DB: it counts the statements that read
// the stored transcript (chat_messages), in write transactions (writeReads)
// and in read transactions (viewReads), and, once fail is set, fails the
// next write transaction that writes a message (after its statements ran:
// it rolls back).
type transcriptWatch struct {
	store.DB
	writeReads, viewReads atomic.Int64
	fail                  atomic.Bool
}

func (d *transcriptWatch) View(ctx context.Context, fn func(store.Tx) error) error {
	return d.DB.View(ctx, func(tx store.Tx) error { return fn(&watchedTx{Tx: tx, reads: &d.viewReads}) })
}

func (d *transcriptWatch) Update(ctx context.Context, fn func(store.Tx) error) error {
	return d.DB.Update(ctx, func(tx store.Tx) error {
		wt := &watchedTx{Tx: tx, reads: &d.writeReads}
		if err := fn(wt); err != nil {
			return err
		}
		if wt.wroteMessage && d.fail.CompareAndSwap(true, false) {
			return errors.New("injected: the transaction that writes a message fails")
		}
		return nil
	})
}

type watchedTx struct {
	store.Tx
	reads        *atomic.Int64
	wroteMessage bool
}

func (t *watchedTx) count(q string) {
	if strings.Contains(q, "FROM chat_messages") {
		t.reads.Add(1)
	}
}

func (t *watchedTx) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	t.count(q)
	return t.Tx.Query(ctx, q, args...)
}

func (t *watchedTx) QueryRow(ctx context.Context, q string, args ...any) *sql.Row {
	t.count(q)
	return t.Tx.QueryRow(ctx, q, args...)
}

func (t *watchedTx) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if strings.Contains(q, "INTO chat_messages") {
		t.wroteMessage = true
	}
	return t.Tx.Exec(ctx, q, args...)
}

// startWatched starts a server with a Bot chat class on a watched
// database.
func startWatched(t *testing.T) (*testenv.Env, *transcriptWatch) {
	t.Helper()
	db := &transcriptWatch{}
	env := testenv.Start(t, testenv.Options{
		Postgres: &pg,
		Clock:    clockwork.NewFakeClock(),
		Classes:  []agent.Class{chatClass("Bot", &kit{model: scripted.New()})},
		Setup:    func(rt *agent.Runtime) error { chat.Configure(rt, chat.Config{}); return nil },
		WrapDB: func(inner store.DB) store.DB {
			db.DB = inner
			return db
		},
	})
	return env, db
}

// TestAcceptanceComparesOutsideTheWriter: a client's chat request carries
// the whole transcript, which the server compares with the stored one
// before its write transaction: that transaction writes what differs and
// reads no stored message (the writer serves every instance, and a long
// transcript read there would hold up all of them). What is stored is
// the client's transcript and the answer, edits included.
func TestAcceptanceComparesOutsideTheWriter(t *testing.T) {
	env, reads := startWatched(t)
	const path = "/agents/bot/accept"
	c := dialReady(t, env, path)
	var msgs []message.Message
	for i, text := range []string{"one", "two", "three"} {
		msgs = append(msgs, userMsgID("u"+text, text))
		if i == 2 {
			// The client edited its first message meanwhile.
			msgs[0] = userMsgID("uone", "one, edited")
		}
		before := reads.writeReads.Load()
		id := "req-" + text
		c.request(id, msgs...)
		c.until(isDone(id))
		if n := reads.writeReads.Load() - before; n != 0 {
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

// storedTexts reads the stored transcript of a database's only chat
// instance (role: text).
func storedTexts(t *testing.T, db store.DB) []string {
	t.Helper()
	ctx := context.Background()
	var out []string
	err := db.View(ctx, func(tx store.Tx) error {
		// The test's only instance.
		rows, err := tx.Query(ctx, `SELECT body FROM chat_messages ORDER BY position`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var body string
			var m message.Message
			if err := rows.Scan(&body); err != nil {
				return err
			}
			if err := json.Unmarshal([]byte(body), &m); err != nil {
				return err
			}
			out = append(out, string(m.Role)+": "+chat.MessageText(m))
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAcceptanceReadsNoStoredTranscript: a chat request is compared with
// the instance's mirror of its stored transcript, not with the rows: a
// turn reads no stored message, however long the chat. A write that fails
// leaves the mirror as the rows are: the next request writes what the
// failed one did not.
func TestAcceptanceReadsNoStoredTranscript(t *testing.T) {
	env, db := startWatched(t)
	const path = "/agents/bot/mirror"
	c := dialReady(t, env, path)
	var msgs []message.Message
	turn := func(text string) {
		t.Helper()
		msgs = append(msgs, userMsgID("u"+text, text))
		id := "req-" + text
		c.request(id, msgs...)
		c.until(isDone(id))
		msgs = getMessages(t, env.HTTP.URL, path)
	}
	turn("one")
	turn("two")
	if n := db.viewReads.Load(); n != 0 {
		t.Fatalf("%d reads of the stored transcript in two turns of a new instance, want 0", n)
	}

	// The acceptance of "three" fails after its writes; the client sends
	// its transcript again with "four" after it.
	db.fail.Store(true)
	msgs = append(msgs, userMsgID("uthree", "three"))
	c.request("req-three", msgs...)
	c.until(func(f frame) bool { return isResponse(f) && f.ID == "req-three" })
	if db.fail.Load() {
		t.Fatal("no write transaction failed")
	}
	turn("four")
	want := []string{"user: one", "assistant: You said: one", "user: two", "assistant: You said: two",
		"user: three", "user: four", "assistant: You said: four"}
	if got := storedTexts(t, env.DB); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("stored transcript after a failed acceptance:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	before := db.viewReads.Load()
	turn("five")
	if n := db.viewReads.Load() - before; n != 0 {
		t.Fatalf("%d reads of the stored transcript in the turn after the reread, want 0", n)
	}
}
