package chat_test

import (
	"context"
	"slices"
	"testing"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/wire"
)

// TestAckOfQueuedTurnGetsItsStream (issue 24): a client whose own turn is
// queued behind another one on the instance acknowledges its turn (as the
// Go client does when its probe is answered with the other turn). The ack
// must not end its stream: the connection gets the queued turn's stream
// live when it runs, from its start, and its real end.
func TestAckOfQueuedTurnGetsItsStream(t *testing.T) {
	release := make(chan struct{})
	k := &kit{handle: func(ctx context.Context, tt *chat.Turn) error {
		if tt.ID != "r0" {
			return tt.WriteText("answer to " + tt.ID)
		}
		if err := tt.WriteText("held"); err != nil {
			return err
		}
		return agent.Await(ctx, func() error {
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}}
	env, turns := startEnv(t, "", clockwork.NewFakeClock(), chat.Config{}, handlerClass("Queue", k))
	const path = "/agents/queue/acked"

	c1 := dialReady(t, env, path)
	c1.request("r0", userMsgID("u0", "first"))
	// r0 streams (its first chunk is out) and holds.
	c1.until(func(f frame) bool { return f.IsChatChunk() && f.ID == "r0" })
	c1.request("r1", userMsgID("u1", "second"))
	// A probe on the same socket is answered once r1 is queued.
	c1.probe("p0")
	if fs := c1.until(func(f frame) bool { return f.ProbeID == "p0" }); fs[len(fs)-1].ID != "r0" {
		t.Fatalf("probe answer %s, want r0's stream", fs[len(fs)-1].Raw)
	}

	// A second socket of the client that sent r1 (its reconnect): offered
	// r0, its probe answered with r0, it acknowledges its own turn r1.
	c2 := dialReady(t, env, path)
	if f := c2.next(); f.Type != wire.StreamResuming || f.ID != "r0" {
		t.Fatalf("no offer of the live stream r0: %s", f.Raw)
	}
	c2.probe("p1")
	if f := c2.next(); f.Type != wire.StreamResuming || f.ID != "r0" || f.ProbeID != "p1" {
		t.Fatalf("probe answer %s, want resuming r0", f.Raw)
	}
	c2.ack("r1")
	// A second probe, answered after the ack was handled: r0 still runs,
	// so r1 is queued when its ack arrives.
	c2.probe("p2")
	got := c2.until(func(f frame) bool { return f.ProbeID == "p2" })
	if a := got[len(got)-1]; a.Type != wire.StreamResuming || a.ID != "r0" {
		t.Fatalf("second probe answer %s, want resuming r0", a.Raw)
	}
	for _, f := range got {
		if isResponse(f) && f.ID == "r1" {
			t.Fatalf("ack of the queued turn r1 answered with %s before r1 ran", f.Raw)
		}
	}

	close(release)
	turns.wait(t, "turn", "stream", "r1")
	want := c1.until(isDone("r1"))
	have := c2.until(isDone("r1"))
	bodies := func(fs []frame) []string {
		var out []string
		for _, f := range fs {
			if f.IsChatChunk() && f.ID == "r1" {
				out = append(out, f.Body)
			}
		}
		return out
	}
	b1, b2 := bodies(want), bodies(have)
	if len(b1) == 0 || !slices.Equal(b1, b2) {
		t.Fatalf("acked socket got r1 chunks %q, want the turn's %q", b2, b1)
	}
	consecutive(t, "acked socket", seqs(t, have, "r1"), 0)
	for _, f := range have {
		if f.ID == "r1" && f.Replay {
			t.Fatalf("acked socket got r1 frame %s replayed, want it live", f.Raw)
		}
	}
	if end := have[len(have)-1]; end.Replay || end.Outcome != chat.OutcomeCompleted {
		t.Fatalf("acked socket's r1 end %s, want the live completed end", end.Raw)
	}
}

// TestAckOfQueuedRecoveredTurnReplaysItsStoredStream: a turn interrupted
// mid-stream by a crash is recovered queued behind another turn; a client
// acknowledges it while it waits. Its chunks from before the crash are
// stored, not sent live again: when it runs, the connection gets them
// replayed, then the rest of the stream live, one stream with no gap.
func TestAckOfQueuedRecoveredTurnReplaysItsStoredStream(t *testing.T) {
	dir := t.TempDir()
	mclk := clockwork.NewFakeClock()
	m := slowModel(mclk)
	class := chatClass("Rec", &kit{model: m})
	ctx := testCtx(t)

	// Before the crash: turn t-b streams (three text deltas stored) and
	// holds; turn t-a is queued behind it. Both are accepted at the same
	// (fake) time, so after the restart t-a, whose id sorts first, runs
	// first and the recovered t-b waits behind it.
	r1 := newRig(t, rigOptions{dir: dir, classes: []agent.Class{class}})
	a := getChat(t, r1.rt, "Rec", "q")
	const question = "please repeat this sentence back to me"
	if _, err := a.SubmitMessages(ctx, []message.Message{userMsg(question)}, chat.SubmitOptions{ID: "t-b"}); err != nil {
		t.Fatal(err)
	}
	if err := mclk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	step(t, mclk, modelDelay)
	step(t, mclk, modelDelay)
	if err := mclk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r1.db.waitFor(t, "the streamed chunks to be persisted", func() bool {
		return count(t, r1.sq, `SELECT COUNT(*) FROM chat_chunks WHERE stream_id = ? AND body LIKE ?`,
			"t-b", `%"`+message.ChunkTextDelta+`"%`) == 3
	})
	if _, err := a.SubmitMessages(ctx, []message.Message{userMsg("and this one")}, chat.SubmitOptions{ID: "t-a"}); err != nil {
		t.Fatal(err)
	}
	kept := count(t, r1.sq, `SELECT COUNT(*) FROM chat_chunks WHERE stream_id = ?`, "t-b")
	r1.close()

	env, turns := startEnv(t, dir, clockwork.NewFakeClock(), chat.Config{}, class)
	// t-a runs and holds on the model clock; t-b is queued.
	if err := mclk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	c := dialReady(t, env, "/agents/rec/q")
	c.ack("t-b")
	c.probe("p")
	got := c.until(func(f frame) bool { return f.ProbeID == "p" })
	if f := got[len(got)-1]; f.ID != "t-a" {
		t.Fatalf("probe answer %s, want t-a's stream", f.Raw)
	}
	for _, f := range got {
		if isResponse(f) && f.ID == "t-b" {
			t.Fatalf("ack of the queued recovered turn answered with %s before it ran", f.Raw)
		}
	}
	stop := pump(mclk, modelDelay)
	defer stop()
	have := c.until(isDone("t-b"))
	turns.wait(t, "turn", "stream", "t-b")
	stop()
	if rec := turns.wait(t, "recover-turn", "stream", "t-b"); rec.Attrs["keptChunks"].(int) != kept {
		t.Fatalf("recovery %v, want %d kept chunks", rec.Attrs, kept)
	}

	s := seqs(t, have, "t-b")
	consecutive(t, "acked socket", s, 0)
	if len(s) <= kept {
		t.Fatalf("seqs %v: nothing after the %d chunks from before the crash", s, kept)
	}
	complete := false
	for _, f := range have {
		if f.ID != "t-b" {
			continue
		}
		complete = complete || f.ReplayComplete
		if f.IsChatChunk() && f.Replay != (*f.Seq < kept) {
			t.Fatalf("frame %s: want the %d stored chunks replayed, the rest live", f.Raw, kept)
		}
	}
	if !complete {
		t.Fatal("no replayComplete after the stored chunks")
	}
	if end := have[len(have)-1]; end.Replay || end.Outcome != chat.OutcomeCompleted {
		t.Fatalf("t-b's end %s, want the live completed end", end.Raw)
	}

	// The stream the socket got is the stored one.
	c2 := dialReady(t, env, "/agents/rec/q")
	c2.ack("t-b")
	stored := c2.until(isDone("t-b"))
	bodies := func(fs []frame) []string {
		var out []string
		for _, f := range fs {
			if f.IsChatChunk() && f.ID == "t-b" {
				out = append(out, f.Body)
			}
		}
		return out
	}
	if b1, b2 := bodies(have), bodies(stored); !slices.Equal(b1, b2) {
		t.Fatalf("acked socket got %q, the stored stream is %q", b1, b2)
	}
}
