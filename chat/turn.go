package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/store"
)

// turn is one queued or running turn and its live stream.
type turn struct {
	c          *core
	gen        int // the transcript generation it belongs to (a clear ends it)
	row        streamRow
	origin     *agent.Conn
	recovering bool
	ctx        context.Context
	cancel     context.CancelCauseFunc
	end        *EndHook   // the submitter's writes at the end, if any (guarded by core.mu once queued)
	endTaken   bool       // finishTurn read end: AttachEnd is too late
	span       trace.Span // the turn's span, from acceptance to end
	began      time.Time  // when it was accepted (runtime clock)
	inQueue    bool       // counted in the queue-depth gauge (guarded by core.mu)
	slot       turnSlot   // its place in the runtime's count of turns in flight

	// Guarded by c.mu: the stream as clients see it. chunks are the
	// committed chunks (the output gate: only those reach clients);
	// unflushed wait for their commit.
	started    bool
	loaded     bool // chunks hold the stored stream (a recovering turn: once prepareRecovery read it)
	chunks     []storedChunk
	unflushed  []storedChunk
	nextSeq    int
	flushing   bool          // a flusher goroutine is running
	kick       chan struct{} // ends the flusher's batching window early
	lastCommit time.Time     // when the stream's last commit began (real time)
	// unmarked: the turn runs, and its status (streaming, one more
	// attempt) rides on its next commit. Guarded by commitMu.
	unmarked bool

	// Recovery work meter (recovery.go), guarded by c.mu.
	quiet           bool      // recovery writes: not work
	deltaCredited   time.Time // last delta credited (runtime clock)
	forwardCredited time.Time // last CreditProgress credited
	sealed          *RecoveryExhausted

	commitMu sync.Mutex // serializes commits of the stream, and so the order clients see
	writeMu  sync.Mutex // serializes writes (tools run in parallel)

	// Owned by the turn's goroutine.
	builder  *message.Builder
	hidden   int  // leading parts a retried turn's model does not see
	kept     int  // stored chunks a recovery found (and kept)
	finished bool // a finish chunk was written
	stepOpen bool // a step is started and not finished (guarded by writeMu)
	errText  string

	usage turnUsage // token accounting (usage.go)
}

// newTurn returns a turn of row. c.mu held.
func (c *core) newTurn(row streamRow, origin *agent.Conn) *turn {
	ctx, cancel := context.WithCancelCause(agent.WithAgent(c.rt.Context(), c.self))
	t := &turn{c: c, row: row, origin: origin, cancel: cancel, nextSeq: row.NextSeq, kick: make(chan struct{}, 1), gen: c.gen}
	t.ctx = context.WithValue(c.startTurnSpan(ctx, t), turnKey{}, t)
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
			c.dequeued(t)
			t.slot.release()
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
	id := newPartID()
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
		ch = t.finishMetadata(ch)
	}
	if err := t.builder.Apply(ch); err != nil {
		return fmt.Errorf("chat: invalid chunk stream: %w", err)
	}
	switch ch.Type {
	case message.ChunkStartStep:
		t.stepOpen = true
	case message.ChunkFinishStep:
		t.stepOpen = false
	}
	t.send(ch)
	return nil
}

// writeLive sends a transient chunk to the connected clients, in stream
// order, without storing it, numbering it or applying it to the message
// (ToolStream.Transient).
func (t *turn) writeLive(ch message.Chunk) error {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if err := t.ctx.Err(); err != nil {
		return context.Cause(t.ctx)
	}
	t.sendChunk(ch, true)
	return nil
}

// send numbers a chunk and queues it for its commit; the flusher sends it
// to the clients once it is committed (the output gate).
func (t *turn) send(ch message.Chunk) { t.sendChunk(ch, false) }

// sendChunk queues a chunk for the flusher; a live chunk goes out in order
// with the committed ones but is not stored and has no sequence number.
func (t *turn) sendChunk(ch message.Chunk, live bool) {
	c := t.c
	body, err := ch.MarshalJSON() // what json.Marshal writes, without its second pass
	if err != nil {
		c.log.Error("chat: encode chunk", "err", err)
		return
	}
	c.mu.Lock()
	sc := storedChunk{Seq: -1, Body: string(body), Live: true}
	if !live {
		sc = storedChunk{Seq: t.nextSeq, Body: string(body), Work: t.credit(ch.Type)}
		t.nextSeq++
	}
	t.unflushed = append(t.unflushed, sc)
	full := len(t.unflushed) >= c.cfg.FlushChunks
	start := !t.flushing
	t.flushing = true
	c.mu.Unlock()
	if start {
		c.rt.Go(func(ctx context.Context) { t.flushLoop(ctx) })
	} else if full {
		select {
		case t.kick <- struct{}{}:
		default:
		}
	}
}

// flushLoop commits the waiting chunks, batch after batch, until none wait.
// A batch goes at once when the stream's last commit is at least one
// batching window old (the first chunk of a quiet stream), else when the
// window since that commit ends or FlushChunks chunks wait: a stream
// writes at most one transaction per window, however fast or slowly its
// chunks come.
func (t *turn) flushLoop(ctx context.Context) {
	c := t.c
	for {
		c.mu.Lock()
		n := len(t.unflushed)
		last := t.lastCommit
		if n == 0 {
			t.flushing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		// A latency window, not a durable deadline: real time.
		if wait := time.Until(last.Add(c.cfg.FlushInterval)); wait > 0 && n < c.cfg.FlushChunks {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-t.kick:
			case <-ctx.Done():
			}
			timer.Stop()
		}
		if err := t.commit(ctx, nil); err != nil {
			t.failStorage(err)
			if ctx.Err() != nil {
				c.mu.Lock()
				t.flushing = false
				c.mu.Unlock()
				return
			}
		}
	}
}

// failStorage ends a turn whose chunks could not be committed: they never
// reached a client, and the turn cannot go on without them.
func (t *turn) failStorage(err error) {
	if t.c.rt.Context().Err() != nil {
		return // shutting down: the turn recovers from what was committed
	}
	t.c.log.Error("chat: persist chunks", "stream", t.row.ID, "err", err)
	t.cancel(fmt.Errorf("chat: persist chunks: %w", err))
}

// commit writes the waiting chunks (at most FlushChunks of them, unless
// extra is given) together with extra's writes in one transaction, then
// sends them to the clients and followers. A stream deleted by a clear
// gets nothing written and sends nothing; commit reports that with
// gone.
func (t *turn) commit(ctx context.Context, extra func(tx store.Tx) error) error {
	_, err := t.commitGone(ctx, extra)
	return err
}

func (t *turn) commitGone(ctx context.Context, extra func(tx store.Tx) error) (gone bool, err error) {
	c := t.c
	t.commitMu.Lock()
	defer t.commitMu.Unlock()
	c.mu.Lock()
	batch := t.unflushed
	if extra == nil && len(batch) > c.cfg.FlushChunks {
		batch = batch[:c.cfg.FlushChunks:c.cfg.FlushChunks]
	}
	t.unflushed = t.unflushed[len(batch):]
	c.mu.Unlock()
	if len(batch) == 0 && extra == nil {
		return false, nil
	}
	c.mu.Lock()
	t.lastCommit = time.Now()
	c.mu.Unlock()
	err = c.b.DB().Update(ctx, func(tx store.Tx) error {
		ok, err := insertChunks(ctx, tx, c.iid, t.row.ID, persisted(batch))
		if err != nil || !ok {
			gone = !ok
			return err
		}
		if t.unmarked {
			if err := markStreaming(ctx, tx, c.iid, t.row.ID); err != nil {
				return err
			}
		}
		if extra != nil {
			return extra(tx)
		}
		return nil
	})
	if err != nil || gone {
		return gone, err
	}
	t.unmarked = false
	t.publish(batch)
	return false, nil
}

// markStreaming records that a turn runs (once more).
func markStreaming(ctx context.Context, tx store.Tx, iid int64, id string) error {
	_, err := tx.Exec(ctx, `UPDATE chat_streams SET status = ?, attempts = attempts + 1 WHERE instance_id = ? AND id = ?`,
		statusStreaming, iid, id)
	return err
}

// publish sends committed chunks to the connections that are not waiting
// for a resume and to the stream's followers, in order.
func (t *turn) publish(batch []storedChunk) {
	if len(batch) == 0 {
		return
	}
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != t.gen {
		// Cleared after this batch committed: the clients were told to
		// forget the transcript; nothing of it is sent after that.
		return
	}
	for _, sc := range batch {
		if !sc.Live {
			t.chunks = append(t.chunks, sc)
		}
	}
	var targets []*agent.Conn
	for conn := range c.admitted {
		if _, waiting := c.pending[conn]; waiting {
			continue
		}
		if !t.started && c.awaiting[conn] {
			// Offered the stream below (startedLocked): its replay has
			// this batch; sent live too, it would get it twice.
			continue
		}
		targets = append(targets, conn)
	}
	for _, sc := range batch {
		if sc.Live {
			frame := encode(responseFrame{Type: frameResponse, ID: t.row.ID, Body: sc.Body, Continuation: t.row.Continuation})
			for _, conn := range targets {
				conn.SendRaw(frame)
			}
			continue
		}
		seq := sc.Seq
		frame := encode(responseFrame{Type: frameResponse, ID: t.row.ID, Body: sc.Body, Seq: &seq, Continuation: t.row.Continuation})
		for _, conn := range targets {
			conn.SendRaw(frame)
		}
		for f := range c.follow[t.row.ID] {
			f.fn(seq, sc.Body)
		}
	}
	t.startedLocked()
}

// startedLocked records that the turn's stream has begun for clients: the
// connections that probed before (told "pending") get their offer now. c.mu
// held.
func (t *turn) startedLocked() {
	if t.started {
		return
	}
	c := t.c
	t.started = true
	offer := encode(probeFrame{Type: frameResuming, ID: t.row.ID})
	for conn := range c.awaiting {
		c.pending[conn] = t.row.ID
		conn.SendRaw(offer)
	}
	clear(c.awaiting)
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
		var collect bool
		policy, collect, err = c.prepareRecovery(ctx, t, transcript)
		if err != nil {
			c.log.Error("chat: prepare recovery", "stream", t.row.ID, "err", err)
			return c.finishTurn(ctx, t, OutcomeError, "recovery failed: "+c.turnError(t, err))
		}
		c.rt.Diag().Publish(t.ctx, diag.ChannelChat, "recover-turn", c.b.Path().String(),
			map[string]any{"stream": t.row.ID, "policy": policy, "keptChunks": t.kept, "collected": collect})
		if collect {
			// Its stream had ended before the crash: finished work is
			// recorded, never redone.
			return c.finishTurn(ctx, t, OutcomeCompleted, "")
		}
		if policy == RecoverAbandon {
			return c.finishTurn(ctx, t, OutcomeError, "the turn was interrupted by a restart")
		}
		if t.sealed != nil {
			return c.sealTurn(ctx, t, transcript)
		}
	}
	// The turn's status (streaming) is written with its first commit,
	// which for a new turn is its start chunk, committed at once (a quiet
	// stream). Until then nothing of the turn was stored or sent, and a
	// crash leaves it queued. Agent code of its own (a Handler, a recovered
	// turn) starts only after that commit, so that it never runs again
	// unmarked as a fresh queued turn after a crash.
	t.commitMu.Lock()
	t.unmarked = true
	t.commitMu.Unlock()
	_, custom := c.self.(Handler)

	if t.builder == nil {
		var err error
		if transcript, err = c.startMessage(t, transcript); err != nil {
			return c.finishTurn(ctx, t, OutcomeError, c.turnError(t, err))
		}
	}
	if custom || t.recovering {
		// A commit with writes of its own (none here) runs even with no
		// chunk waiting, and marks the turn.
		if err := t.commit(ctx, func(store.Tx) error { return nil }); err != nil {
			return c.finishTurn(ctx, t, OutcomeError, "persist turn: "+err.Error())
		}
	}
	t.seedUsage()
	tt := &Turn{t: t, ID: t.row.ID, MessageID: t.row.MessageID, Messages: transcript, Body: t.row.Body,
		Recovering: t.recovering, Continuation: t.row.Continuation}
	var herr error
	if h, ok := c.self.(Handler); ok {
		// The handler is one input of the instance; RunLoop inside it lets
		// other inputs in while the model streams.
		herr = agent.Enter(t.ctx, c.self, func(ctx context.Context) error {
			return safeCall(func() error { return h.OnChatMessage(ctx, tt) })
		})
	} else {
		var o LoopOptions
		herr = agent.Enter(t.ctx, c.self, func(context.Context) error {
			o = c.loopOptions()
			return nil
		})
		if herr == nil {
			herr = tt.RunLoop(t.ctx, o)
		}
	}
	switch {
	case t.ctx.Err() != nil:
		return c.finishTurn(ctx, t, OutcomeAborted, "")
	case herr != nil:
		msg := t.errText
		if msg == "" {
			msg = c.turnError(t, herr)
		}
		return c.finishTurn(ctx, t, OutcomeError, msg)
	}
	if !t.finished {
		_ = t.write(message.Finish("stop"))
	}
	if app := c.appMetadata(t, MetadataFinish); app != nil {
		_ = t.write(message.MessageMetadata(app))
	}
	return c.finishTurn(ctx, t, OutcomeCompleted, "")
}

// turnError is the text a failed turn reports (to clients, to an agent-tool
// parent, in storage) for err: its public message, or an internal error id
// with err logged (agent.Runtime.ClientMessage).
func (c *core) turnError(t *turn, err error) string {
	return c.rt.ClientMessage(err, "agent", c.b.Path().String(), "stream", t.row.ID)
}

// startMessage starts the turn's message (continuing the last assistant
// message of a continuation) and returns the transcript the turn answers.
func (c *core) startMessage(t *turn, transcript []message.Message) ([]message.Message, error) {
	t.builder = message.NewBuilder(t.row.MessageID)
	if t.row.Continuation {
		if last := lastAssistant(transcript); last != nil {
			if err := t.builder.Continue(*last); err != nil {
				return transcript, err
			}
			transcript = transcript[:len(transcript)-1]
		}
		t.send(message.Start(""))
	} else {
		start := message.Start(t.row.MessageID)
		start.MessageMetadata = c.startMetadata(t)
		_ = t.builder.Apply(start)
		t.send(start)
	}
	return transcript, nil
}

func safeCall(fn func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("chat handler panicked: %v", p)
		}
	}()
	return fn()
}

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
	finished, stepOpen := false, false
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
	c.mu.Lock()
	t.chunks = chunks
	t.loaded = true
	t.kept = len(chunks)
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
	c.mu.Unlock()
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
	// The last chunks, the message and the turn's end are one
	// transaction: a turn is either unfinished in storage with a prefix of
	// its stream, or finished with all of it. A cleared stream gets
	// nothing (gone).
	// A long backlog goes in batches first; the last one rides with the
	// end.
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
	// With no turn queued behind it, the end also drops the wake flag (the
	// statement is guarded: a turn accepted meanwhile keeps it).
	c.mu.Lock()
	idle, accepts := len(c.queue) == 0, c.accepts
	c.mu.Unlock()
	wrote := false
	gone, err := t.commitGone(ctx, func(tx store.Tx) error {
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
		if err := endIncident(ctx, tx, c.iid, t.row.ID); err != nil {
			return err
		}
		// Retention: forget the chunks of streams that ended long ago.
		if _, err := tx.Exec(ctx, `DELETE FROM chat_chunks WHERE instance_id = ? AND stream_id IN (
			SELECT id FROM chat_streams WHERE instance_id = ? AND status = ? AND retain = 0 AND finished_at < ?)`, c.iid, c.iid, statusDone, cutoff); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM chat_streams WHERE instance_id = ? AND status = ? AND retain = 0 AND finished_at < ?`, c.iid, statusDone, cutoff); err != nil {
			return err
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
	c.mu.Lock()
	if err == nil && !gone && idle {
		c.wakeCleared, c.wakeClearedAt = true, accepts
	}
	if err == nil && !gone && c.gen == gen && len(t.chunks) <= lastChunks {
		c.last, c.lastResult = t, res
	}
	stale := c.gen != gen || gone
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
	var replaying []*agent.Conn
	for conn, id := range c.pending {
		if id == t.row.ID {
			delete(c.pending, conn)
			replaying = append(replaying, conn)
		}
	}
	deferred := c.deferred
	if c.active == nil {
		c.deferred = false
	}
	c.mu.Unlock()
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
		c.b.BroadcastRaw(encode(responseFrame{Type: frameResponse, ID: t.row.ID, Body: errText, Error: true, Continuation: t.row.Continuation}), replaying...)
	}
	c.b.BroadcastRaw(encode(responseFrame{Type: frameResponse, ID: t.row.ID, Done: true, Outcome: outcome,
		MessageIDs: t.row.MessageIDs, Continuation: t.row.Continuation}), replaying...)
	c.rt.Diag().Publish(t.ctx, diag.ChannelChat, "turn", c.b.Path().String(), map[string]any{"stream": t.row.ID, "outcome": outcome})
	return res
}

// lastChunks bounds the stream of a turn kept as the last one ended.
const lastChunks = 256

// broadcastTranscript sends the transcript to every connection but
// exclude. While a turn runs, the transcript lacks the message it streams,
// so the broadcast waits for the turn's end (finishTurn sends it to every
// connection then): a client never sees a list in which a notice stands
// above the reply that is still streaming.
func (c *core) broadcastTranscript(exclude *agent.Conn) {
	c.mu.Lock()
	if c.active != nil {
		c.deferred = true
		c.mu.Unlock()
		return
	}
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
