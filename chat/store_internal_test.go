package chat

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/teststore"
	"github.com/agentry/agentry/store"
)

// countingTx counts the writes made through it.
type countingTx struct {
	store.Tx
	writes int
}

func (c *countingTx) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	c.writes++
	return c.Tx.Exec(ctx, query, args...)
}

// transcriptDB is a SQLite file with the chat schema and two instances:
// one written by the plans of a storedTranscript (its mirror), one by
// deleting and reinserting every message (the reference).
type transcriptDB struct {
	db     store.DB
	mirror *storedTranscript
}

const (
	diffInstance = 1
	refInstance  = 2
)

func openTranscriptDB(t testing.TB) transcriptDB {
	t.Helper()
	ctx := context.Background()
	db := teststore.Open(t, nil, t.TempDir())
	t.Cleanup(func() { db.Close() })
	if err := store.Migrate(ctx, db, "chat-test-instances", []store.Migration{{Version: 1, Statements: []string{
		`CREATE TABLE instances (id INTEGER PRIMARY KEY)`,
		`INSERT INTO instances (id) VALUES (1), (2)`,
	}}}); err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx, db, "chat", migrations); err != nil {
		t.Fatal(err)
	}
	mirror := newStoredTranscript(false)
	return transcriptDB{db: db, mirror: &mirror}
}

// referenceReplace is what a chat request's acceptance did before it
// wrote only the differences: delete every row, insert every message.
func referenceReplace(ctx context.Context, tx store.Tx, iid int64, msgs []message.Message) error {
	if _, err := tx.Exec(ctx, `DELETE FROM chat_messages WHERE instance_id = ?`, iid); err != nil {
		return err
	}
	p, err := encodeMessages(0, msgs)
	if err != nil {
		return err
	}
	return p.apply(ctx, tx, iid)
}

// replace stores msgs in both instances and returns the writes the
// mirror's plan made.
func (d transcriptDB) replace(t testing.TB, msgs []message.Message) int {
	t.Helper()
	ctx := context.Background()
	plan, err := d.mirror.plan(ctx, d.db, diffInstance, msgs)
	if err != nil {
		t.Fatal(err)
	}
	var writes int
	err = d.db.Update(ctx, func(tx store.Tx) error {
		ct := &countingTx{Tx: tx}
		if err := plan.apply(ctx, ct, diffInstance); err != nil {
			return err
		}
		writes = ct.writes
		return referenceReplace(ctx, tx, refInstance, msgs)
	})
	d.mirror.wrote(plan, err)
	if err != nil {
		t.Fatal(err)
	}
	return writes
}

// rows returns an instance's stored rows, by id.
func (d transcriptDB) rows(t testing.TB, iid int64) []string {
	t.Helper()
	var out []string
	err := d.db.View(context.Background(), func(tx store.Tx) error {
		rows, err := tx.Query(context.Background(), `SELECT id, position, role, body FROM chat_messages WHERE instance_id = ? ORDER BY id`, iid)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id, role, body string
			var pos int
			if err := rows.Scan(&id, &pos, &role, &body); err != nil {
				return err
			}
			out = append(out, fmt.Sprintf("%s@%d %s %s", id, pos, role, body))
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// check fails unless both instances hold the same rows and the mirror is
// what reading the rows gives.
func (d transcriptDB) check(t testing.TB, step string) {
	t.Helper()
	got, want := d.rows(t, diffInstance), d.rows(t, refInstance)
	if !slices.Equal(got, want) {
		t.Fatalf("%s: stored rows\n%q\nwant (delete and reinsert)\n%q", step, got, want)
	}
	if !d.mirror.known {
		return
	}
	read := storedTranscript{seed: d.mirror.seed, rows: map[string]storedRow{}}
	err := d.db.View(context.Background(), func(tx store.Tx) error { return read.load(context.Background(), tx, diffInstance) })
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(read.rows, d.mirror.rows) {
		t.Fatalf("%s: mirror %v, the rows read %v", step, d.mirror.rows, read.rows)
	}
}

func textMsg(id string, role message.Role, text string) message.Message {
	return message.Message{ID: id, Role: role, Parts: []message.Part{{Type: message.PartText, Text: text}}}
}

// TestReplaceMessagesWritesDifferences: a transcript's plan leaves the rows
// of unchanged messages alone and writes an appended, edited, moved or
// dropped message, and the stored transcript is after every step what
// deleting and reinserting it all stores (edits, regenerate, deletes, a
// repeated id, clearing).
func TestReplaceMessagesWritesDifferences(t *testing.T) {
	d := openTranscriptDB(t)
	u1, a1 := textMsg("u1", message.RoleUser, "hello"), textMsg("a1", message.RoleAssistant, "hi")
	u2, a2 := textMsg("u2", message.RoleUser, "more"), textMsg("a2", message.RoleAssistant, "sure")
	a1meta := a1
	a1meta.Metadata = json.RawMessage(`{"finishReason":"stop"}`)
	steps := []struct {
		name   string
		msgs   []message.Message
		writes int
	}{
		{"first", []message.Message{u1}, 1},
		{"same again", []message.Message{u1}, 0},
		{"answer and next question", []message.Message{u1, a1, u2}, 2},
		{"continuation of the same", []message.Message{u1, a1, u2}, 0},
		{"metadata changed", []message.Message{u1, a1meta, u2}, 1},
		{"edit the first", []message.Message{textMsg("u1", message.RoleUser, "hello!"), a1meta, u2}, 1},
		{"regenerate drops the tail", []message.Message{textMsg("u1", message.RoleUser, "hello!")}, 2},
		{"new answer", []message.Message{textMsg("u1", message.RoleUser, "hello!"), a2}, 1},
		{"delete the first moves the second", []message.Message{a2}, 2},
		{"reorder", []message.Message{u2, a2}, 2},
		{"repeated id", []message.Message{u2, a2, textMsg("u2", message.RoleUser, "again")}, 1},
		{"repeated id again", []message.Message{u2, a2, textMsg("u2", message.RoleUser, "again")}, 2},
		{"clear", []message.Message{}, 2},
		{"after the clear", []message.Message{u1, a1}, 2},
	}
	for _, s := range steps {
		if got := d.replace(t, s.msgs); got != s.writes {
			t.Errorf("%s: %d writes, want %d", s.name, got, s.writes)
		}
		d.check(t, s.name)
	}
}

// TestReplaceMessagesMatchesReference: random sequences of transcripts
// (kept, edited, dropped, moved, repeated and new messages) leave the same
// rows as deleting and reinserting each, and the mirror the plans keep is
// what reading the rows gives, also after it was lost and read again.
func TestReplaceMessagesMatchesReference(t *testing.T) {
	d := openTranscriptDB(t)
	rng := rand.New(rand.NewPCG(1, 2))
	var cur []message.Message
	for step := range 300 {
		var next []message.Message
		for _, m := range cur {
			switch rng.IntN(8) {
			case 0: // dropped
			case 1:
				next = append(next, textMsg(m.ID, m.Role, fmt.Sprintf("edit %d", step)))
			case 2:
				next = append(next, m, m) // repeated
			default:
				next = append(next, m)
			}
		}
		if len(next) > 1 && rng.IntN(4) == 0 {
			i, j := rng.IntN(len(next)), rng.IntN(len(next))
			next[i], next[j] = next[j], next[i]
		}
		for range rng.IntN(3) {
			role := message.RoleUser
			if rng.IntN(2) == 0 {
				role = message.RoleAssistant
			}
			next = append(next, textMsg(fmt.Sprintf("m%d-%d", step, rng.IntN(1000)), role, "new"))
		}
		if rng.IntN(40) == 0 {
			next = nil
		}
		if rng.IntN(20) == 0 {
			d.mirror.lose() // as after a write whose outcome is unknown
		}
		d.replace(t, next)
		d.check(t, fmt.Sprintf("step %d", step))
		cur = next
	}
}

// BenchmarkReplaceMessages stores a grown transcript again with one new
// message, as a chat request of a user of bench/load does.
func BenchmarkReplaceMessages(b *testing.B) {
	d := openTranscriptDB(b)
	ctx := context.Background()
	for _, n := range []int{4, 16} {
		b.Run(fmt.Sprintf("messages=%d", n), func(b *testing.B) {
			var msgs []message.Message
			for i := range n {
				role := message.RoleUser
				if i%2 == 1 {
					role = message.RoleAssistant
				}
				msgs = append(msgs, textMsg(fmt.Sprintf("m%d", i), role, fmt.Sprintf("message %d of the chat, with some text in it", i)))
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				// The last message is new on every op.
				i++
				msgs[n-1].ID = fmt.Sprintf("new-%d", i)
				plan, err := d.mirror.plan(ctx, d.db, diffInstance, msgs)
				if err != nil {
					b.Fatal(err)
				}
				err = d.db.Update(ctx, func(tx store.Tx) error { return plan.apply(ctx, tx, diffInstance) })
				d.mirror.wrote(plan, err)
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
