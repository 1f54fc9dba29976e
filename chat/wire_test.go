package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/model/scripted"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// dialReady dials path on env and completes the handshake.
func dialReady(t *testing.T, env *testenv.Env, path string) *wsClient {
	t.Helper()
	c := dial(t, env, path)
	c.handshake()
	return c
}

func userMsgID(id, text string) message.Message {
	m := userMsg(text)
	m.ID = id
	return m
}

// failingModel streams some text and then fails.
func failingModel() *scripted.Model {
	return scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{
		scripted.Text("partial answer "),
		scripted.Fail(errors.New("model overloaded")),
	})))
}

// streamErrDetail is what the failing model's error says; clients never see
// it, only the log does.
const streamErrDetail = "scripted: stream: model overloaded"

// TestModelErrorHeadless: a model stream that fails after some text ends
// the turn with outcome error; the partial text is kept. The error text is
// an internal error id, and the log holds the model's error under that id.
func TestModelErrorHeadless(t *testing.T) {
	var logs testenv.Logs
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", &kit{model: failingModel()})}, logger: logs.Logger()})
	a := getChat(t, r.rt, "Bot", "err")
	res, err := a.SaveMessages(testCtx(t), []message.Message{userMsg("hi")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != chat.OutcomeError {
		t.Fatalf("outcome %q error %q, want error", res.Outcome, res.Error)
	}
	logs.InternalError(t, res.Error, streamErrDetail, "agent=Bot/err")
	if res.Text() != "partial answer " {
		t.Fatalf("partial text %q", res.Text())
	}
}

// TestModelPublicErrorHeadless: a model error that wraps an
// *agent.PublicError ends the turn with that public text.
func TestModelPublicErrorHeadless(t *testing.T) {
	m := scripted.New(scripted.WithDefault(scripted.Always(scripted.Reply{
		scripted.Fail(agent.Publicf("the model is busy, try again in a minute")),
	})))
	r := newRig(t, rigOptions{classes: []agent.Class{chatClass("Bot", &kit{model: m})}})
	res, err := getChat(t, r.rt, "Bot", "pub").SaveMessages(testCtx(t), []message.Message{userMsg("hi")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != chat.OutcomeError || res.Error != "the model is busy, try again in a minute" {
		t.Fatalf("outcome %q error %q, want the public text", res.Outcome, res.Error)
	}
}

// checkErrorFrames asserts the end of a failed turn on the wire: content
// frames, then {body:<text>, done:false, error:true}, then
// {body:"", done:true, outcome:"error", messageIds}, and nothing else for
// the request. It returns the error text; errText "" accepts any.
func checkErrorFrames(t *testing.T, fs []frame, id, errText, userID string) string {
	t.Helper()
	var mine []frame
	for _, f := range fs {
		if isResponse(f) && f.ID == id {
			mine = append(mine, f)
		}
	}
	n := len(mine)
	if n < 3 {
		t.Fatalf("frames %v", mine)
	}
	e, d := mine[n-2], mine[n-1]
	if !e.Failed() || e.Ended() || (errText != "" && e.Body != errText) || !json.Valid([]byte(e.Raw)) {
		t.Fatalf("error frame %s, want body %q done:false error:true", e.Raw, errText)
	}
	if !d.Ended() || d.Body != "" || d.Outcome != chat.OutcomeError || d.Failed() || !slices.Equal(d.MessageIDs, []string{userID}) {
		t.Fatalf("terminal frame %s, want done:true outcome:error messageIds:[%s]", d.Raw, userID)
	}
	for _, f := range mine[:n-2] {
		if !f.IsChatChunk() {
			t.Fatalf("unexpected frame before the error: %s", f.Raw)
		}
		if c := chunkOf(t, f); c.Type == message.ChunkError {
			t.Fatalf("an error chunk was forwarded as a body: %s", f.Raw)
		}
	}
	return e.Body
}

// TestModelErrorOnTheWire: over a real WebSocket the failed turn ends with
// the error frame and then the terminal frame with outcome error; the
// frame carries an internal error id, not the model's error text.
func TestModelErrorOnTheWire(t *testing.T) {
	var logs testenv.Logs
	env := testenv.Start(t, testenv.Options{
		Postgres: &pg,
		Classes:  []agent.Class{chatClass("Bot", &kit{model: failingModel()})},
		Logger:   logs.Logger(),
		Clock:    clockwork.NewFakeClock(),
		Setup:    func(rt *agent.Runtime) error { chat.Configure(rt, chat.Config{}); return nil },
	})
	c := dialReady(t, env, "/agents/bot/err")
	c.request("req-err", userMsgID("u-err", "hi"))
	body := checkErrorFrames(t, c.until(isDone("req-err")), "req-err", "", "u-err")
	logs.InternalError(t, body, streamErrDetail)
}

// TestHandlerErrorChunkOnTheWire: a custom handler that writes an error
// chunk fails the turn the same way.
func TestHandlerErrorChunkOnTheWire(t *testing.T) {
	k := &kit{handle: func(ctx context.Context, tt *chat.Turn) error {
		if err := tt.WriteText("thinking… "); err != nil {
			return err
		}
		return tt.Write(message.Error("handler broke"))
	}}
	env, _ := startEnv(t, "", clockwork.NewFakeClock(), chat.Config{}, handlerClass("Custom", k))
	c := dialReady(t, env, "/agents/custom/err")
	c.request("req-h", userMsgID("u-h", "hi"))
	checkErrorFrames(t, c.until(isDone("req-h")), "req-h", "handler broke", "u-h")
}

// TestHandlerTurnOnTheWire: a handler that writes text and then runs the
// framework loop streams start (with the persisted assistant id) first and
// finish last; the other connection gets the transcript with the answer
// before the terminal frame; each connection sees exactly one done:true.
func TestHandlerTurnOnTheWire(t *testing.T) {
	m := scripted.New()
	k := &kit{handle: func(ctx context.Context, tt *chat.Turn) error {
		if err := tt.WriteText("Intro. "); err != nil {
			return err
		}
		return tt.RunLoop(ctx, chat.LoopOptions{Model: m})
	}}
	env, turns := startEnv(t, "", clockwork.NewFakeClock(), chat.Config{}, handlerClass("Custom", k))
	const path = "/agents/custom/ok"
	c1, c2 := dialReady(t, env, path), dialReady(t, env, path)
	c1.request("req-ok", userMsgID("u-ok", "hi"))
	f1 := c1.until(isDone("req-ok"))
	f2 := c2.until(isDone("req-ok"))
	turns.wait(t, "turn", "stream", "req-ok")

	msgs := getMessages(t, env.HTTP.URL, path)
	if len(msgs) != 2 || msgs[1].Role != message.RoleAssistant {
		t.Fatalf("transcript %s", dump(msgs))
	}
	asst := msgs[1]
	if got := chat.MessageText(asst); got != "Intro. You said: hi" {
		t.Fatalf("answer %q", got)
	}
	for name, fs := range map[string][]frame{"requester": f1, "other": f2} {
		var content []frame
		for _, f := range fs {
			if f.IsChatChunk() && f.ID == "req-ok" {
				content = append(content, f)
			}
		}
		first, last := chunkOf(t, content[0]), chunkOf(t, content[len(content)-1])
		if first.Type != message.ChunkStart || first.MessageID != asst.ID {
			t.Fatalf("%s: first chunk %s, want start with messageId %s", name, content[0].Body, asst.ID)
		}
		if last.Type != message.ChunkFinish {
			t.Fatalf("%s: last chunk %s, want finish", name, content[len(content)-1].Body)
		}
		consecutive(t, name, seqs(t, fs, "req-ok"), 0)
		d := fs[len(fs)-1]
		if d.Outcome != chat.OutcomeCompleted || d.Body != "" || !slices.Equal(d.MessageIDs, []string{"u-ok"}) {
			t.Fatalf("%s: terminal frame %s", name, d.Raw)
		}
	}
	// The other connection: the transcript with the answer, then done.
	withAnswer := slices.IndexFunc(f2, func(f frame) bool {
		if f.Type != wire.ChatMessages {
			return false
		}
		msgs := messagesOf(t, f)
		return len(msgs) == 2 && msgs[1].ID == asst.ID
	})
	if withAnswer < 0 {
		t.Fatalf("the other connection never got the transcript with the answer")
	}
	if got := chat.MessageText(messagesOf(t, f2[withAnswer])[1]); got != "Intro. You said: hi" {
		t.Fatalf("broadcast answer %q", got)
	}
	// (withAnswer < the index of done, since f2 ends with done.)
	if slices.ContainsFunc(f1, func(f frame) bool { return f.Type == wire.ChatMessages }) {
		t.Fatalf("the requester got a transcript frame during its own turn")
	}
	// Exactly one done per connection: probe, and read up to the answer.
	for name, c := range map[string]*wsClient{"requester": c1, "other": c2} {
		c.probe("after")
		c.until(func(f frame) bool { return f.Type == wire.StreamResumeNone })
		dones := 0
		for _, f := range c.all {
			if isResponse(f) && f.ID == "req-ok" && f.Ended() {
				dones++
			}
		}
		if dones != 1 {
			t.Fatalf("%s got %d done frames, want 1", name, dones)
		}
	}
}

// streamerEnv starts a server with the Streamer class, whose model echoes
// in chunks of 4 characters, the first at once and each next one delay
// later on the returned fake clock.
func streamerEnv(t *testing.T, delay time.Duration) (*testenv.Env, *eventLog, *clockwork.FakeClock) {
	t.Helper()
	mclk := clockwork.NewFakeClock()
	m := scripted.New(scripted.WithChunkSize(4), scripted.WithClock(mclk), scripted.WithDelay(delay))
	env, turns := startEnv(t, "", clockwork.NewFakeClock(), chat.Config{}, chatClass("Streamer", &kit{model: m}))
	return env, turns, mclk
}

// TestResumeProtocol drives the resume handshake against a turn held
// mid-stream by the model's fake clock.
func TestResumeProtocol(t *testing.T) {
	const delay = time.Second
	env, turns, mclk := streamerEnv(t, delay)
	const path = "/agents/streamer/r"
	ctx := testCtx(t)

	c1 := dialReady(t, env, path)
	// Idle: nothing to resume. The connection's first probe, answered
	// idle, is preceded by the transcript.
	c1.probe("p-idle")
	if f := c1.expect(wire.ChatMessages); len(messagesOf(t, f)) != 0 {
		t.Fatalf("transcript before the first idle answer %s", f.Raw)
	}
	if f := c1.expect(wire.StreamResumeNone); f.Reason != "idle" || f.ProbeID != "p-idle" {
		t.Fatalf("idle probe answer %s", f.Raw)
	}

	// "You said: hello there my friend" streams as 8 deltas of 4; the model
	// sends its first event at once, then waits a delay per event.
	c1.request("req1", userMsgID("u1", "hello there my friend"))
	if err := mclk.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	step(t, mclk, delay)
	step(t, mclk, delay)
	// start, start-step, text-start and three deltas: seq 0..5.
	c1.until(func(f frame) bool { return f.IsChatChunk() && *f.Seq == 5 })
	if err := mclk.BlockUntilContext(ctx, 1); err != nil { // held again
		t.Fatal(err)
	}

	c2 := dialReady(t, env, path)
	if f := c2.next(); f.Type != wire.StreamResuming || f.ID != "req1" {
		t.Fatalf("no proactive offer of the live stream: %s", f.Raw)
	}
	c2.probe("p-live")
	if f := c2.next(); f.Type != wire.StreamResuming || f.ID != "req1" || f.ProbeID != "p-live" {
		t.Fatalf("live probe answer %s", f.Raw)
	}
	c2.ack("req1")
	replay := c2.until(func(f frame) bool { return f.ReplayComplete })
	rc := replay[len(replay)-1]
	if !rc.Replay || rc.Ended() || rc.Body != "" || rc.ID != "req1" {
		t.Fatalf("replayComplete frame %s", rc.Raw)
	}
	for _, f := range replay[:len(replay)-1] {
		if !f.IsChatChunk() || !f.Replay {
			t.Fatalf("replayed frame %s", f.Raw)
		}
	}
	consecutive(t, "replay", seqs(t, replay, "req1"), 0)
	if n := len(seqs(t, replay, "req1")); n != 6 {
		t.Fatalf("replayed %d chunks, want 6 (seq 0..5)", n)
	}

	// Live again, one event at a time: the resumed connection gets each
	// chunk live, right after the replay.
	step(t, mclk, delay)
	f := c2.until(func(f frame) bool { return f.IsChatChunk() })
	if f[len(f)-1].Replay || *f[len(f)-1].Seq != 6 {
		t.Fatalf("first live frame after the replay %s, want seq 6 not replayed", f[len(f)-1].Raw)
	}
	stop := pump(mclk, delay)
	defer stop()
	c1.until(isDone("req1"))
	c2.until(isDone("req1"))
	turns.wait(t, "turn", "stream", "req1")
	stop()

	s1 := seqs(t, c1.all, "req1")
	s2 := seqs(t, c2.all, "req1")
	consecutive(t, "requester", s1, 0)
	consecutive(t, "resumed", s2, 0)
	if len(s1) != len(s2) {
		t.Fatalf("requester saw %d chunks, resumed connection %d", len(s1), len(s2))
	}
	bodies := func(c *wsClient) []string {
		var out []string
		for _, f := range c.all {
			if f.IsChatChunk() && f.ID == "req1" {
				out = append(out, f.Body)
			}
		}
		return out
	}
	if !slices.Equal(bodies(c1), bodies(c2)) {
		t.Fatal("replayed and live chunks differ between the connections")
	}
	for _, f := range c2.all {
		if f.IsChatChunk() && f.ID == "req1" && f.Replay != (*f.Seq <= 5) {
			t.Fatalf("frame %s: replay flag wrong", f.Raw)
		}
	}

	// A finished stream: replay, then done with replay:true and the outcome.
	c3 := dialReady(t, env, path)
	c3.ack("req1")
	fin := c3.until(isDone("req1"))
	d := fin[len(fin)-1]
	if !d.Replay || d.Outcome != chat.OutcomeCompleted || !slices.Equal(d.MessageIDs, []string{"u1"}) {
		t.Fatalf("terminal replay frame %s", d.Raw)
	}
	s3 := seqs(t, fin, "req1")
	consecutive(t, "finished replay", s3, 0)
	if len(s3) != len(s1) {
		t.Fatalf("finished replay has %d chunks, want %d", len(s3), len(s1))
	}
	for _, f := range fin[:len(fin)-1] {
		if !f.IsChatChunk() || !f.Replay {
			t.Fatalf("finished replay frame %s", f.Raw)
		}
	}

	// An unknown stream: a bare terminal replay frame.
	c3.ack("nope")
	u := c3.next()
	if !isResponse(u) || u.ID != "nope" || !u.Ended() || !u.Replay || u.Body != "" || u.Outcome != "" {
		t.Fatalf("unknown stream ack answer %s", u.Raw)
	}
	// And the probe is idle again (c3's first: the transcript comes first).
	c3.probe("p-end")
	if f := c3.expect(wire.ChatMessages); len(messagesOf(t, f)) != 2 {
		t.Fatalf("transcript before the first idle answer %s", f.Raw)
	}
	if f := c3.expect(wire.StreamResumeNone); f.ProbeID != "p-end" {
		t.Fatalf("probe answer %s", f.Raw)
	}
}

// TestFirstProbeCarriesTheTranscript: a chat that starts listening late
// (useAgentChat mounts behind a Suspense boundary that waits for
// get-messages) has missed every frame since its socket opened, and its
// history may predate a turn that ended since. Its connection's first
// probe, answered idle, brings the transcript ahead of resume_none; a
// later probe brings none, and neither does a first probe answered with a
// stream (that stream's end broadcasts the transcript to a listener).
func TestFirstProbeCarriesTheTranscript(t *testing.T) {
	const delay = time.Second
	env, turns, mclk := streamerEnv(t, delay)
	const path = "/agents/streamer/late"
	ctx := testCtx(t)

	c1 := dialReady(t, env, path)
	c1.request("req1", userMsgID("u1", "hello there"))
	if err := mclk.BlockUntilContext(ctx, 1); err != nil { // held after the first event
		t.Fatal(err)
	}
	c1.until(func(f frame) bool { return f.IsChatChunk() })
	// Both connect mid-turn: the transcript on connect holds the question
	// alone, and the stream is offered. c2's chat does not listen yet;
	// c3's probes.
	c2, c3 := dial(t, env, path), dial(t, env, path)
	for _, c := range []*wsClient{c2, c3} {
		if f := c.handshake(); len(messagesOf(t, f)) != 1 {
			t.Fatalf("transcript on connect mid-turn %s", f.Raw)
		}
		c.expect(wire.StreamResuming)
	}
	c3.probe("p3")
	if f := c3.expect(wire.StreamResuming); f.ProbeID != "p3" {
		t.Fatalf("live probe answer %s", f.Raw)
	}
	stop := pump(mclk, delay)
	c1.until(isDone("req1"))
	turns.wait(t, "turn", "stream", "req1")
	stop()
	ended := func(f frame) bool { return f.Type == wire.ChatMessages && len(messagesOf(t, f)) == 2 }
	c2.until(ended) // the broadcast at the turn's end, which c2's chat missed
	c3.until(ended)

	c2.probe("p2")
	f := c2.expect(wire.ChatMessages)
	if msgs := messagesOf(t, f); len(msgs) != 2 || msgs[0].ID != "u1" || msgs[1].Role != message.RoleAssistant ||
		!strings.Contains(dump(msgs[1:]), "You said: hello there") || f.Connect {
		t.Fatalf("transcript before the first idle answer %s", f.Raw)
	}
	if f := c2.expect(wire.StreamResumeNone); f.Reason != "idle" || f.ProbeID != "p2" {
		t.Fatalf("idle probe answer %s", f.Raw)
	}
	c2.probe("p2-again")
	if f := c2.expect(wire.StreamResumeNone); f.ProbeID != "p2-again" {
		t.Fatalf("second probe answer %s", f.Raw)
	}
	c3.probe("p3-idle")
	if f := c3.expect(wire.StreamResumeNone); f.ProbeID != "p3-idle" {
		t.Fatalf("idle probe after a live one %s", f.Raw)
	}
}

// TestClearDuringTurn: a clear from a client aborts the running turn, tells
// the other connections, and leaves nothing in storage: no message, chunk
// or stream of the aborted turn is written after the clear.
func TestClearDuringTurn(t *testing.T) {
	mclk := clockwork.NewFakeClock()
	const delay = time.Second
	m := scripted.New(scripted.WithChunkSize(4), scripted.WithClock(mclk), scripted.WithDelay(delay))
	k := &kit{model: m, ended: make(chan chat.TurnResult, 8)}
	// FlushChunks 1: every chunk is persisted as it is streamed.
	env, _ := startEnv(t, "", clockwork.NewFakeClock(), chat.Config{FlushChunks: 1}, chatClass("Bot", k))
	const path = "/agents/bot/clear"
	c1, c2 := dialReady(t, env, path), dialReady(t, env, path)
	c1.request("req-c", userMsgID("u-c", "a long question to answer"))
	if err := mclk.BlockUntilContext(testCtx(t), 1); err != nil {
		t.Fatal(err)
	}
	step(t, mclk, delay)
	c1.until(func(f frame) bool { return f.IsChatChunk() && *f.Seq == 4 })

	c1.send(map[string]any{"type": wire.ChatClear})
	c2.until(func(f frame) bool { return f.Type == wire.ChatClear })
	var res chat.TurnResult
	select {
	case res = <-k.ended:
	case <-time.After(waitLimit):
		t.Fatal("the turn never ended")
	}
	if res.ID != "req-c" || res.Outcome != chat.OutcomeAborted {
		t.Fatalf("turn ended %s %s, want req-c aborted", res.ID, res.Outcome)
	}
	a := getChat(t, env.RT, "Bot", "clear")
	if msgs := a.Messages(); len(msgs) != 0 {
		t.Fatalf("transcript after clear: %s", dump(msgs))
	}
	if msgs := getMessages(t, env.HTTP.URL, path); len(msgs) != 0 {
		t.Fatalf("get-messages after clear: %s", dump(msgs))
	}
	iid := a.InstanceID()
	for _, table := range []string{"chat_messages", "chat_chunks", "chat_streams"} {
		if n := count(t, env.DB, `SELECT COUNT(*) FROM `+table+` WHERE instance_id = ?`, iid); n != 0 {
			t.Fatalf("%d rows in %s after the clear", n, table)
		}
	}
	// The agent is usable again.
	stop := pump(mclk, delay)
	defer stop()
	res2, err := a.SaveMessages(testCtx(t), []message.Message{userMsg("again")})
	if err != nil || res2.Outcome != chat.OutcomeCompleted || res2.Text() != "You said: again" {
		t.Fatalf("turn after clear: %+v, %v", res2, err)
	}
	<-k.ended
}

// TestClientTranscriptReplacement: cf_agent_chat_messages from a client
// replaces the stored transcript and reaches the other connections, not
// the sender.
func TestClientTranscriptReplacement(t *testing.T) {
	env, _ := startEnv(t, "", clockwork.NewFakeClock(), chat.Config{}, chatClass("Bot", &kit{model: scripted.New()}))
	const path = "/agents/bot/replace"
	c1, c2 := dialReady(t, env, path), dialReady(t, env, path)
	// c1's chat listens (its first probe, answered idle, carries the
	// transcript; see TestFirstProbeCarriesTheTranscript).
	c1.probe("p0")
	c1.expect(wire.ChatMessages)
	c1.expect(wire.StreamResumeNone)
	msgs := []message.Message{
		userMsgID("m1", "question"),
		{ID: "m2", Role: message.RoleAssistant, Parts: []message.Part{{Type: message.PartText, Text: "answer"}}},
	}
	c1.send(map[string]any{"type": wire.ChatMessages, "messages": msgs})
	f := c2.expect(wire.ChatMessages)
	if got := messagesOf(t, f); dump(got) != dump(msgs) || got[0].ID != "m1" || got[1].ID != "m2" {
		t.Fatalf("broadcast transcript %s", f.Raw)
	}
	// Not echoed to the sender: its next frame answers its probe.
	c1.probe("p")
	c1.expect(wire.StreamResumeNone)

	a := getChat(t, env.RT, "Bot", "replace")
	var ids []string
	err := env.DB.View(context.Background(), func(tx store.Tx) error {
		rows, err := tx.Query(context.Background(), `SELECT id FROM chat_messages WHERE instance_id = ? ORDER BY position`, a.InstanceID())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		return rows.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, []string{"m1", "m2"}) {
		t.Fatalf("stored message ids %v", ids)
	}
}

// TestClientToolResult: cf_agent_tool_result updates the tool part,
// persists it and broadcasts cf_agent_message_updated to every connection.
func TestClientToolResult(t *testing.T) {
	env, _ := startEnv(t, "", clockwork.NewFakeClock(), chat.Config{}, chatClass("Bot", &kit{model: scripted.New()}))
	const path = "/agents/bot/tools"
	c1, c2 := dialReady(t, env, path), dialReady(t, env, path)
	asst := message.Message{ID: "a1", Role: message.RoleAssistant, Parts: []message.Part{
		{Type: message.PartStepStart},
		{Type: "tool-getLocation", ToolCallID: "call_loc", State: message.StateInputAvailable, Input: json.RawMessage(`{}`)},
	}}
	c1.send(map[string]any{"type": wire.ChatMessages, "messages": []message.Message{userMsgID("u1", "where am I?"), asst}})
	c2.expect(wire.ChatMessages)
	c1.send(map[string]any{"type": wire.ToolResult, "toolCallId": "call_loc", "toolName": "getLocation",
		"output": map[string]any{"city": "Paris"}, "autoContinue": false})
	for name, c := range map[string]*wsClient{"sender": c1, "other": c2} {
		f := c.expect(wire.MessageUpdated)
		m := messageOf(t, f)
		if m == nil || m.ID != "a1" {
			t.Fatalf("%s: update %s", name, f.Raw)
		}
		p := toolParts(*m)
		if len(p) != 1 || p[0].State != message.StateOutputAvailable || string(p[0].Output) != `{"city":"Paris"}` {
			t.Fatalf("%s: updated part %+v", name, p)
		}
	}
	a := getChat(t, env.RT, "Bot", "tools")
	var body string
	err := env.DB.View(context.Background(), func(tx store.Tx) error {
		return tx.QueryRow(context.Background(), `SELECT body FROM chat_messages WHERE instance_id = ? AND id = ?`, a.InstanceID(), "a1").Scan(&body)
	})
	if err != nil {
		t.Fatal(err)
	}
	var stored message.Message
	if err := json.Unmarshal([]byte(body), &stored); err != nil {
		t.Fatal(err)
	}
	if p := toolParts(stored); len(p) != 1 || p[0].State != message.StateOutputAvailable || string(p[0].Output) != `{"city":"Paris"}` {
		t.Fatalf("stored part %+v", p)
	}
	// An unknown call id is refused.
	c1.send(map[string]any{"type": wire.ToolResult, "toolCallId": "nope", "output": 1})
	if f := c1.next(); f.Type == wire.MessageUpdated {
		t.Fatalf("unknown tool call updated a message: %s", f.Raw)
	}
}

// TestQueuedRequestsBounded: while a turn runs, a client's further chat
// requests queue up to Config.MaxQueuedRequests; the next one is refused
// with an error response at once, and the queued ones still run.
func TestQueuedRequestsBounded(t *testing.T) {
	q := startHeld(t, chat.Config{MaxQueuedRequests: 2})
	c := q.client(t, "q")
	c.request("r0", userMsgID("u0", "first"))
	<-q.started
	c.request("r1", userMsgID("u1", "second"))
	c.request("r2", userMsgID("u2", "third"))
	c.request("r3", userMsgID("u3", "one too many"))
	refused := c.until(isDone("r3"))
	last := refused[len(refused)-1]
	if !last.Failed() || !strings.Contains(last.Body, "too many chat requests are queued") || !strings.Contains(last.Body, "limit is 2") {
		t.Fatalf("r3 ended with %s, want the queue limit's error", last.Raw)
	}
	for _, f := range refused {
		if isResponse(f) && f.Ended() && f.ID != "r3" {
			t.Fatalf("a queued request ended before the release: %s", f.Raw)
		}
	}
	close(q.release)
	for _, id := range []string{"r0", "r1", "r2"} {
		fs := c.until(isDone(id))
		if end := fs[len(fs)-1]; end.Failed() || end.Outcome != "completed" {
			t.Fatalf("%s ended with %s, want completed", id, end.Raw)
		}
	}
}
