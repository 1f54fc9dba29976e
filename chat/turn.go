package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
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
	loaded     bool                 // chunks hold the stored stream (a recovering turn: once prepareRecovery read it)
	acked      map[*agent.Conn]bool // acknowledged a recovering turn's stream before it was read: keepStored replays it to them
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
	encMu    sync.Mutex // guards enc
	enc      []byte     // the buffer sendChunk encodes a chunk in

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
