package chat

import (
	"context"
	"slices"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// finishTurn persists the turn's end and tells the clients, in the order
// the clients rely on: last chunk, persisted message, transcript to the
// other connections, then the terminal frame.
func (c *core) finishTurn(ctx context.Context, t *turn, outcome, errText string) TurnResult {
	defer func() { c.endTurnSpan(t, outcome, errText) }()
	res := TurnResult{ID: t.row.ID, Outcome: outcome, Error: errText}
	if t.sealed != nil {
		res.Exhausted = t.sealed.Reason
	}
	var msg message.Message
	hasMsg := false
	if t.builder != nil {
		t.builder.Finalize()
		msg = t.builder.Message()
		hasMsg = len(msg.Parts) > 0
		res.Message = msg
		if outcome == OutcomeCompleted {
			res.Waiting = waitingCalls(msg)
		}
	}
	res.Usage, res.TreeUsage = t.usageResult(msg)

	// The transcript is read, changed and stored under acceptMu, like every
	// other writer of it (accept, AppendMessages, clear), so no concurrent
	// change is lost.
	c.acceptMu.Lock()
	defer c.acceptMu.Unlock()
	c.mu.Lock()
	gen := c.gen
	msgs := append([]message.Message(nil), c.msgs...)
	end := t.end
	t.endTaken = true // AttachEnd attaches nothing from here on
	c.mu.Unlock()
	pos, reorder := -1, false
	if hasMsg {
		msgs, pos, reorder = placeMessage(msgs, msg, t.row)
	}
	now := c.rt.Clock().Now()
	cutoff := now.Add(-c.cfg.Retention).UnixMilli()
	sweep := c.sweep
	// The last chunks, the message and the turn's end are one
	// transaction: a turn is either unfinished in storage with a prefix of
	// its stream, or finished with all of it. A cleared stream gets
	// nothing (gone).
	// A long backlog goes in batches first; the last one rides with the
	// end.
	c.flushBacklog(ctx, t)
	// With no turn queued behind it, the end also drops the wake flag (the
	// statement is guarded: a turn accepted meanwhile keeps it).
	c.mu.Lock()
	idle, accepts := len(c.queue) == 0, c.accepts
	c.mu.Unlock()
	// The message's write is planned before the transaction: a reorder
	// compares the whole transcript with the stored one (storedTranscript).
	var plan transcriptPlan
	var planErr error
	if reorder {
		plan, planErr = c.stored.plan(ctx, c.b.DB(), c.iid, msgs)
	} else if hasMsg {
		plan, planErr = encodeMessages(pos, []message.Message{msg})
	}
	wrote := false
	var written transcriptPlan
	gone, err := t.commitGone(ctx, func(tx store.Tx) error {
		written = transcriptPlan{}
		if planErr != nil {
			return planErr
		}
		if err := plan.apply(ctx, tx, c.iid); err != nil {
			return err
		}
		written = plan
		if _, err := tx.Exec(ctx, `UPDATE chat_streams SET status = ?, outcome = ?, error = ?, finished_at = ? WHERE instance_id = ? AND id = ?`,
			statusDone, outcome, errText, now.UnixMilli(), c.iid, t.row.ID); err != nil {
			return err
		}
		if err := endIncident(ctx, tx, c.iid, t.row.ID); err != nil {
			return err
		}
		// Retention: forget the chunks of streams that ended long ago
		// (none can be stored while c.sweep is false).
		if sweep {
			if _, err := tx.Exec(ctx, `DELETE FROM chat_chunks WHERE instance_id = ? AND stream_id IN (
			SELECT id FROM chat_streams WHERE instance_id = ? AND status = ? AND retain = 0 AND finished_at < ?)`, c.iid, c.iid, statusDone, cutoff); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `DELETE FROM chat_streams WHERE instance_id = ? AND status = ? AND retain = 0 AND finished_at < ?`, c.iid, statusDone, cutoff); err != nil {
				return err
			}
		}
		if idle {
			if err := c.clearWake(ctx, tx); err != nil {
				return err
			}
		}
		if end != nil && end.Write != nil {
			c.mu.Lock()
			next := t.nextSeq
			c.mu.Unlock()
			wrote = true
			return end.Write(ctx, tx, res, next)
		}
		return nil
	})
	if err != nil || !gone {
		c.stored.wrote(written, err)
	}
	if end != nil && end.Committed != nil {
		end.Committed(wrote && err == nil && !gone)
	}
	if err != nil {
		if ctx.Err() != nil {
			// Shutting down: the turn stays unfinished and recovers on start.
			outcome = outcomeInterrupted
			return res
		}
		c.log.Error("chat: persist turn end", "stream", t.row.ID, "err", err)
	}
	stale, deferred, replaying := c.settleEnd(t, res, msgs, gen, accepts, idle, gone, err)
	if !stale || deferred {
		exclude := t.origin
		if t.row.Continuation || deferred {
			exclude = nil
		}
		c.broadcastTranscript(exclude)
	}
	// The turn leaves the runtime's count before its terminal frame: a
	// client that waits for its turn's end is not refused for its slot.
	t.slot.release()
	// Every turn ends with its terminal frame, also one that a clear
	// overtook: the clients' streams (and their status) end with it.
	if outcome == OutcomeError {
		c.b.BroadcastRaw(encodeResponse(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: t.row.ID, Body: errText, Error: true, Continuation: t.row.Continuation}), replaying...)
	}
	c.b.BroadcastRaw(encodeResponse(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: t.row.ID, Done: true, Outcome: outcome,
		MessageIDs: t.row.MessageIDs, Continuation: t.row.Continuation}), replaying...)
	c.rt.Diag().Publish(t.ctx, diag.ChannelChat, "turn", c.b.Path().String(), map[string]any{"stream": t.row.ID, "outcome": outcome})
	return res
}

// placeMessage puts the turn's message msg into the transcript msgs: in
// place of a continuation's message, else after the turn's own question,
// else at the end. reorder reports a message that does not go last.
func placeMessage(msgs []message.Message, msg message.Message, row streamRow) (_ []message.Message, pos int, reorder bool) {
	pos = -1
	for i := range msgs {
		if msgs[i].ID == msg.ID { // a continuation's message
			msgs[i], pos = msg, i
		}
	}
	if pos < 0 {
		pos = len(msgs)
		if i := anchorIndex(msgs, row); i >= 0 && i < len(msgs)-1 {
			// Later turns' questions were queued meanwhile: the answer
			// goes right after its own question.
			pos, reorder = i+1, true
		}
		msgs = slices.Insert(msgs, pos, msg)
	}
	return msgs, pos, reorder
}

// flushBacklog commits a turn's waiting chunks in batches until at most
// one batch waits (or a commit fails).
func (c *core) flushBacklog(ctx context.Context, t *turn) {
	for {
		c.mu.Lock()
		n := len(t.unflushed)
		c.mu.Unlock()
		if n <= c.cfg.FlushChunks {
			break
		}
		if err := t.commit(ctx, nil); err != nil {
			break
		}
	}
}

// settleEnd records in memory the end of a turn that was stored (err ==
// nil and not gone) or not: the wake flag, the last turn, the transcript
// (unless a clear made it stale), the active turn. It takes the
// connections that replay the stream instead of getting its end live, and
// reports whether a transcript broadcast was deferred to the turn's end.
func (c *core) settleEnd(t *turn, res TurnResult, msgs []message.Message, gen, accepts int, idle, gone bool, err error) (stale, deferred bool, replaying []*agent.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && !gone && idle {
		c.wakeCleared, c.wakeClearedAt = true, accepts
	}
	if err == nil && !gone && c.gen == gen && len(t.chunks) <= lastChunks {
		c.setLastLocked(t, res)
	}
	stale = c.gen != gen || gone
	if !stale {
		c.msgs = msgs
	}
	if c.active == t {
		// Ended: a probe from now on must not be offered this stream live.
		c.active = nil
	}
	// A connection offered this stream and not yet acknowledging it gets
	// no live end: its ack replays the stored stream, end included. Sent
	// now, the end would reach it before the replay and close its stream
	// empty.
	for conn, id := range c.pending {
		if id == t.row.ID {
			delete(c.pending, conn)
			replaying = append(replaying, conn)
		}
	}
	deferred = c.deferred
	if c.active == nil {
		c.deferred = false
	}
	return stale, deferred, replaying
}

// lastChunks bounds the stream of a turn kept as the last one ended, and
// lastKept the time it is kept after its end.
const (
	lastChunks = 256
	lastKept   = 10 * time.Second
)

// setLastLocked keeps t, ended with res, as the last turn (nil: none) and
// arms its forgetting; the previous one's timer is stopped. c.mu held.
func (c *core) setLastLocked(t *turn, res TurnResult) {
	if c.lastTimer != nil {
		c.lastTimer.Stop()
		c.lastTimer = nil
	}
	c.last, c.lastResult = t, res
	if t != nil {
		c.lastTimer = c.rt.Clock().AfterFunc(lastKept, func() { c.forgetLast(t) })
	}
}

// forgetLast drops t if it is still the last turn kept in memory.
func (c *core) forgetLast(t *turn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == t {
		c.last, c.lastResult, c.lastTimer = nil, TurnResult{}, nil
	}
}

// broadcastTranscript sends the transcript to every connection but
// exclude. While a turn runs, the transcript lacks the message it streams,
// so the broadcast waits for the turn's end (finishTurn sends it to every
// connection then): a client never sees a list in which a notice stands
// above the reply that is still streaming.
//
// With no connection to send it to (a child's chat, a user's only
// connection that sent the message), the transcript is not encoded: a
// connection that opens later gets it on connect (LayerConnect reads the
// transcript this call was made for, or a newer one).
func (c *core) broadcastTranscript(exclude *agent.Conn) {
	c.mu.Lock()
	if c.active != nil {
		c.deferred = true
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	if !c.listened(exclude) {
		return
	}
	c.mu.Lock()
	if c.active != nil {
		c.deferred = true
		c.mu.Unlock()
		return
	}
	frame := messagesFrame{Type: wire.ChatMessages, Messages: nonNil(c.msgs)}.encode()
	c.mu.Unlock()
	if exclude != nil {
		c.b.BroadcastRaw(frame, exclude)
	} else {
		c.b.BroadcastRaw(frame)
	}
}

// listened reports whether the instance has a connection other than
// exclude.
func (c *core) listened(exclude *agent.Conn) bool {
	for _, conn := range c.b.Connections() {
		if conn != exclude {
			return true
		}
	}
	return false
}

func nonNil(m []message.Message) []message.Message {
	if m == nil {
		return []message.Message{}
	}
	return m
}

// markTools records that the current step's tool calls start executing at
// the next stream position, or (start=false) that the step finished; the
// step's chunks are committed in the same transaction.
func (t *turn) markTools(ctx context.Context, start bool) error {
	c := t.c
	c.mu.Lock()
	from := any(nil)
	if start {
		from = t.nextSeq
	}
	c.mu.Unlock()
	return t.commit(ctx, func(tx store.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE chat_streams SET tools_from = ? WHERE instance_id = ? AND id = ?`, from, c.iid, t.row.ID)
		return err
	})
}

// clearWakeIfIdle drops the wake flag unless a turn is unfinished in
// storage. One guarded statement, so a turn accepted concurrently (which sets
// the flag in its own transaction) never loses it.
func (c *core) clearWakeIfIdle(ctx context.Context) {
	err := c.b.DB().Update(ctx, func(tx store.Tx) error { return c.clearWake(ctx, tx) })
	if err != nil && ctx.Err() == nil {
		c.log.Error("chat: clear wake flag", "err", err)
	}
}

// clearWake is clearWakeIfIdle's statement, for a transaction of its own
// or a turn's end.
func (c *core) clearWake(ctx context.Context, tx store.Tx) error {
	_, err := tx.Exec(ctx, `DELETE FROM instance_wake WHERE instance_id = ? AND reason = ?
		AND NOT EXISTS (SELECT 1 FROM chat_streams WHERE instance_id = ? AND status <> ?)`,
		c.iid, wakeReason, c.iid, statusDone)
	return err
}
