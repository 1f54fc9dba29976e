package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// LayerConnect sends a new connection the transcript and, when a turn is
// streaming, offers it the stream (the connection then waits for its replay
// instead of receiving live chunks).
func (b *Base) LayerConnect(ctx context.Context, conn *agent.Conn) {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	// From now on live chunks reach this connection; those streamed before
	// reach it through the resume offer below.
	c.admitted[conn] = true
	conn.SendRaw(messagesFrame{Type: wire.ChatMessages, Messages: nonNil(c.msgs), Connect: true}.encode())
	if t := c.active; t != nil && t.started {
		c.pending[conn] = t.row.ID
		conn.SendRaw(encode(wire.StreamFrame{Type: wire.StreamResuming, ID: t.row.ID}))
	}
}

// LayerClose forgets a closed connection's resume state.
func (b *Base) LayerClose(ctx context.Context, conn *agent.Conn) {
	c := b.c
	c.mu.Lock()
	delete(c.admitted, conn)
	delete(c.pending, conn)
	delete(c.awaiting, conn)
	delete(c.probed, conn)
	c.mu.Unlock()
}

// LayerHTTP answers GET …/get-messages with the transcript.
func (b *Base) LayerHTTP(ctx context.Context, w http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path != "/get-messages" {
		return false
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return true
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(encode(nonNil(b.Messages())))
	return true
}

// LayerFrame handles the chat protocol's client frames.
func (b *Base) LayerFrame(ctx context.Context, conn *agent.Conn, typ string, data []byte) bool {
	c := b.c
	switch typ {
	case wire.ChatRequest:
		c.onRequest(ctx, conn, data)
	case wire.ChatCancel:
		var f struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(data, &f) != nil || f.ID == "" {
			conn.SendError("bad_chat_frame", "cancel frame needs an id")
			return true
		}
		c.cancel(f.ID, errCanceled)
	case wire.StreamResumeRequest:
		var f struct {
			ProbeID string `json:"probeId"`
		}
		_ = json.Unmarshal(data, &f)
		c.onResumeRequest(conn, f.ProbeID)
	case wire.StreamResumeAck:
		var f struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(data, &f) != nil || f.ID == "" {
			conn.SendError("bad_chat_frame", "resume ack needs an id")
			return true
		}
		c.onResumeAck(ctx, conn, f.ID)
	case wire.ChatClear:
		if err := c.clear(ctx, conn); err != nil {
			conn.SendError("chat_failed", c.rt.ClientMessage(err, "agent", c.b.Path().String(), "in", "chat clear"))
		}
	case wire.ChatMessages:
		var f struct {
			Messages []message.Message `json:"messages"`
		}
		if err := json.Unmarshal(data, &f); err != nil {
			conn.SendError("bad_chat_frame", "malformed messages frame: "+err.Error())
			return true
		}
		if err := c.replaceTranscript(ctx, f.Messages, conn); err != nil {
			conn.SendError("chat_failed", c.rt.ClientMessage(err, "agent", c.b.Path().String(), "in", "chat messages"))
		}
	case wire.ToolResult:
		c.onToolResult(ctx, conn, data)
	case wire.ToolApproval:
		c.onToolApproval(ctx, conn, data)
	default:
		return false
	}
	return true
}

// onRequest accepts a cf_agent_use_chat_request.
func (c *core) onRequest(ctx context.Context, conn *agent.Conn, data []byte) {
	var f struct {
		ID   string `json:"id"`
		Init struct {
			Method string `json:"method"`
			Body   string `json:"body"`
		} `json:"init"`
	}
	fail := func(msg string) {
		if f.ID != "" {
			conn.Send(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: f.ID, Body: msg, Done: true, Error: true})
		} else {
			conn.SendError("bad_chat_request", msg)
		}
	}
	if err := json.Unmarshal(data, &f); err != nil {
		fail("malformed chat request: " + err.Error())
		return
	}
	if f.ID == "" {
		fail("chat request has no id")
		return
	}
	if f.Init.Method != "" && f.Init.Method != http.MethodPost {
		fail("chat request method must be POST")
		return
	}
	body, err := decodeRequestBody([]byte(f.Init.Body))
	if err != nil {
		fail("chat request body is not JSON: " + err.Error())
		return
	}
	if body.messages == nil {
		fail("chat request body has no messages")
		return
	}
	c.mu.Lock()
	dup := c.active != nil && c.active.row.ID == f.ID
	for _, t := range c.queue {
		dup = dup || t.row.ID == f.ID
	}
	c.mu.Unlock()
	if dup {
		return // the client re-sent a request that is already running
	}
	msgs := c.dropContinuationStandIns(ctx, body.messages)
	// A submission whose transcript ends with the assistant message is the
	// AI SDK's own continuation (sendAutomaticallyWhen after
	// addToolApprovalResponse or addToolOutput): the turn continues that
	// message, running what its answers approved.
	cont := body.trigger != "regenerate-message" && lastAssistant(msgs) != nil
	_, err = c.accept(ctx, acceptRequest{replace: msgs, origin: conn, id: f.ID, body: body.extra, limited: true, clientID: true, continuation: cont})
	switch {
	case errors.Is(err, errResent):
		// A re-sent request whose turn ran already: the client gets that
		// turn's stream, as a resume would give it, and nothing runs again.
		c.onResumeAck(ctx, conn, f.ID)
	case errors.Is(err, ErrTooManyTurns):
		fail(fmt.Sprintf("too many chat turns are in flight on this server (the limit is %d); send it again later",
			c.cfg.MaxTurnsInFlight))
	case errors.Is(err, ErrTooManyQueued):
		fail(fmt.Sprintf("too many chat requests are queued on this agent (the limit is %d); send it again when a turn has ended",
			c.cfg.MaxQueuedRequests))
	case err != nil:
		c.log.Error("chat: accept request", "err", err)
		fail("could not accept the request")
	}
}

// onResumeRequest answers a client's resume probe.
//
// A chat client sends its first probe once its listener is registered,
// which can be well after the socket opened: useAgentChat mounts behind a
// Suspense boundary that waits for get-messages, and the frames the socket
// carried before then (the transcript on connect, the offer of a stream,
// the transcript at that stream's end) reached no listener. Its history is
// what get-messages answered, possibly before a turn that has ended since.
// So the first probe of a connection, answered idle, is preceded by the
// transcript. A probe answered otherwise needs none: the turn it offers or
// announces ends with a transcript broadcast, which now has a listener.
func (c *core) onResumeRequest(conn *agent.Conn, probeID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := !c.probed[conn]
	c.probed[conn] = true
	switch t := c.active; {
	case t != nil && t.started:
		c.pending[conn] = t.row.ID
		conn.SendRaw(encode(wire.StreamFrame{Type: wire.StreamResuming, ID: t.row.ID, ProbeID: probeID}))
	case t != nil || len(c.queue) > 0:
		id := ""
		if t != nil {
			id = t.row.ID
		} else {
			id = c.queue[0].row.ID
		}
		c.awaiting[conn] = true
		conn.SendRaw(encode(wire.StreamFrame{Type: wire.StreamPending, ID: id, ProbeID: probeID}))
	default:
		if first {
			conn.SendRaw(messagesFrame{Type: wire.ChatMessages, Messages: nonNil(c.msgs)}.encode())
		}
		conn.SendRaw(encode(wire.StreamFrame{Type: wire.StreamResumeNone, Reason: "idle", ProbeID: probeID}))
	}
}

// onResumeAck replays a stream to a connection that accepted the offer:
// every chunk so far, then (live) replayComplete and live chunks from then
// on, or (finished) the terminal frame.
//
// A turn that has not started (queued behind another one, as a client's
// own turn is behind another tab's or a notice's) has no stream to replay
// yet, and none to end: the connection takes it live from its start (the
// reference server ignores such an ack while another stream is active).
// A recovered turn's chunks from before the crash are stored, never sent
// live: the connection gets them replayed when the turn reads them
// (keepStored).
func (c *core) onResumeAck(ctx context.Context, conn *agent.Conn, id string) {
	c.mu.Lock()
	if t := c.notLoadedLocked(id); t != nil {
		delete(c.pending, conn)
		if t.recovering {
			if t.acked == nil {
				t.acked = map[*agent.Conn]bool{}
			}
			t.acked[conn] = true
		}
		c.mu.Unlock()
		return
	}
	if t := c.active; t != nil && t.row.ID == id {
		for _, sc := range t.chunks {
			seq := sc.Seq
			conn.SendRaw(encodeResponse(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: id, Body: sc.Body, Seq: &seq, Replay: true, Continuation: t.row.Continuation}))
		}
		conn.SendRaw(encodeResponse(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: id, Replay: true, ReplayComplete: true, Continuation: t.row.Continuation}))
		delete(c.pending, conn)
		c.mu.Unlock()
		return
	}
	delete(c.pending, conn)
	c.mu.Unlock()

	var row streamRow
	var found bool
	var chunks []storedChunk
	err := c.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		row, found, err = getStream(ctx, tx, c.iid, id)
		if err != nil || !found {
			return err
		}
		chunks, err = loadChunks(ctx, tx, c.iid, id)
		return err
	})
	if err != nil {
		c.log.Error("chat: load stream for replay", "stream", id, "err", err)
	}
	if !found || row.Status != statusDone {
		conn.Send(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: id, Done: true, Replay: true})
		return
	}
	for _, sc := range chunks {
		seq := sc.Seq
		conn.SendRaw(encodeResponse(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: id, Body: sc.Body, Seq: &seq, Replay: true, Continuation: row.Continuation}))
	}
	if row.Outcome == OutcomeError {
		conn.Send(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: id, Body: row.Error, Error: true, Replay: true, Continuation: row.Continuation})
	}
	conn.Send(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: id, Done: true, Replay: true, MessageIDs: row.MessageIDs,
		Outcome: row.Outcome, Continuation: row.Continuation})
}

// notLoadedLocked returns turn id if it is queued, or active and
// recovering but without its stored stream read yet. c.mu held.
func (c *core) notLoadedLocked(id string) *turn {
	if t := c.active; t != nil && t.row.ID == id && t.recovering && !t.loaded {
		return t
	}
	for _, t := range c.queue {
		if t.row.ID == id {
			return t
		}
	}
	return nil
}

// clear wipes the transcript and streams, aborts the turns, and tells the
// other connections (all of them when from is nil).
func (c *core) clear(ctx context.Context, from *agent.Conn) error {
	c.acceptMu.Lock()
	defer c.acceptMu.Unlock()
	c.mu.Lock()
	c.gen++
	c.setLastLocked(nil, TurnResult{})
	active := c.active
	queued := c.queue
	c.queue = nil
	c.dequeued(queued...)
	for _, t := range queued {
		t.slot.release()
	}
	c.msgs = nil
	clear(c.pending)
	clear(c.awaiting)
	c.mu.Unlock()
	if active != nil {
		active.cancel(errCanceled)
	}
	for _, t := range queued {
		t.cancel(errCanceled)
	}
	err := c.b.DB().Update(ctx, func(tx store.Tx) error {
		for _, q := range []string{
			`DELETE FROM chat_messages WHERE instance_id = ?`,
			`DELETE FROM chat_chunks WHERE instance_id = ?`,
			`DELETE FROM chat_streams WHERE instance_id = ?`,
		} {
			if _, err := tx.Exec(ctx, q, c.iid); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		c.stored.lose()
		return err
	}
	c.stored.cleared()
	frame := encode(wire.StreamFrame{Type: wire.ChatClear})
	if from != nil {
		c.b.BroadcastRaw(frame, from)
	} else {
		c.b.BroadcastRaw(frame)
	}
	return nil
}

// replaceTranscript stores a transcript a client sent and tells the others.
func (c *core) replaceTranscript(ctx context.Context, msgs []message.Message, from *agent.Conn) error {
	c.acceptMu.Lock()
	defer c.acceptMu.Unlock()
	for i := range msgs {
		if msgs[i].ID == "" {
			msgs[i].ID = newID()
		}
	}
	plan, err := c.stored.plan(ctx, c.b.DB(), c.iid, msgs)
	if err != nil {
		return err
	}
	err = c.b.DB().Update(ctx, func(tx store.Tx) error { return plan.apply(ctx, tx, c.iid) })
	c.stored.wrote(plan, err)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.msgs = msgs
	c.mu.Unlock()
	c.broadcastTranscript(from)
	return nil
}

// onToolResult applies a client tool's result (cf_agent_tool_result) and,
// with autoContinue, runs a continuation turn once the step is answered.
func (c *core) onToolResult(ctx context.Context, conn *agent.Conn, data []byte) {
	var f struct {
		ToolCallID   string             `json:"toolCallId"`
		Output       json.RawMessage    `json:"output"`
		State        string             `json:"state"`
		ErrorText    string             `json:"errorText"`
		AutoContinue bool               `json:"autoContinue"`
		ClientTools  []ClientToolSchema `json:"clientTools"`
	}
	if err := json.Unmarshal(data, &f); err != nil || f.ToolCallID == "" {
		conn.SendError("bad_chat_frame", "tool result needs a toolCallId")
		return
	}
	errText := ""
	if f.State == message.StateOutputError {
		errText = f.ErrorText
		if errText == "" {
			errText = "tool failed"
		}
	}
	_, err := c.answer(ctx, nil, f.ToolCallID, AnswerOptions{AutoContinue: f.AutoContinue, ClientTools: f.ClientTools},
		outputAnswer(f.Output, errText))
	c.answerFailed(conn, f.ToolCallID, err)
}

// onToolApproval applies a user's approval decision (cf_agent_tool_approval)
// and, with autoContinue, runs a continuation turn once the step is
// answered.
func (c *core) onToolApproval(ctx context.Context, conn *agent.Conn, data []byte) {
	var f struct {
		ToolCallID   string `json:"toolCallId"`
		Approved     bool   `json:"approved"`
		Reason       string `json:"reason"`
		AutoContinue bool   `json:"autoContinue"`
	}
	if err := json.Unmarshal(data, &f); err != nil || f.ToolCallID == "" {
		conn.SendError("bad_chat_frame", "tool approval needs a toolCallId")
		return
	}
	_, err := c.b.AddToolApprovalResponse(ctx, f.ToolCallID, f.Approved, f.Reason, AnswerOptions{AutoContinue: f.AutoContinue})
	c.answerFailed(conn, f.ToolCallID, err)
}

// answerFailed tells a connection why its tool answer was refused.
func (c *core) answerFailed(conn *agent.Conn, toolCallID string, err error) {
	switch {
	case err == nil:
	case errors.Is(err, ErrUnknownToolCall):
		conn.SendError("unknown_tool_call", "no tool call "+toolCallID+" in the last assistant message")
	case errors.Is(err, ErrNotWaiting), errors.Is(err, ErrTurnRunning):
		conn.SendError("tool_call_not_waiting", err.Error())
	default:
		conn.SendError("chat_failed", c.rt.ClientMessage(err, "agent", c.b.Path().String(), "in", "tool answer"))
	}
}
