package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
)

// turn is one queued or running turn and its live stream.
type turn struct {
	c          *core
	row        streamRow
	origin     *agent.Conn
	recovering bool
	ctx        context.Context
	cancel     context.CancelCauseFunc

	// Guarded by c.mu: the stream as clients see it.
	started   bool
	chunks    []storedChunk // every chunk of the stream so far, for replay
	unflushed []storedChunk
	nextSeq   int
	flushT    clockwork.Timer

	flushMu sync.Mutex // serializes flushes
	writeMu sync.Mutex // serializes writes (tools run in parallel)

	// Owned by the turn's goroutine.
	builder  *message.Builder
	finished bool // a finish chunk was written
	errText  string
}

func (c *core) newTurn(row streamRow, origin *agent.Conn) *turn {
	ctx, cancel := context.WithCancelCause(agent.WithAgent(c.rt.Context(), c.self))
	t := &turn{c: c, row: row, origin: origin, cancel: cancel, nextSeq: row.NextSeq}
	t.ctx = context.WithValue(ctx, turnKey{}, t)
	return t
}

type turnKey struct{}

// CurrentTurn returns the id of the chat turn whose code (a tool, a
// handler) runs in ctx, and the agent it belongs to.
func CurrentTurn(ctx context.Context) (id string, a agent.Agent, ok bool) {
	t, ok := ctx.Value(turnKey{}).(*turn)
	if !ok {
		return "", nil, false
	}
	return t.row.ID, t.c.self, true
}

// WriteChunk writes a chunk into the chat turn whose code runs in ctx (for
// example a data part from inside a tool). It is safe for concurrent use.
func WriteChunk(ctx context.Context, ch message.Chunk) error {
	t, ok := ctx.Value(turnKey{}).(*turn)
	if !ok {
		return errors.New("chat: no turn in context")
	}
	return t.write(ch)
}

// cancel aborts a running or queued turn.
func (c *core) cancel(id string, cause error) bool {
	c.mu.Lock()
	if c.active != nil && c.active.row.ID == id {
		t := c.active
		c.mu.Unlock()
		t.cancel(cause)
		return true
	}
	for i, t := range c.queue {
		if t.row.ID == id {
			c.queue = append(c.queue[:i:i], c.queue[i+1:]...)
			// Still waitable until its end is recorded.
			c.ending[id] = true
			c.mu.Unlock()
			t.cancel(cause)
			c.rt.Go(func(ctx context.Context) {
				res := c.finishTurn(ctx, t, OutcomeAborted, "")
				c.mu.Lock()
				delete(c.ending, id)
				waiters := c.waiters[id]
				delete(c.waiters, id)
				c.mu.Unlock()
				for _, w := range waiters {
					w <- res
				}
			})
			return true
		}
	}
	c.mu.Unlock()
	return false
}

// Turn is a running turn as a Handler sees it.
type Turn struct {
	t *turn
	// ID is the turn's request (stream) id.
	ID string
	// MessageID is the id of the assistant message the turn writes.
	MessageID string
	// Messages is the transcript the turn answers, ending with the new user
	// messages.
	Messages []message.Message
	// Body holds the extra fields of the client's request body.
	Body json.RawMessage
	// Recovering is true when the turn is run again after a restart.
	Recovering bool
	// Continuation is true when the turn continues the last assistant
	// message (after a client tool result).
	Continuation bool
}

// Write streams one chunk of the assistant message. The framework sends
// start and finish itself; an "error" chunk fails the turn.
func (tt *Turn) Write(ch message.Chunk) error { return tt.t.write(ch) }

// WriteText streams s as one text part.
func (tt *Turn) WriteText(s string) error {
	id := newID()
	for _, ch := range []message.Chunk{message.TextStart(id), message.TextDelta(id, s), message.TextEnd(id)} {
		if err := tt.t.write(ch); err != nil {
			return err
		}
	}
	return nil
}

// Message returns the assistant message written so far.
func (tt *Turn) Message() message.Message {
	tt.t.writeMu.Lock()
	defer tt.t.writeMu.Unlock()
	return tt.t.builder.Message()
}

var errTurnError = errors.New("turn failed")

// write applies a chunk to the message and sends it to the clients.
func (t *turn) write(ch message.Chunk) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if err := t.ctx.Err(); err != nil {
		return context.Cause(t.ctx)
	}
	switch ch.Type {
	case message.ChunkStart:
		return nil // the framework sent it
	case message.ChunkError:
		t.errText = ch.ErrorText
		return fmt.Errorf("%w: %s", errTurnError, ch.ErrorText)
	case message.ChunkFinish:
		t.finished = true
	}
	if err := t.builder.Apply(ch); err != nil {
		return fmt.Errorf("chat: invalid chunk stream: %w", err)
	}
	t.send(ch)
	return nil
}

// send numbers a chunk, broadcasts it to the connections that are not
// waiting for a resume, and queues it for persistence.
func (t *turn) send(ch message.Chunk) {
	c := t.c
	body, err := json.Marshal(ch)
	if err != nil {
		c.log.Error("chat: encode chunk", "err", err)
		return
	}
	c.mu.Lock()
	seq := t.nextSeq
	t.nextSeq++
	sc := storedChunk{Seq: seq, Body: string(body)}
	t.chunks = append(t.chunks, sc)
	t.unflushed = append(t.unflushed, sc)
	frame := encode(responseFrame{Type: frameResponse, ID: t.row.ID, Body: sc.Body, Seq: &seq, Continuation: t.row.Continuation})
	for conn := range c.admitted {
		if _, waiting := c.pending[conn]; !waiting {
			conn.SendRaw(frame)
		}
	}
	for f := range c.follow[t.row.ID] {
		f.fn(seq, sc.Body)
	}
	if !t.started {
		t.started = true
		// Clients that probed while the turn was queued get their offer now.
		offer := encode(probeFrame{Type: frameResuming, ID: t.row.ID})
		for conn := range c.awaiting {
			c.pending[conn] = t.row.ID
			conn.SendRaw(offer)
		}
		clear(c.awaiting)
	}
	full := len(t.unflushed) >= c.cfg.FlushChunks
	if !full && t.flushT == nil {
		t.flushT = c.rt.Clock().AfterFunc(c.cfg.FlushInterval, func() { t.flush(c.rt.Context()) })
	}
	c.mu.Unlock()
	if full {
		t.flush(c.rt.Context())
	}
}

// flush persists the chunks that wait, in one transaction.
func (t *turn) flush(ctx context.Context) {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	c := t.c
	c.mu.Lock()
	batch := t.unflushed
	t.unflushed = nil
	if t.flushT != nil {
		t.flushT.Stop()
		t.flushT = nil
	}
	c.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	err := c.rt.DB().Update(ctx, func(tx store.Tx) error { return insertChunks(ctx, tx, c.iid, t.row.ID, batch) })
	if err != nil && ctx.Err() == nil {
		c.log.Error("chat: persist chunks", "stream", t.row.ID, "err", err)
	}
}

// run executes one turn to its end and returns its result.
func (c *core) run(ctx context.Context, t *turn) TurnResult {
	defer t.cancel(nil)
	if t.ctx.Err() != nil {
		return c.finishTurn(ctx, t, OutcomeAborted, "")
	}
	c.mu.Lock()
	transcript := make([]message.Message, len(c.msgs))
	copy(transcript, c.msgs)
	c.mu.Unlock()
	if i := anchorIndex(transcript, t.row); i >= 0 {
		transcript = transcript[:i+1] // later messages belong to queued turns
	}

	policy := RecoverContinue
	if t.recovering {
		var err error
		policy, err = c.prepareRecovery(ctx, t, transcript)
		if err != nil {
			c.log.Error("chat: prepare recovery", "stream", t.row.ID, "err", err)
			return c.finishTurn(ctx, t, OutcomeError, "recovery failed: "+err.Error())
		}
		c.rt.Diag().Publish(diag.ChannelChat, "recover-turn", c.b.Path().String(),
			map[string]any{"stream": t.row.ID, "policy": policy, "keptChunks": len(t.chunks)})
		if policy == RecoverAbandon {
			return c.finishTurn(ctx, t, OutcomeError, "the turn was interrupted by a restart")
		}
	}
	err := c.rt.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE chat_streams SET status = ?, attempts = attempts + 1 WHERE instance_id = ? AND id = ?`,
			statusStreaming, c.iid, t.row.ID)
		return err
	})
	if err != nil {
		return c.finishTurn(ctx, t, OutcomeError, "persist turn: "+err.Error())
	}

	if t.builder == nil {
		t.builder = message.NewBuilder(t.row.MessageID)
		if t.row.Continuation {
			if last := lastAssistant(transcript); last != nil {
				if err := t.builder.Continue(*last); err != nil {
					return c.finishTurn(ctx, t, OutcomeError, err.Error())
				}
				transcript = transcript[:len(transcript)-1]
			}
			t.send(message.Start(""))
		} else {
			start := message.Start(t.row.MessageID)
			_ = t.builder.Apply(start)
			t.send(start)
		}
	}
	tt := &Turn{t: t, ID: t.row.ID, MessageID: t.row.MessageID, Messages: transcript, Body: t.row.Body,
		Recovering: t.recovering, Continuation: t.row.Continuation}
	var herr error
	if h, ok := c.self.(Handler); ok {
		herr = safeCall(func() error { return h.OnChatMessage(t.ctx, tt) })
	} else {
		herr = tt.RunLoop(t.ctx, c.loopOptions())
	}
	switch {
	case t.ctx.Err() != nil:
		return c.finishTurn(ctx, t, OutcomeAborted, "")
	case herr != nil:
		msg := t.errText
		if msg == "" {
			msg = herr.Error()
		}
		return c.finishTurn(ctx, t, OutcomeError, msg)
	}
	if !t.finished {
		_ = t.write(message.Finish("stop"))
	}
	return c.finishTurn(ctx, t, OutcomeCompleted, "")
}

func safeCall(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("chat handler panicked: %v", p)
		}
	}()
	return fn()
}

// prepareRecovery decides how an interrupted turn resumes and rebuilds its
// stream: the chunks up to the last completed step are kept (and replayed
// into the builder), later ones are deleted; sequence numbers are never
// reused.
func (c *core) prepareRecovery(ctx context.Context, t *turn, transcript []message.Message) (Recovery, error) {
	var chunks []storedChunk
	err := c.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		chunks, err = loadChunks(ctx, tx, c.iid, t.row.ID)
		return err
	})
	if err != nil {
		return 0, err
	}
	for _, ch := range chunks {
		t.nextSeq = max(t.nextSeq, ch.Seq+1)
	}
	// Rebuild the partial message and find the last step boundary.
	b := message.NewBuilder(t.row.MessageID)
	if t.row.Continuation {
		if last := lastAssistant(transcript); last != nil {
			_ = b.Continue(*last)
		}
	}
	cut := -1 // index of the last finish-step chunk

	for i, sc := range chunks {
		var ch message.Chunk
		if err := json.Unmarshal([]byte(sc.Body), &ch); err != nil {
			break
		}
		if b.Apply(ch) != nil {
			break
		}
		if ch.Type == message.ChunkFinishStep {
			cut = i
		}
		if t.row.ToolsFrom >= 0 && sc.Seq >= t.row.ToolsFrom-1 {
			// The model's part of the step is complete and its tool calls
			// were executing: keep it all, and run only the calls that have
			// no result yet.
			cut = i
		}
	}

	policy := RecoverContinue
	if _, custom := c.self.(Handler); custom {
		policy = RecoverRetry
	}
	if p, ok := c.self.(RecoveryPolicy); ok {
		policy = p.RecoverTurn(ctx, b.Message())
	}
	if policy == RecoverAbandon {
		return policy, nil
	}
	if policy == RecoverRetry {
		cut = -1
	}
	keep := chunks[:cut+1]
	if err := c.rt.DB().Update(ctx, func(tx store.Tx) error {
		keepSeq := -1
		if len(keep) > 0 {
			keepSeq = keep[len(keep)-1].Seq
		}
		_, err := tx.Exec(ctx, `DELETE FROM chat_chunks WHERE instance_id = ? AND stream_id = ? AND seq > ?`, c.iid, t.row.ID, keepSeq)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE chat_streams SET next_seq = ? WHERE instance_id = ? AND id = ?`, t.nextSeq, c.iid, t.row.ID)
		return err
	}); err != nil {
		return 0, err
	}
	if len(keep) == 0 {
		return RecoverRetry, nil
	}
	// Continue from the boundary: replay the kept chunks into the builder.
	t.builder = message.NewBuilder(t.row.MessageID)
	if t.row.Continuation {
		if last := lastAssistant(transcript); last != nil {
			_ = t.builder.Continue(*last)
		}
	}
	for _, sc := range keep {
		var ch message.Chunk
		_ = json.Unmarshal([]byte(sc.Body), &ch)
		_ = t.builder.Apply(ch)
	}
	c.mu.Lock()
	t.chunks = append([]storedChunk(nil), keep...)
	t.started = true
	c.mu.Unlock()
	return RecoverContinue, nil
}

// finishTurn persists the turn's end and tells the clients, in the order
// the clients rely on: last chunk, persisted message, transcript to the
// other connections, then the terminal frame.
func (c *core) finishTurn(ctx context.Context, t *turn, outcome, errText string) TurnResult {
	res := TurnResult{ID: t.row.ID, Outcome: outcome, Error: errText}
	var msg message.Message
	hasMsg := false
	if t.builder != nil {
		t.builder.Finalize()
		msg = t.builder.Message()
		hasMsg = len(msg.Parts) > 0
		res.Message = msg
	}
	t.flush(ctx)

	// The transcript is read, changed and stored under acceptMu, like every
	// other writer of it (accept, AppendMessages, clear), so no concurrent
	// change is lost.
	c.acceptMu.Lock()
	defer c.acceptMu.Unlock()
	c.mu.Lock()
	gen := c.gen
	msgs := append([]message.Message(nil), c.msgs...)
	c.mu.Unlock()
	pos, reorder := -1, false
	if hasMsg {
		for i := range msgs {
			if msgs[i].ID == msg.ID { // a continuation's message
				msgs[i], pos = msg, i
			}
		}
		if pos < 0 {
			pos = len(msgs)
			if i := anchorIndex(msgs, t.row); i >= 0 && i < len(msgs)-1 {
				// Later turns' questions were queued meanwhile: the answer
				// goes right after its own question.
				pos, reorder = i+1, true
			}
			msgs = slices.Insert(msgs, pos, msg)
		}
	}
	now := c.rt.Clock().Now()
	cutoff := now.Add(-c.cfg.Retention).UnixMilli()
	gone := false // cleared meanwhile: persist nothing
	err := c.rt.DB().Update(ctx, func(tx store.Tx) error {
		ok, err := streamExists(ctx, tx, c.iid, t.row.ID)
		if err != nil || !ok {
			gone = !ok
			return err
		}
		if reorder {
			if err := replaceMessages(ctx, tx, c.iid, msgs); err != nil {
				return err
			}
		} else if hasMsg {
			if err := putMessage(ctx, tx, c.iid, pos, msg); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE chat_streams SET status = ?, outcome = ?, error = ?, finished_at = ? WHERE instance_id = ? AND id = ?`,
			statusDone, outcome, errText, now.UnixMilli(), c.iid, t.row.ID); err != nil {
			return err
		}
		// Retention: forget the chunks of streams that ended long ago.
		if _, err := tx.Exec(ctx, `DELETE FROM chat_chunks WHERE instance_id = ? AND stream_id IN (
			SELECT id FROM chat_streams WHERE instance_id = ? AND status = ? AND retain = 0 AND finished_at < ?)`, c.iid, c.iid, statusDone, cutoff); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM chat_streams WHERE instance_id = ? AND status = ? AND retain = 0 AND finished_at < ?`, c.iid, statusDone, cutoff)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			// Shutting down: the turn stays unfinished and recovers on start.
			return res
		}
		c.log.Error("chat: persist turn end", "stream", t.row.ID, "err", err)
	}
	c.mu.Lock()
	stale := c.gen != gen || gone
	if !stale {
		c.msgs = msgs
	}
	if c.active == t {
		// Ended: a probe from now on must not be offered this stream live.
		c.active = nil
	}
	for conn, id := range c.pending {
		if id == t.row.ID {
			delete(c.pending, conn)
		}
	}
	c.mu.Unlock()
	if stale {
		return res
	}
	exclude := t.origin
	if t.row.Continuation {
		exclude = nil
	}
	c.broadcastTranscript(exclude)
	if outcome == OutcomeError {
		c.b.BroadcastRaw(encode(responseFrame{Type: frameResponse, ID: t.row.ID, Body: errText, Error: true, Continuation: t.row.Continuation}))
	}
	c.b.BroadcastRaw(encode(responseFrame{Type: frameResponse, ID: t.row.ID, Done: true, Outcome: outcome,
		MessageIDs: t.row.MessageIDs, Continuation: t.row.Continuation}))
	c.rt.Diag().Publish(diag.ChannelChat, "turn", c.b.Path().String(), map[string]any{"stream": t.row.ID, "outcome": outcome})
	return res
}

// broadcastTranscript sends the transcript to every connection but exclude.
func (c *core) broadcastTranscript(exclude *agent.Conn) {
	c.mu.Lock()
	frame := encode(messagesFrame{Type: frameMessages, Messages: nonNil(c.msgs)})
	c.mu.Unlock()
	if exclude != nil {
		c.b.BroadcastRaw(frame, exclude)
	} else {
		c.b.BroadcastRaw(frame)
	}
}

func nonNil(m []message.Message) []message.Message {
	if m == nil {
		return []message.Message{}
	}
	return m
}

// markTools records that the current step's tool calls start executing at
// the next stream position (after making the step's chunks durable), or
// (start=false) that the step finished.
func (t *turn) markTools(ctx context.Context, start bool) error {
	c := t.c
	if start {
		t.flush(ctx)
	}
	c.mu.Lock()
	from := any(nil)
	if start {
		from = t.nextSeq
	}
	c.mu.Unlock()
	return c.rt.DB().Update(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE chat_streams SET tools_from = ? WHERE instance_id = ? AND id = ?`, from, c.iid, t.row.ID)
		return err
	})
}
