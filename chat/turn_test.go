package chat_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model/scripted"
)

// TestSaveMessagesHeadless: SaveMessages runs a turn with no connection and
// returns its result (text, outcome completed); the transcript holds the
// question and the answer, also in storage.
func TestSaveMessagesHeadless(t *testing.T) {
	k := &kit{model: scripted.New(scripted.WithChunkSize(3))}
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", k)}})
	a := getChat(t, r.rt, "Bot", "headless")

	res, err := a.SaveMessages(testCtx(t), []message.Message{userMsg("hello there")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != chat.OutcomeCompleted || res.Error != "" {
		t.Fatalf("outcome %q (%q), want completed", res.Outcome, res.Error)
	}
	if got := res.Text(); got != "You said: hello there" {
		t.Fatalf("text %q", got)
	}
	if res.ID == "" || res.Message.ID == "" || res.Message.Role != message.RoleAssistant {
		t.Fatalf("result lacks ids or role: %+v", res)
	}
	msgs := a.Messages()
	if len(msgs) != 2 || msgs[0].Role != message.RoleUser || msgs[1].ID != res.Message.ID {
		t.Fatalf("transcript %+v", msgs)
	}
	if n := count(t, r.sq, `SELECT COUNT(*) FROM chat_messages WHERE instance_id = ?`, a.InstanceID()); n != 2 {
		t.Fatalf("%d stored messages, want 2", n)
	}
	// A finished turn is answered from storage.
	again, err := a.WaitTurn(testCtx(t), res.ID)
	if err != nil || again.Outcome != chat.OutcomeCompleted || again.Text() != res.Text() {
		t.Fatalf("WaitTurn after the end: %+v, %v", again, err)
	}
}

// TestTurnsRunInOrder: three submissions queued back to back (the first
// held mid-stream on the model's fake clock so the others queue behind it)
// run one at a time, in order; each answer follows its own question in the
// transcript and answers it.
func TestTurnsRunInOrder(t *testing.T) {
	clk := clockwork.NewFakeClock()
	const delay = time.Second
	m := scripted.New(scripted.WithChunkSize(4), scripted.WithClock(clk), scripted.WithDelay(delay))
	k := &kit{model: m}
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", k)}})
	a := getChat(t, r.rt, "Bot", "order")
	ctx := testCtx(t)

	var ids []string
	for i := range 3 {
		id, err := a.SubmitMessages(ctx, []message.Message{userMsg(fmt.Sprintf("question %d", i))}, chat.SubmitOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		if i == 0 {
			// Hold the first turn mid-stream: it has streamed its first
			// event and waits on the model clock.
			if err := clk.BlockUntilContext(ctx, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if busy, ok := a.BusyTurn(); !ok || busy != ids[0] {
		t.Fatalf("busy turn %q, want the first %q", busy, ids[0])
	}
	stop := pump(clk, delay)
	defer stop()
	for i, id := range ids {
		res, err := a.WaitTurn(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("You said: question %d", i)
		if res.Outcome != chat.OutcomeCompleted || res.Text() != want {
			t.Fatalf("turn %d: %s %q, want completed %q", i, res.Outcome, res.Text(), want)
		}
	}
	stop()
	if n := len(m.Calls()); n != 3 {
		t.Fatalf("%d model calls, want 3", n)
	}
	msgs := a.Messages()
	if len(msgs) != 6 {
		t.Fatalf("transcript has %d messages, want 6: %s", len(msgs), dump(msgs))
	}
	for i := range 3 {
		u, as := msgs[2*i], msgs[2*i+1]
		if u.Role != message.RoleUser || as.Role != message.RoleAssistant {
			t.Fatalf("message %d/%d roles %s/%s, want user/assistant: %s", 2*i, 2*i+1, u.Role, as.Role, dump(msgs))
		}
		if got, want := chat.MessageText(as), "You said: "+chat.MessageText(u); got != want {
			t.Fatalf("answer %d %q, want %q", i, got, want)
		}
	}
	// Each model call saw its own question last.
	for i, c := range m.Calls() {
		if got, want := scripted.LastUserText(c.Request), fmt.Sprintf("question %d", i); got != want {
			t.Fatalf("model call %d answered %q, want %q", i, got, want)
		}
	}
	// Storage agrees with memory.
	r.close()
	r2 := newRig(t, rigOptions{dir: r.dir, classes: []agent.Class{chatClass("Bot", k)}})
	if got := dump(getChat(t, r2.rt, "Bot", "order").Messages()); got != dump(msgs) {
		t.Fatalf("reloaded transcript\n%s\nwant\n%s", got, dump(msgs))
	}
}

func dump(msgs []message.Message) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "[%s %q] ", m.Role, chat.MessageText(m))
	}
	return b.String()
}

// TestIdempotentSubmission: the same IdempotencyKey twice gives the same
// turn id and one turn, also after a restart on the same database file.
func TestIdempotentSubmission(t *testing.T) {
	m := scripted.New()
	k := &kit{model: m}
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", k)}})
	a := getChat(t, r.rt, "Bot", "idem")
	ctx := testCtx(t)
	opts := chat.SubmitOptions{IdempotencyKey: "order-42"}

	id1, err := a.SubmitMessages(ctx, []message.Message{userMsg("pay order 42")}, opts)
	if err != nil {
		t.Fatal(err)
	}
	id2, err := a.SubmitMessages(ctx, []message.Message{userMsg("pay order 42")}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if id1 != id2 {
		t.Fatalf("second submission got turn %s, want %s", id2, id1)
	}
	res, err := a.WaitTurn(ctx, id1)
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn: %+v, %v", res, err)
	}
	if n := len(m.Calls()); n != 1 {
		t.Fatalf("%d model calls, want 1", n)
	}
	if n := len(a.Messages()); n != 2 {
		t.Fatalf("transcript has %d messages, want 2: %s", n, dump(a.Messages()))
	}

	r.close()
	r2 := newRig(t, rigOptions{dir: r.dir, classes: []agent.Class{chatClass("Bot", k)}})
	b := getChat(t, r2.rt, "Bot", "idem")
	id3, err := b.SubmitMessages(ctx, []message.Message{userMsg("pay order 42")}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if id3 != id1 {
		t.Fatalf("after restart the key gave turn %s, want %s", id3, id1)
	}
	res, err = b.WaitTurn(ctx, id3)
	if err != nil || res.Outcome != chat.OutcomeCompleted || res.Text() != "You said: pay order 42" {
		t.Fatalf("turn after restart: %+v, %v", res, err)
	}
	if _, busy := b.BusyTurn(); busy {
		t.Fatal("a turn runs after the repeated submission")
	}
	if n := len(m.Calls()); n != 1 {
		t.Fatalf("%d model calls after restart, want 1", n)
	}
	msgs := b.Messages()
	if len(msgs) != 2 || len(assistants(msgs)) != 1 {
		t.Fatalf("transcript %s, want one question and one answer", dump(msgs))
	}
	if n := count(t, r2.sq, `SELECT COUNT(*) FROM chat_streams WHERE instance_id = ?`, b.InstanceID()); n != 1 {
		t.Fatalf("%d stored turns, want 1", n)
	}
}

// TestChunkPersistenceBatching counts write transactions for a turn of
// 1,000 text deltas with FlushChunks 64: chunks are persisted in batches,
// far below one transaction per delta.
func TestChunkPersistenceBatching(t *testing.T) {
	const deltas = 1000
	m := scripted.New(scripted.WithChunkSize(1), scripted.WithDefault(scripted.Always(scripted.Reply{
		scripted.Text(strings.Repeat("x", deltas)),
	})))
	k := &kit{model: m}
	// The runtime clock is fake and never advanced: only full batches and
	// the end of the turn flush.
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", k)}, cfg: chat.Config{FlushChunks: 64}})
	a := getChat(t, r.rt, "Bot", "batch")
	ctx := testCtx(t)

	before := r.db.updates.Load()
	res, err := a.SaveMessages(ctx, []message.Message{userMsg("go")})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn: %+v, %v", res, err)
	}
	// The worker clears the wake flag after the turn: wait for it so the
	// count is complete.
	r.db.waitFor(t, "the wake flag to be cleared", func() bool {
		return count(t, r.sq, `SELECT COUNT(*) FROM instance_wake WHERE instance_id = ?`, a.InstanceID()) == 0
	})
	txs := r.db.updates.Load() - before
	if got := len(res.Text()); got != deltas {
		t.Fatalf("answer has %d characters, want %d", got, deltas)
	}
	chunks := count(t, r.sq, `SELECT COUNT(*) FROM chat_chunks WHERE instance_id = ? AND stream_id = ?`, a.InstanceID(), res.ID)
	if chunks < deltas {
		t.Fatalf("%d chunks stored, want at least %d", chunks, deltas)
	}
	t.Logf("%d write transactions for a turn of %d text deltas (%d chunks stored)", txs, deltas, chunks)
	if txs >= 50 {
		t.Fatalf("%d write transactions for %d deltas, want fewer than 50", txs, deltas)
	}
}

// TestUrgentWrites: a turn's acceptance and its first commit (the start
// chunk, which the client waits on) are marked store.WithUrgent, and none
// of its later commits is: the store lets the two go before the chunks of
// streams already flowing, and only them.
func TestUrgentWrites(t *testing.T) {
	m := scripted.New(scripted.WithChunkSize(1), scripted.WithDefault(scripted.Always(scripted.Reply{
		scripted.Text(strings.Repeat("x", 200)),
	})))
	k := &kit{model: m}
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", k)}, cfg: chat.Config{FlushChunks: 16}})
	a := getChat(t, r.rt, "Bot", "urgent")
	ctx := testCtx(t)
	before, beforeUrgent := r.db.updates.Load(), r.db.urgent.Load()
	res, err := a.SaveMessages(ctx, []message.Message{userMsg("go")})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn: %+v, %v", res, err)
	}
	txs, urgent := r.db.updates.Load()-before, r.db.urgent.Load()-beforeUrgent
	if urgent != 2 {
		t.Fatalf("%d urgent write transactions for one turn, want 2 (its acceptance and its first commit)", urgent)
	}
	if txs < 10 {
		t.Fatalf("%d write transactions for a turn of 200 deltas in batches of 16, want at least 10", txs)
	}
}

// TestRetentionSweep: a turn's end forgets the streams (and their chunks)
// that ended more than Retention ago and were not retained, and keeps the
// retained ones, also on an instance whose first turn was retained (as an
// agent-tool child's are), which sweeps nothing until it has a stream that
// is not.
func TestRetentionSweep(t *testing.T) {
	clock := clockwork.NewFakeClock()
	k := &kit{model: scripted.New()}
	r := newRig(t, rigOptions{clock: clock, cfg: chat.Config{Retention: time.Minute}, classes: []agent.Class{chatClass("Bot", k)}})
	a := getChat(t, r.rt, "Bot", "sweep")
	ctx := testCtx(t)
	turn := func(text string, retain bool) string {
		t.Helper()
		id, err := a.SubmitMessages(ctx, []message.Message{userMsg(text)}, chat.SubmitOptions{Retain: retain})
		if err != nil {
			t.Fatal(err)
		}
		if res, err := a.WaitTurn(ctx, id); err != nil || res.Outcome != chat.OutcomeCompleted {
			t.Fatalf("turn %q: %+v, %v", text, res, err)
		}
		return id
	}
	stored := func(id string) (streams, chunks int) {
		t.Helper()
		return count(t, r.sq, `SELECT COUNT(*) FROM chat_streams WHERE instance_id = ? AND id = ?`, a.InstanceID(), id),
			count(t, r.sq, `SELECT COUNT(*) FROM chat_chunks WHERE instance_id = ? AND stream_id = ?`, a.InstanceID(), id)
	}
	kept := turn("one", true)
	clock.Advance(2 * time.Minute)
	turn("two", true)
	if s, c := stored(kept); s != 1 || c == 0 {
		t.Fatalf("retained stream swept: %d streams, %d chunks", s, c)
	}
	old := turn("three", false)
	if s, c := stored(old); s != 1 || c == 0 {
		t.Fatalf("fresh stream swept: %d streams, %d chunks", s, c)
	}
	clock.Advance(2 * time.Minute)
	turn("four", true)
	if s, c := stored(old); s != 0 || c != 0 {
		t.Fatalf("stream older than Retention kept: %d streams, %d chunks", s, c)
	}
	if s, c := stored(kept); s != 1 || c == 0 {
		t.Fatalf("retained stream swept: %d streams, %d chunks", s, c)
	}
}

// TestLastTurnIsForgotten: the last turn that ended stays in memory for a
// waiter that comes just after its end (its result is read without the
// store), and is forgotten 10 s later: a resident instance does not keep
// its last stream and message; a later waiter reads them from the store
// and gets the same result.
func TestLastTurnIsForgotten(t *testing.T) {
	clock := clockwork.NewFakeClock()
	k := &kit{model: scripted.New()}
	r := newRig(t, rigOptions{clock: clock, classes: []agent.Class{chatClass("Bot", k)}})
	a := getChat(t, r.rt, "Bot", "forget")
	ctx := testCtx(t)
	id, err := a.SubmitMessages(ctx, []message.Message{userMsg("hi")}, chat.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := a.WaitTurn(ctx, id)
	if err != nil || first.Outcome != chat.OutcomeCompleted {
		t.Fatalf("turn: %+v, %v", first, err)
	}
	views := r.db.chatReads.Load()
	if res, err := a.WaitTurn(ctx, id); err != nil || chat.MessageText(res.Message) != chat.MessageText(first.Message) {
		t.Fatalf("waiting again: %+v, %v", res, err)
	}
	if n := r.db.chatReads.Load() - views; n != 0 {
		t.Fatalf("a waiter just after the end read the store %d times, want 0", n)
	}
	clock.Advance(10 * time.Second)
	// The drop runs in the clock's goroutine: wait for a waiter to read
	// the store (no sleep; bounded by the test's deadline).
	for {
		views := r.db.chatReads.Load()
		res, err := a.WaitTurn(ctx, id)
		if err != nil || res.Outcome != chat.OutcomeCompleted || chat.MessageText(res.Message) != "You said: hi" {
			t.Fatalf("waiting after the last turn was forgotten: %+v, %v", res, err)
		}
		if r.db.chatReads.Load() > views {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the last turn is still in memory 10 s after its end")
		}
		runtime.Gosched()
	}
}
