package chat_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/teststore"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

const modelDelay = time.Second

// slowModel streams replies in chunks of 4 characters, one per modelDelay
// on clk.
func slowModel(clk clockwork.Clock, rules ...scripted.Rule) *scripted.Model {
	return scripted.New(scripted.WithChunkSize(4), scripted.WithClock(clk), scripted.WithDelay(modelDelay),
		scripted.WithRules(rules...))
}

// crashMidTurn submits question on a, lets the model run until its call
// number call holds after `more` further events, waits until the chunks
// streamed so far are committed (the output gate commits them before any
// client sees them), and closes the runtime (which cancels the turn; it
// stays unfinished in storage). It returns the turn id and the highest
// persisted seq.
func crashMidTurn(t *testing.T, r *rig, rclk, mclk *clockwork.FakeClock, m *scripted.Model, a chatter, question string, call, more int) (string, int) {
	t.Helper()
	return crashMidTurnAt(t, r, mclk, m, a, question, call, more, message.ChunkTextDelta, 1+more)
}

// crashMidTurnAt is crashMidTurn for a model call that streams chunks of
// type delta (text-delta, tool-input-delta), of which want are stored
// when the process dies.
func crashMidTurnAt(t *testing.T, r *rig, mclk *clockwork.FakeClock, m *scripted.Model, a chatter, question string, call, more int, delta string, want int) (string, int) {
	t.Helper()
	ctx := testCtx(t)
	id, err := a.SubmitMessages(ctx, []message.Message{userMsg(question)}, chat.SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if err := mclk.BlockUntilContext(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if len(m.Calls()) >= call {
			break
		}
		mclk.Advance(modelDelay)
	}
	for range more {
		step(t, mclk, modelDelay)
	}
	if err := mclk.BlockUntilContext(ctx, 1); err != nil { // held: nothing streams
		t.Fatal(err)
	}
	textDeltas := func() int {
		return count(t, r.sq, `SELECT COUNT(*) FROM chat_chunks WHERE stream_id = ? AND body LIKE ?`, id, `%"`+delta+`"%`)
	}
	r.db.waitFor(t, "the streamed chunks to be persisted", func() bool { return textDeltas() == want })
	var maxSeq int
	if err := r.sq.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT MAX(seq) FROM chat_chunks WHERE stream_id = ?`, id).Scan(&maxSeq)
	}); err != nil {
		t.Fatal(err)
	}
	r.close()
	if got := streamStatus(t, r.dir, id); got != "streaming" {
		t.Fatalf("after the crash the turn is %q, want streaming", got)
	}
	return id, maxSeq
}

// allText concatenates the text of every text part, the interrupted ones
// included: what a client renders.
func allText(m message.Message) string {
	var s strings.Builder
	for _, p := range m.Parts {
		if p.Type == message.PartText {
			s.WriteString(p.Text)
		}
	}
	return s.String()
}

// streamStatus reads a stream's status from the database file.
func streamStatus(t *testing.T, dir, id string) string {
	t.Helper()
	ctx := context.Background()
	db := teststore.Open(t, &pg, dir)
	var err error
	defer db.Close()
	var status string
	err = db.View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT status FROM chat_streams WHERE id = ?`, id).Scan(&status)
	})
	if err != nil {
		t.Fatal(err)
	}
	return status
}

// onlyAssistant returns the transcript's single assistant message.
func onlyAssistant(t *testing.T, msgs []message.Message) message.Message {
	t.Helper()
	as := assistants(msgs)
	if len(as) != 1 || len(msgs) != 2 {
		t.Fatalf("transcript %s, want one question and one answer", dump(msgs))
	}
	return as[0]
}

// TestRecoverContinueKeepsToolStep: a turn whose tool step completed before
// the crash (tool call step, then a text step cut short) is resumed by the
// next runtime on Start (the "chat" wake reason): under the default policy
// the tool is not run again, the cut text (committed, so possibly seen by
// clients) is kept and closed, and the text step runs once more after it.
func TestRecoverContinueKeepsToolStep(t *testing.T) {
	dir := t.TempDir()
	mclk := clockwork.NewFakeClock()
	const answer = "The lookup says forty-two, which settles it."
	m := slowModel(mclk,
		scripted.Rule{Name: "answer", Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text(answer)})},
		scripted.Rule{Name: "call", Reply: scripted.Always(scripted.Reply{scripted.ToolCall("lookup", json.RawMessage(`{}`))})},
	)
	var runs atomic.Int64
	k := &kit{model: m, tools: []chat.Tool{chat.NewTool("lookup", "Looks it up.", func(ctx context.Context, in empty) (int, error) {
		runs.Add(1)
		return 42, nil
	})}}
	classes := []agent.Class{chatClass("Bot", k)}

	rclk := clockwork.NewFakeClock()
	r1 := newRig(t, rigOptions{dir: dir, clock: rclk, classes: classes})
	id, _ := crashMidTurn(t, r1, rclk, mclk, m, getChat(t, r1.rt, "Bot", "cont"), "what is it?", 2, 2)
	if runs.Load() != 1 {
		t.Fatalf("tool ran %d times before the crash", runs.Load())
	}
	if n := len(r1.turns.matching("turn", "", nil)); n != 0 {
		t.Fatalf("the interrupted turn ended %d times before the crash", n)
	}

	r2 := newRig(t, rigOptions{dir: dir, classes: classes})
	stop := pump(mclk, modelDelay)
	defer stop()
	r2.turns.wait(t, "turn", "stream", id)
	stop()
	rec := r2.turns.wait(t, "recover-turn", "stream", id)
	if rec.Attrs["policy"] != chat.RecoverContinue || rec.Attrs["keptChunks"].(int) == 0 {
		t.Fatalf("recovery %v, want RecoverContinue with kept chunks", rec.Attrs)
	}
	a := getChat(t, r2.rt, "Bot", "cont")
	res, err := a.WaitTurn(testCtx(t), id)
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("recovered turn: %+v, %v", res, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("tool ran %d times, want 1: a completed step ran again", runs.Load())
	}
	calls := m.Calls()
	if len(calls) != 3 || calls[2].Rule != "answer" {
		t.Fatalf("model calls %d (last rule %q), want 3 ending with the answer after the kept tool result", len(calls), calls[len(calls)-1].Rule)
	}
	if conv := calls[2].Request.Messages; conv[len(conv)-1].Role != model.RoleAssistant || conv[len(conv)-1].Content[0].Text != answer[:4*3] {
		t.Fatalf("the recovered step's request ends %+v, want the cut text %q to continue", conv[len(conv)-1], answer[:4*3])
	}
	asst := onlyAssistant(t, a.Messages())
	if got := chat.MessageText(asst); got != answer {
		t.Fatalf("answer %q, want %q (the cut text, then the rest of it)", got, answer)
	}
	if got := allText(asst); got != answer {
		t.Fatalf("parts' text %q, want %q: the recovered turn restated what was already streamed", got, answer)
	}
	tp := toolParts(asst)
	if len(tp) != 1 || tp[0].State != message.StateOutputAvailable || string(tp[0].Output) != "42" {
		t.Fatalf("tool parts %+v", tp)
	}
	if n := len(r2.turns.matching("turn", "stream", id)); n != 1 {
		t.Fatalf("turn ended %d times, want once", n)
	}
	if got := streamStatus(t, dir, id); got != "done" {
		t.Fatalf("status %q", got)
	}
}

// TestRecoverRetryWholeAnswer: with RecoverRetry the turn's handler runs
// again from the beginning. What was committed before the crash may have
// reached clients, so it is kept (closed) and the new answer follows it. A
// connection that resumes the recovered stream sees one consistent stream:
// seqs consecutive from 0, the ones from before the crash with their old
// bodies, and its text is the transcript's.
func TestRecoverRetryWholeAnswer(t *testing.T) {
	dir := t.TempDir()
	mclk := clockwork.NewFakeClock()
	m := slowModel(mclk)
	k := &kit{model: m, policy: chat.RecoverRetry}
	class := policyClass("Careful", k)

	rclk := clockwork.NewFakeClock()
	r1 := newRig(t, rigOptions{dir: dir, clock: rclk, classes: []agent.Class{class}})
	const question = "please repeat this sentence back to me"
	id, maxSeq := crashMidTurn(t, r1, rclk, mclk, m, getChat(t, r1.rt, "Careful", "retry"), question, 1, 3)

	env, turns := startEnv(t, dir, clockwork.NewFakeClock(), chat.Config{}, class)
	turns.wait(t, "recover", "", nil)
	// The recovered turn is streaming and held on the model clock.
	if err := mclk.BlockUntilContext(testCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	const path = "/agents/careful/retry"
	c := dialReady(t, env, path)
	if f := c.next(); f.Type != wire.StreamResuming || f.ID != id {
		t.Fatalf("no offer of the recovered stream: %s", f.Raw)
	}
	c.ack(id)
	replay := c.until(func(f frame) bool { return f.ReplayComplete })
	stop := pump(mclk, modelDelay)
	defer stop()
	c.until(isDone(id))
	turns.wait(t, "turn", "stream", id)
	stop()

	rec := turns.wait(t, "recover-turn", "stream", id)
	if rec.Attrs["policy"] != chat.RecoverRetry || rec.Attrs["keptChunks"].(int) != maxSeq+1 {
		t.Fatalf("recovery %v, want RecoverRetry keeping the %d committed chunks", rec.Attrs, maxSeq+1)
	}
	s := seqs(t, c.all, id)
	consecutive(t, "resumed stream", s, 0)
	if len(s) <= maxSeq+1 {
		t.Fatalf("seqs %v: nothing after the %d chunks from before the crash", s, maxSeq+1)
	}
	if first := replay[0]; !first.IsChatChunk() || chunkOf(t, first).Type != message.ChunkStart {
		t.Fatalf("the retried stream does not start with start: %s", first.Raw)
	}
	d := c.all[len(c.all)-1]
	if d.Outcome != chat.OutcomeCompleted || d.Replay {
		t.Fatalf("terminal frame %s", d.Raw)
	}
	want := "You said: " + question
	var streamed strings.Builder
	for _, f := range c.all {
		if f.IsChatChunk() && f.ID == id {
			if ch := chunkOf(t, f); ch.Type == message.ChunkTextDelta {
				streamed.WriteString(ch.Delta)
			}
		}
	}
	asst := onlyAssistant(t, getMessages(t, env.HTTP.URL, path))
	if streamed.String() != allText(asst) || streamed.String() != want[:4*4]+want {
		t.Fatalf("the resumed stream's text is %q, the message's parts %q; want %q (the cut text, then the whole answer)",
			streamed.String(), allText(asst), want[:4*4]+want)
	}
	if got := chat.MessageText(asst); got != want {
		t.Fatalf("answer %q, want %q (the cut attempt is marked interrupted)", got, want)
	}
	if n := len(turns.matching("turn", "stream", id)); n != 1 {
		t.Fatalf("turn ended %d times", n)
	}
	if n := len(m.Calls()); n != 2 {
		t.Fatalf("%d model calls, want 2 (the interrupted one and the retry)", n)
	}
}

// TestRecoverAbandon: with RecoverAbandon the interrupted turn ends with
// outcome error and the model is not called again.
func TestRecoverAbandon(t *testing.T) {
	dir := t.TempDir()
	mclk := clockwork.NewFakeClock()
	m := slowModel(mclk)
	k := &kit{model: m, policy: chat.RecoverAbandon}
	class := policyClass("Quitter", k)

	rclk := clockwork.NewFakeClock()
	r1 := newRig(t, rigOptions{dir: dir, clock: rclk, classes: []agent.Class{class}})
	id, _ := crashMidTurn(t, r1, rclk, mclk, m, getChat(t, r1.rt, "Quitter", "gone"), "say something long enough", 1, 1)

	r2 := newRig(t, rigOptions{dir: dir, classes: []agent.Class{class}})
	ev := r2.turns.wait(t, "turn", "stream", id)
	if ev.Attrs["outcome"] != chat.OutcomeError {
		t.Fatalf("turn event %v", ev.Attrs)
	}
	a := getChat(t, r2.rt, "Quitter", "gone")
	res, err := a.WaitTurn(testCtx(t), id)
	if err != nil || res.Outcome != chat.OutcomeError || !strings.Contains(res.Error, "interrupted") {
		t.Fatalf("abandoned turn: %+v, %v", res, err)
	}
	if n := len(m.Calls()); n != 1 {
		t.Fatalf("%d model calls, want 1", n)
	}
	if n := len(r2.turns.matching("turn", "stream", id)); n != 1 {
		t.Fatalf("turn ended %d times", n)
	}
}

// TestRecoverCollectsFinishedStream: a process killed after a turn's whole
// stream (its finish chunk included) was committed, but before the turn's
// end was, leaves the turn "streaming" in storage. The next runtime records
// it as ended from its stored stream: the model is not asked again and no
// tool runs again (finished work is never redone), and the answer is the
// one the clients saw.
func TestRecoverCollectsFinishedStream(t *testing.T) {
	dir := t.TempDir()
	m := scripted.New(
		scripted.WithRules(
			scripted.Rule{Name: "answer", Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("It is 42.")})},
			scripted.Rule{Name: "call", Reply: scripted.Always(scripted.Reply{scripted.ToolCall("lookup", json.RawMessage(`{}`))})},
		))
	var runs atomic.Int64
	k := &kit{model: m, tools: []chat.Tool{chat.NewTool("lookup", "Looks it up.", func(ctx context.Context, in empty) (int, error) {
		runs.Add(1)
		return 42, nil
	})}}
	classes := []agent.Class{chatClass("Bot", k)}
	r1 := newRig(t, rigOptions{dir: dir, classes: classes})
	res, err := getChat(t, r1.rt, "Bot", "done").SaveMessages(testCtx(t), []message.Message{userMsg("what is it?")})
	if err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("%+v %v", res, err)
	}
	r1.close()
	// Undo the end's transaction: the turn unfinished, its answer unsaved,
	// every chunk (finish included) stored.
	ctx := testCtx(t)
	db := teststore.Open(t, &pg, dir)
	err = db.Update(ctx, func(tx store.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE chat_streams SET status = 'streaming', outcome = NULL, finished_at = NULL WHERE id = ?`, res.ID); err != nil {
			return err
		}
		// The wake flag is cleared only after a turn's end.
		if _, err := tx.Exec(ctx, `INSERT INTO instance_wake (instance_id, reason) SELECT instance_id, 'chat' FROM chat_streams WHERE id = ?
			ON CONFLICT (instance_id, reason) DO NOTHING`, res.ID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM chat_messages WHERE id = ?`, res.Message.ID)
		return err
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	r2 := newRig(t, rigOptions{dir: dir, classes: classes})
	ev := r2.turns.wait(t, "turn", "stream", res.ID)
	if ev.Attrs["outcome"] != chat.OutcomeCompleted {
		t.Fatalf("turn event %v", ev.Attrs)
	}
	rec := r2.turns.wait(t, "recover-turn", "stream", res.ID)
	if rec.Attrs["collected"] != true {
		t.Fatalf("recovery %v, want the finished stream collected", rec.Attrs)
	}
	if n, calls := runs.Load(), len(m.Calls()); n != 1 || calls != 2 {
		t.Fatalf("tool ran %d times and the model was asked %d times, want 1 and 2 (nothing redone)", n, calls)
	}
	asst := onlyAssistant(t, getChat(t, r2.rt, "Bot", "done").Messages())
	if got := chat.MessageText(asst); got != "It is 42." {
		t.Fatalf("answer %q", got)
	}
	if got := streamStatus(t, dir, res.ID); got != "done" {
		t.Fatalf("status %q", got)
	}
}

// TestRecoverContinueGoesOnFromCutText: a one-step answer cut in its text
// is continued where the stored text stops (the scripted model is a
// model.Continuer): the message's parts hold the answer once, the cut part
// is marked continued and counts as answer.
func TestRecoverContinueGoesOnFromCutText(t *testing.T) {
	dir := t.TempDir()
	mclk := clockwork.NewFakeClock()
	m := slowModel(mclk)
	classes := []agent.Class{chatClass("Bot", &kit{model: m})}
	r1 := newRig(t, rigOptions{dir: dir, clock: clockwork.NewFakeClock(), classes: classes})
	const question = "tell me something long enough to be cut"
	id, _ := crashMidTurn(t, r1, nil, mclk, m, getChat(t, r1.rt, "Bot", "cut"), question, 1, 3)

	r2 := newRig(t, rigOptions{dir: dir, classes: classes})
	stop := pump(mclk, modelDelay)
	defer stop()
	r2.turns.wait(t, "turn", "stream", id)
	stop()
	a := getChat(t, r2.rt, "Bot", "cut")
	if res, err := a.WaitTurn(testCtx(t), id); err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("recovered turn: %+v, %v", res, err)
	}
	want := "You said: " + question
	asst := onlyAssistant(t, a.Messages())
	if got := allText(asst); got != want {
		t.Fatalf("parts' text %q, want %q: the recovered turn restated what was already streamed", got, want)
	}
	if got := chat.MessageText(asst); got != want {
		t.Fatalf("answer %q, want %q", got, want)
	}
	var texts []message.Part
	for _, p := range asst.Parts {
		if p.Type == message.PartText {
			texts = append(texts, p)
		}
	}
	if len(texts) != 2 || string(texts[0].ProviderMetadata) != string(message.ContinuedMetadata) || texts[0].Text != want[:4*4] {
		t.Fatalf("text parts %+v, want the cut one (marked continued) and its rest", texts)
	}
}

// TestRecoveredToolCallGetsFreshID: a turn cut while the model streamed a
// tool call's input is recovered; the model, asked the same request again,
// repeats the call's id (the scripted model derives it from the request),
// and the conversation still never holds two calls with one id: the cut
// call keeps its id and the new one gets another.
func TestRecoveredToolCallGetsFreshID(t *testing.T) {
	dir := t.TempDir()
	mclk := clockwork.NewFakeClock()
	m := slowModel(mclk,
		scripted.Rule{Name: "answer", Match: scripted.LastIsToolResult, Reply: scripted.Always(scripted.Reply{scripted.Text("Done.")})},
		scripted.Rule{Name: "call", Reply: scripted.Always(scripted.Reply{scripted.ToolCall("lookup", json.RawMessage(`{"what":"a long enough input"}`))})},
	)
	var runs atomic.Int64
	k := &kit{model: m, tools: []chat.Tool{chat.NewTool("lookup", "Looks it up.", func(ctx context.Context, in struct {
		What string `json:"what"`
	}) (int, error) {
		runs.Add(1)
		return 42, nil
	})}}
	classes := []agent.Class{chatClass("Bot", k)}
	r1 := newRig(t, rigOptions{dir: dir, clock: clockwork.NewFakeClock(), classes: classes})
	id, _ := crashMidTurnAt(t, r1, mclk, m, getChat(t, r1.rt, "Bot", "ids"), "look it up", 1, 2, message.ChunkToolInputDelta, 2)

	r2 := newRig(t, rigOptions{dir: dir, classes: classes})
	stop := pump(mclk, modelDelay)
	defer stop()
	r2.turns.wait(t, "turn", "stream", id)
	stop()
	a := getChat(t, r2.rt, "Bot", "ids")
	if res, err := a.WaitTurn(testCtx(t), id); err != nil || res.Outcome != chat.OutcomeCompleted {
		t.Fatalf("recovered turn: %+v, %v", res, err)
	}
	calls := m.Calls()
	if len(calls) != 3 || calls[1].Rule != "call" {
		t.Fatalf("%d model calls, want 3: the cut call, the same request again, the answer", len(calls))
	}
	tp := toolParts(onlyAssistant(t, a.Messages()))
	if len(tp) != 2 || tp[0].ToolCallID == tp[1].ToolCallID {
		t.Fatalf("tool parts %+v, want the cut call and a new one with another id", tp)
	}
	if !tp[0].Interrupted() || tp[1].Interrupted() || tp[1].State != message.StateOutputAvailable || runs.Load() != 1 {
		t.Fatalf("tool parts %+v, runs %d: want the cut call marked and the new one run once", tp, runs.Load())
	}
	seen := map[string]bool{}
	for _, msg := range calls[2].Request.Messages {
		for _, c := range msg.Content {
			if c.Kind == model.ContentToolCall {
				if seen[c.ToolCallID] {
					t.Fatalf("the model's conversation repeats the tool call id %q", c.ToolCallID)
				}
				seen[c.ToolCallID] = true
			}
		}
	}
}
