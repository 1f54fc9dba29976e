package chat

import (
	"context"
	"encoding/json"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/store"
	"github.com/agentry/agentry/wire"
)

// prepareRecovery decides how an interrupted turn resumes. Every stored
// chunk was committed, so any of them may have reached a client: all are
// kept (the output gate never takes back what it let out) and replayed into
// the builder, and the stream goes on after them with new sequence
// numbers. What the interruption left open (a text part, a tool call whose
// input was streaming, a step) is closed with chunks of the stream itself,
// so every client sees it end. collect reports a stream that had finished
// (its finish chunk is stored): the turn is only recorded as ended, never
// run again.
func (c *core) prepareRecovery(ctx context.Context, t *turn, transcript []message.Message) (policy Recovery, collect bool, err error) {
	var chunks []storedChunk
	var incident incidentState
	err = c.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		if chunks, err = loadChunks(ctx, tx, c.iid, t.row.ID); err != nil {
			return err
		}
		incident, err = c.loadIncidentState(ctx, tx, t.row.ID)
		return err
	})
	if err != nil {
		return 0, false, err
	}
	b := message.NewBuilder(t.row.MessageID)
	if t.row.Continuation {
		if last := lastAssistant(transcript); last != nil {
			_ = b.Continue(*last)
		}
	}
	finished, stepOpen := replayStored(t, b, chunks)
	c.keepStored(t, chunks)
	if len(chunks) > 0 {
		t.builder = b
	}
	if finished {
		t.finished = true
		return RecoverContinue, true, nil
	}
	kind := RecoveryKindRetry
	if len(b.Message().Parts) > 0 {
		kind = RecoveryKindContinue
	}
	if t.sealed, err = c.beginIncident(ctx, t, kind, incident); err != nil {
		return 0, false, err
	}
	// What recovery writes from here on (closing what the crash cut) is
	// not work; the turn's own writes are again once it runs.
	c.mu.Lock()
	t.quiet = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		t.quiet = t.sealed != nil
		c.mu.Unlock()
	}()

	policy = RecoverContinue
	_, custom := c.self.(Handler)
	if custom {
		policy = RecoverRetry
	}
	if p, ok := c.self.(RecoveryPolicy); ok && t.sealed == nil {
		partial := b.Message()
		_ = agent.Enter(ctx, c.self, func(ctx context.Context) error {
			policy = p.RecoverTurn(ctx, partial)
			return nil
		})
	}
	if policy == RecoverAbandon || len(chunks) == 0 {
		return policy, false, nil
	}
	text, reasoning, tools := b.OpenParts()
	pending := pendingCallsOf(b.Message())
	// A step cut while the model streamed it (its text, or the input of a
	// tool call, with no call of it complete) goes on where its text stops
	// when the model can continue an answer: the cut text stays part of
	// the answer and the model is shown it; a cut call is left out, and the
	// model calls again.
	continues := !custom && policy == RecoverContinue && t.sealed == nil && stepOpen &&
		len(pending) == 0 && !stepHasCalls(b.Message()) && c.modelContinues(ctx)
	cut := message.InterruptedMetadata
	if continues {
		cut = message.ContinuedMetadata
	}
	closing := closeOpenParts(text, reasoning, tools, cut)
	if stepOpen {
		switch {
		case continues:
			// The cut step ends as it stands, marked; the model's next
			// step goes on from its text.
			closing = append(closing, message.Data(message.ContinuedStepName, "", json.RawMessage(`{"reason":"restart"}`), false),
				message.FinishStep())
		case !custom && policy != RecoverRetry && t.sealed == nil && len(pending) > 0:
			// The loop runs the step's calls that have no result and
			// closes the step (at least once: a call may have been
			// running).
		case !custom && policy != RecoverRetry && len(tools) == 0 && stepHasTools(b.Message()):
			// The model's part of the step and every call ended; only
			// the step's end was lost.
			closing = append(closing, message.FinishStep())
		default:
			// The step does not go on: its calls that never ran get an
			// error result, and it is marked so that the model (and the
			// message's text) leave it out; it runs again after it.
			for _, id := range pending {
				closing = append(closing, message.ToolOutputError(id, errInterrupted))
			}
			closing = append(closing, message.Data(message.InterruptedStepName, "", json.RawMessage(`{"reason":"restart"}`), false),
				message.FinishStep())
		}
	}
	t.writeMu.Lock()
	t.stepOpen = stepOpen
	t.writeMu.Unlock()
	for _, ch := range closing {
		if err := t.write(ch); err != nil {
			return 0, false, err
		}
	}
	if policy == RecoverRetry {
		// The turn runs again from its beginning: what it wrote before
		// stays for the clients, hidden from the model and from the step
		// count.
		t.hidden = len(t.builder.Message().Parts)
	}
	return policy, false, nil
}

// replayStored applies a turn's stored chunks to b (a chunk that does not
// apply is skipped, as clients skip it) and moves the turn's next sequence
// past them. It reports whether the stream finished and whether a step
// was open at its end.
func replayStored(t *turn, b *message.Builder, chunks []storedChunk) (finished, stepOpen bool) {
	for _, sc := range chunks {
		t.nextSeq = max(t.nextSeq, sc.Seq+1)
		var ch message.Chunk
		if json.Unmarshal([]byte(sc.Body), &ch) != nil || b.Apply(ch) != nil {
			continue // clients skip it the same way
		}
		switch ch.Type {
		case message.ChunkFinish:
			finished = true
		case message.ChunkStartStep:
			stepOpen = true
		case message.ChunkFinishStep:
			stepOpen = false
		}
	}
	return finished, stepOpen
}

// keepStored makes a recovering turn's stored chunks its stream, offers
// them to the connections that probed and sends them to its followers.
func (c *core) keepStored(t *turn, chunks []storedChunk) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t.chunks = chunks
	t.loaded = true
	t.kept = len(chunks)
	// A connection that acknowledged the turn before (it was queued) gets
	// the kept stream replayed, and what follows live; it needs no offer.
	for conn := range t.acked {
		delete(c.awaiting, conn)
		if !c.admitted[conn] || len(chunks) == 0 {
			continue
		}
		for _, sc := range chunks {
			seq := sc.Seq
			conn.SendRaw(encodeResponse(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: t.row.ID, Body: sc.Body, Seq: &seq,
				Replay: true, Continuation: t.row.Continuation}))
		}
		conn.SendRaw(encodeResponse(wire.ChatResponseFrame{Type: wire.ChatResponse, ID: t.row.ID, Replay: true,
			ReplayComplete: true, Continuation: t.row.Continuation}))
	}
	t.acked = nil
	if len(chunks) > 0 {
		// A connection that probed while the turn was recovering gets its
		// offer of the kept stream.
		t.startedLocked()
	}
	// A follower that joined while the turn was active but not yet
	// recovered has nothing yet: it gets the stored stream now (each
	// follower skips what it already has).
	for f := range c.follow[t.row.ID] {
		for _, sc := range chunks {
			f.fn(sc.Seq, sc.Body)
		}
	}
}

// closeOpenParts returns the chunks that close what an interruption left
// open: text and reasoning parts end marked cut, a tool call whose input
// was streaming ends with an input error.
func closeOpenParts(text, reasoning []message.OpenPart, tools []message.OpenToolCall, cut json.RawMessage) []message.Chunk {
	var closing []message.Chunk
	for _, p := range text {
		ch := message.TextEnd(p.ID)
		ch.ProviderMetadata = cut
		closing = append(closing, ch)
	}
	for _, p := range reasoning {
		ch := message.ReasoningEnd(p.ID)
		ch.ProviderMetadata = cut
		closing = append(closing, ch)
	}
	for _, tc := range tools {
		ch := message.ToolInputError(tc.ID, tc.Name, json.RawMessage(`{}`), errInterrupted)
		ch.ProviderMetadata = message.InterruptedMetadata
		closing = append(closing, ch)
	}
	return closing
}

// modelContinues reports whether the declarative turn's model goes on
// with a cut answer (model.Continuer).
func (c *core) modelContinues(ctx context.Context) bool {
	var o LoopOptions
	_ = agent.Enter(ctx, c.self, func(context.Context) error {
		o = c.loopOptions()
		return nil
	})
	m, ok := o.Model.(model.Continuer)
	return ok && m.ContinuesAnswers()
}

// stepHasCalls reports whether the message's last step has a tool call
// whose input is complete.
func stepHasCalls(m message.Message) bool {
	for i := len(m.Parts) - 1; i >= 0 && m.Parts[i].Type != message.PartStepStart; i-- {
		if m.Parts[i].IsTool() && m.Parts[i].State != message.StateInputStreaming {
			return true
		}
	}
	return false
}

// stepHasTools reports whether the message's last step has a tool call.
func stepHasTools(m message.Message) bool {
	for i := len(m.Parts) - 1; i >= 0 && m.Parts[i].Type != message.PartStepStart; i-- {
		if m.Parts[i].IsTool() {
			return true
		}
	}
	return false
}

// errInterrupted is the error text of what a restart cut off.
const errInterrupted = "interrupted by a restart"

// pendingCallsOf returns the ids of the tool calls of the message's last
// step that have their input but no result.
func pendingCallsOf(m message.Message) []string {
	last := -1
	for i, p := range m.Parts {
		if p.Type == message.PartStepStart {
			last = i
		}
	}
	var ids []string
	for _, p := range m.Parts[last+1:] {
		if p.IsTool() && awaitsResult(p) {
			ids = append(ids, p.ToolCallID)
		}
	}
	return ids
}
