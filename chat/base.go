package chat

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/diag"
	"github.com/agentry/agentry/ids"
	"github.com/agentry/agentry/store"
)

// Base is embedded by chat agents. It embeds agent.Base, so a chat agent is
// a full agent (state, schedules, sub-agents, RPC) with a transcript.
type Base struct {
	agent.Base
	c *core
}

var (
	_ agent.Layer             = (*Base)(nil)
	_ agent.LayerConnector    = (*Base)(nil)
	_ agent.LayerFrameHandler = (*Base)(nil)
	_ agent.LayerHTTPHandler  = (*Base)(nil)
	_ agent.LayerCloser       = (*Base)(nil)
	_ agent.LayerStarted      = (*Base)(nil)
)

// ChatBase returns b itself. It is the layer's accessor (agent.Layer): the
// runtime reaches the chat layer of an agent through it, whichever fields
// it is embedded through.
func (b *Base) ChatBase() *Base { return b }

// wakeReason is the KeepAwake reason of an instance with unfinished turns.
const wakeReason = "chat"

// core is the chat machinery of one instance.
type core struct {
	b    *Base
	self agent.Agent
	rt   *agent.Runtime
	iid  int64
	cfg  Config
	log  interface {
		Error(string, ...any)
		Warn(string, ...any)
	}

	acceptMu sync.Mutex       // serializes every change to the transcript (and so keeps turns in order)
	stored   storedTranscript // the stored transcript's rows; guarded by acceptMu

	mu      sync.Mutex
	msgs    []message.Message
	queue   []*turn
	active  *turn
	current *turn // the worker's turn: active, then ending until its waiters are told
	// last is the most recent turn whose end committed, with its result,
	// if its stream is short (lastChunks): a waiter or follower that
	// comes just after the end reads nothing. A clear forgets it, and so
	// does the time lastKept after its end (forgetLast): an instance kept
	// resident does not keep its last turn's stream and message in memory
	// for later readers, who read them from the store.
	last       *turn
	lastResult TurnResult
	lastTimer  clockwork.Timer // forgets last; stopped when last changes
	working    bool
	gen        int                    // bumped by clear; stale turns do not persist
	deferred   bool                   // a transcript broadcast waits for the active turn's end
	admitted   map[*agent.Conn]bool   // connections the layer has greeted
	pending    map[*agent.Conn]string // offered a stream, not yet acknowledged
	awaiting   map[*agent.Conn]bool   // told "pending"; offered the next stream when it starts
	probed     map[*agent.Conn]bool   // have sent a resume probe: their chat listens
	waiters    map[string][]chan TurnResult
	follow     map[string]map[*follower]struct{} // stream id → live followers
	ending     map[string]bool                   // canceled queued turns whose end is being recorded
	next       map[string][]chan string          // NextTurn waiters by the stream they wait after
	release    func()                            // KeepAlive of the worker

	// accepts counts accepted turns. A turn's end that cleared the wake
	// flag in its own transaction records the count it saw (wakeClearedAt,
	// wakeCleared): while no turn was accepted since, the worker going idle
	// need not clear the flag again.
	accepts       int
	wakeClearedAt int
	wakeCleared   bool

	// Guarded by acceptMu: a submission key (keyed), a stream that is not
	// retained (sweep) may be stored. True from the start on an instance
	// this hydration did not create; else from the first such acceptance.
	// While false, accept reads no key and a turn's end sweeps nothing.
	keyed, sweep bool
}

// Migrate applies the chat layer's schema to rt's database, once per
// runtime (a chat instance's hydration does it too). Layers that read the
// chat tables of instances that may not have hydrated yet, as agent tools
// read their children's streams, call it first.
func Migrate(ctx context.Context, rt *agent.Runtime) error {
	return rt.Migrate(ctx, "chat", migrations)
}

// StartLayer loads the transcript and resumes unfinished turns. The runtime
// calls it on hydration.
func (b *Base) StartLayer(ctx context.Context, self agent.Agent) error {
	rt := b.Runtime()
	if err := Migrate(ctx, rt); err != nil {
		return err
	}
	c := &core{
		b: b, self: self, rt: rt, iid: b.InstanceID(), cfg: configOf(rt), log: b.Logger(),
		pending: map[*agent.Conn]string{}, awaiting: map[*agent.Conn]bool{}, admitted: map[*agent.Conn]bool{},
		probed:  map[*agent.Conn]bool{},
		waiters: map[string][]chan TurnResult{},
		follow:  map[string]map[*follower]struct{}{},
		ending:  map[string]bool{},
		next:    map[string][]chan string{},
		keyed:   !b.Created(),
		sweep:   !b.Created(),
		stored:  newStoredTranscript(b.Created()),
	}
	b.c = c
	if b.Created() {
		return nil // a new instance: no transcript, no turns
	}
	var unfinished []streamRow
	err := rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		if c.msgs, err = loadMessages(ctx, tx, c.iid); err != nil {
			return err
		}
		unfinished, err = unfinishedStreams(ctx, tx, c.iid)
		return err
	})
	if err != nil {
		return fmt.Errorf("chat: load: %w", err)
	}
	if len(unfinished) == 0 {
		return nil
	}
	c.mu.Lock()
	for _, row := range unfinished {
		t := c.newTurn(row, nil)
		t.recovering = row.Status == statusStreaming
		t.slot.take(turnSlotsOf(rt))
		c.queue = append(c.queue, t)
	}
	// The worker starts in LayerStarted, once every layer of the agent is
	// ready: a recovered turn may run tools that use them.
	c.mu.Unlock()
	rt.Diag().Publish(ctx, diag.ChannelChat, "recover", b.Path().String(), map[string]any{"turns": len(unfinished)})
	return nil
}

// LayerStarted starts the turns recovered by StartLayer.
func (b *Base) LayerStarted(ctx context.Context) {
	c := b.c
	c.mu.Lock()
	c.startWorkerLocked()
	c.mu.Unlock()
}

// Messages returns a copy of the transcript.
func (b *Base) Messages() []message.Message {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]message.Message, len(c.msgs))
	for i, m := range c.msgs {
		out[i] = m.Clone()
	}
	return out
}

// SubmitOptions qualify SubmitMessages.
type SubmitOptions struct {
	// IdempotencyKey makes the submission run at most once: submitting
	// the same key again, also after a restart, returns the first
	// submission's turn id and starts nothing.
	IdempotencyKey string
	// Body is passed to the turn as extra request fields.
	Body json.RawMessage
	// ID names the turn (its stream id); empty means a new id.
	ID string
	// Retain keeps the turn's stream chunks for as long as the instance
	// lives instead of the retention window (agent-tool runs use it, since
	// their parent replays them).
	Retain bool
	// Tx, when set, adds the caller's writes to the transaction that
	// accepts the turn, so that they commit with it or not at all. It gets
	// the turn's id (with an IdempotencyKey seen before, the earlier
	// submission's id: Tx runs then too, and End is not attached). An error
	// aborts the submission: nothing of it is stored or queued, and
	// SubmitMessages returns the error. Tx must use only tx.
	Tx func(ctx context.Context, tx store.Tx, id string) error
	// End, when set, adds the caller's writes to the transaction that
	// records the turn's end (see EndHook).
	End *EndHook
}

// EndHook adds an owner's writes to the transaction that records a turn's
// end (its last chunks, its message and its end), so that a layer above
// the chat records its own end of the work in the same commit.
type EndHook struct {
	// Write runs inside that transaction, after the chat's own writes. res
	// is the turn's result; next is the stream's next sequence (one past
	// its last chunk). Write must use only tx: no other transaction, no
	// call into the chat, no agent code. An error fails the transaction,
	// like a storage failure. Write does not run for a stream that a clear
	// deleted.
	Write func(ctx context.Context, tx store.Tx, res TurnResult, next int) error
	// Committed, if set, runs after the transaction and before the turn's
	// waiters learn its end, with whether Write's writes were committed.
	Committed func(ok bool)
}

// AttachEnd attaches end to the unfinished turn id if it has no end hook,
// as a turn that resumed after a restart has none (hooks are not stored):
// its end then records the owner's end of the work in the same commit. It
// reports whether it attached end; it does not once the turn's end is
// being recorded, nor to a turn of another instance or none.
func (b *Base) AttachEnd(id string, end *EndHook) bool {
	c := b.c
	if c == nil || end == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range append([]*turn{c.active, c.current}, c.queue...) {
		if t == nil || t.row.ID != id {
			continue
		}
		if t.end != nil || t.endTaken {
			return false
		}
		t.end = end
		return true
	}
	return false
}

// SubmitMessages appends msgs to the transcript and queues a turn without
// waiting for it; it returns the turn id. Use WaitTurn to wait.
func (b *Base) SubmitMessages(ctx context.Context, msgs []message.Message, opts SubmitOptions) (string, error) {
	t, err := b.c.accept(ctx, acceptRequest{append: msgs, id: opts.ID, key: opts.IdempotencyKey, body: opts.Body, retain: opts.Retain,
		tx: opts.Tx, end: opts.End})
	if err != nil {
		return "", err
	}
	return t, nil
}

// SaveMessages appends msgs to the transcript, runs a turn with no client
// connection (a headless turn) and returns when it ends.
func (b *Base) SaveMessages(ctx context.Context, msgs []message.Message) (TurnResult, error) {
	id, err := b.SubmitMessages(ctx, msgs, SubmitOptions{})
	if err != nil {
		return TurnResult{}, err
	}
	return b.WaitTurn(ctx, id)
}

// WaitTurn waits for the turn id to end and returns its result. A turn that
// ended earlier is answered from storage. Waiting is an await point (see
// agent.Await): the instance takes other inputs meanwhile.
func (b *Base) WaitTurn(ctx context.Context, id string) (TurnResult, error) {
	c := b.c
	c.mu.Lock()
	live := (c.current != nil && c.current.row.ID == id) || c.ending[id]
	for _, t := range c.queue {
		live = live || t.row.ID == id
	}
	if live {
		ch := make(chan TurnResult, 1)
		c.waiters[id] = append(c.waiters[id], ch)
		c.mu.Unlock()
		// An await point: the turn's tools are inputs of this instance.
		var r TurnResult
		err := agent.Await(ctx, func() error {
			select {
			case r = <-ch:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		return r, err
	}
	if t := c.last; t != nil && t.row.ID == id {
		r := c.lastResult
		r.Message = r.Message.Clone()
		c.mu.Unlock()
		return r, nil
	}
	c.mu.Unlock()
	return c.storedResult(ctx, id)
}

// storedResult reads a finished turn's result.
func (c *core) storedResult(ctx context.Context, id string) (TurnResult, error) {
	var row streamRow
	var found bool
	var exhausted ExhaustReason
	err := c.rt.DB().View(ctx, func(tx store.Tx) error {
		var err error
		if row, found, err = getStream(ctx, tx, c.iid, id); err != nil || !found {
			return err
		}
		exhausted, err = exhaustedReason(ctx, tx, c.iid, id)
		return err
	})
	if err != nil {
		return TurnResult{}, fmt.Errorf("chat: turn %s: %w", id, err)
	}
	if !found {
		return TurnResult{}, fmt.Errorf("chat: turn %s: %w", id, store.ErrNotFound)
	}
	if row.Status != statusDone {
		// Unfinished in storage but not queued here: it belongs to an
		// earlier hydration that is still recovering.
		return TurnResult{}, fmt.Errorf("chat: turn %s is not finished", id)
	}
	r := TurnResult{ID: id, Outcome: row.Outcome, Error: row.Error, Exhausted: exhausted}
	c.mu.Lock()
	for _, m := range c.msgs {
		if m.ID == row.MessageID {
			r.Message = m.Clone()
		}
	}
	c.mu.Unlock()
	if r.Outcome == OutcomeCompleted {
		r.Waiting = waitingCalls(r.Message)
	}
	return r, nil
}

// CancelTurn aborts the turn id if it is running or queued, and reports
// whether it was.
func (b *Base) CancelTurn(id string) bool { return b.c.cancel(id, errCanceled) }

// ClearMessages deletes the transcript and the stored streams, aborts the
// running and queued turns, and tells every connection.
func (b *Base) ClearMessages(ctx context.Context) error { return b.c.clear(ctx, nil) }

// BusyTurn reports the id of the running turn, if any.
func (b *Base) BusyTurn() (string, bool) {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active == nil {
		return "", false
	}
	return c.active.row.ID, true
}

var errCanceled = errors.New("turn canceled")

// errResent is accept's answer to a client's request whose id names a
// stream already stored: the client sent it again (a reconnect that lost
// the answer), and nothing is written.
var errResent = errors.New("chat: request already accepted")

type acceptRequest struct {
	// replace is the client's full transcript (a chat request); append adds
	// to the stored one (headless turns).
	replace      []message.Message
	append       []message.Message
	origin       *agent.Conn
	id           string
	key          string
	body         json.RawMessage
	continuation bool
	retain       bool
	tx           func(ctx context.Context, tx store.Tx, id string) error
	end          *EndHook
	limited      bool   // a client's request: refused beyond Config.MaxQueuedRequests
	clientID     bool   // id is the client's: one already stored is a re-send (errResent)
	committed    func() // runs after the commit, before the turn is queued
}

// SubmittedTurn returns the id of the turn submitted with idempotency key,
// and false if no submission used that key. It lets a caller that crashed
// between SubmitMessages and recording the returned id find the turn again.
func (b *Base) SubmittedTurn(ctx context.Context, key string) (string, bool, error) {
	var id string
	err := b.c.rt.DB().View(ctx, func(tx store.Tx) error {
		return tx.QueryRow(ctx, `SELECT stream_id FROM chat_submissions WHERE instance_id = ? AND key = ?`, b.c.iid, key).Scan(&id)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("chat: look up submission: %w", err)
	}
	return id, true, nil
}

// accept persists the new transcript and a queued turn in one transaction,
// then queues the turn. With an idempotency key seen before, it returns the
// earlier turn's id and changes nothing.
func (c *core) accept(ctx context.Context, req acceptRequest) (string, error) {
	c.acceptMu.Lock()
	defer c.acceptMu.Unlock()
	return c.acceptLocked(ctx, req)
}

// acceptLocked is accept with c.acceptMu held.
func (c *core) acceptLocked(ctx context.Context, req acceptRequest) (string, error) {
	if req.id == "" {
		req.id = newID()
	}
	c.mu.Lock()
	if max := c.cfg.MaxQueuedRequests; req.limited && max > 0 && len(c.queue) >= max {
		c.mu.Unlock()
		return "", ErrTooManyQueued
	}
	// Every accepted turn holds a slot of the runtime's count; only a
	// client's request is refused when they are taken.
	slots := turnSlotsOf(c.rt)
	limit := 0
	if req.limited {
		limit = c.cfg.MaxTurnsInFlight
	}
	if !slots.reserve(limit) {
		c.mu.Unlock()
		return "", ErrTooManyTurns
	}
	reserved := true
	defer func() {
		if reserved {
			slots.release()
		}
	}()
	msgs := req.replace
	if msgs == nil {
		msgs = append(append([]message.Message(nil), c.msgs...), req.append...)
	}
	gen := c.gen
	c.mu.Unlock()
	for i := range msgs {
		if msgs[i].ID == "" {
			msgs[i].ID = newID()
		}
	}
	userIDs := trailingUserIDs(msgs)
	if req.replace == nil && len(req.append) > 0 {
		// Only the appended messages are this turn's: earlier user messages
		// may belong to turns still queued.
		userIDs = trailingUserIDs(msgs[len(msgs)-len(req.append):])
	}
	row := streamRow{ID: req.id, MessageID: newID(), Status: statusQueued, Continuation: req.continuation,
		Body: req.body, MessageIDs: userIDs, Retain: req.retain, TraceParent: agent.TraceParent(ctx)}
	if req.continuation {
		if last := lastAssistant(msgs); last != nil {
			row.MessageID = last.ID
		}
	}
	var plan transcriptPlan
	if req.replace != nil {
		// The transcript is compared before the write transaction, which
		// then writes only what differs.
		var err error
		if plan, err = c.stored.plan(ctx, c.b.DB(), c.iid, msgs); err != nil {
			return "", fmt.Errorf("chat: accept turn: %w", err)
		}
	}
	var existing string
	now := c.rt.Clock().Now().UnixMilli()
	lookup := c.keyed // a key no earlier acceptance stored cannot exist
	c.keyed = c.keyed || req.key != ""
	c.sweep = c.sweep || !row.Retain
	// A turn's acceptance is waited on (its first frame follows it): it
	// goes before the chunks of the streams already flowing.
	var written transcriptPlan
	err := c.b.DB().Update(store.WithUrgent(ctx), func(tx store.Tx) error {
		written = transcriptPlan{}
		// The instance's row lock orders concurrent acceptances (on an
		// engine with concurrent writers): the submission key check and
		// the next transcript position below read what the one before
		// wrote.
		var locked int64
		if err := tx.QueryRow(ctx, `SELECT id FROM instances WHERE id = ? FOR UPDATE`, c.iid).Scan(&locked); err != nil {
			return err
		}
		if req.clientID {
			var n int
			if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM chat_streams WHERE instance_id = ? AND id = ?`, c.iid, req.id).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return errResent
			}
		}
		if req.key != "" {
			found, err := c.claimKey(ctx, tx, req.key, row.ID, now, lookup, &existing)
			if err != nil || (found && req.tx == nil) {
				return err
			}
			if found {
				return req.tx(ctx, tx, existing)
			}
		}
		if req.replace != nil {
			if err := plan.apply(ctx, tx, c.iid); err != nil {
				return err
			}
			written = plan
		} else {
			// Only the new messages are written: a long transcript costs
			// nothing per turn.
			var err error
			if written, err = appendMessages(ctx, tx, c.iid, msgs[len(msgs)-len(req.append):]); err != nil {
				return err
			}
		}
		if err := c.b.KeepAwakeTx(ctx, tx, wakeReason); err != nil {
			return err
		}
		if req.continuation {
			// A continuation goes on from the turn that wrote its message:
			// its request body (client tools) unless it brings its own,
			// and, for a retained stream (an agent-tool run's), its
			// numbering, so that the run's timeline is one sequence.
			if err := continueFrom(ctx, tx, c.iid, &row); err != nil {
				return err
			}
		}
		if err := insertStream(ctx, tx, c.iid, row, now); err != nil {
			return err
		}
		if req.tx != nil {
			return req.tx(ctx, tx, row.ID)
		}
		return nil
	})
	c.stored.wrote(written, err)
	if err != nil {
		return "", fmt.Errorf("chat: accept turn: %w", err)
	}
	if existing != "" {
		return existing, nil
	}
	if req.committed != nil {
		req.committed()
	}
	c.mu.Lock()
	if c.gen != gen {
		c.mu.Unlock()
		return "", errors.New("chat: transcript cleared while the turn was accepted")
	}
	c.msgs = msgs
	t := c.newTurn(row, req.origin)
	t.slot.adopt(slots)
	reserved = false
	if id, ok := agent.IdentityFrom(ctx); ok {
		// The turn's code (handler, tools, the child runs they start)
		// runs for the caller who submitted it; not persisted.
		t.ctx = agent.WithIdentity(t.ctx, id)
	}
	t.end = req.end
	c.queue = append(c.queue, t)
	c.accepts++
	if row.prev != "" {
		c.notifyNextLocked(row.prev, row.ID)
	}
	c.mu.Unlock()
	// The other connections see the new message before the turn that
	// answers it starts streaming.
	c.broadcastTranscript(req.origin)
	c.mu.Lock()
	c.startWorkerLocked()
	c.mu.Unlock()
	return row.ID, nil
}

// claimKey records the submission key for the stream id, unless an
// earlier acceptance stored it (found, its stream in existing). Without
// lookup none can have (core.keyed): nothing is read.
func (c *core) claimKey(ctx context.Context, tx store.Tx, key, id string, now int64, lookup bool, existing *string) (found bool, err error) {
	if lookup && tx.QueryRow(ctx, `SELECT stream_id FROM chat_submissions WHERE instance_id = ? AND key = ?`, c.iid, key).Scan(existing) == nil {
		return true, nil
	}
	_, err = tx.Exec(ctx, `INSERT INTO chat_submissions (instance_id, key, stream_id, created_at) VALUES (?, ?, ?, ?)`, c.iid, key, id, now)
	return false, err
}

// newID names a stream, a message or a part: short, and in creation order
// (streams of one millisecond recover in the order they were accepted).
func newID() string { return ids.Sorted() }

// newPartID names a part of a message: it needs no order, only to differ
// from the message's other parts, and it is in every chunk of the part.
func newPartID() string { return ids.Random() }

// trailingUserIDs returns the ids of the user messages after the last
// assistant message.
func trailingUserIDs(msgs []message.Message) []string {
	var ids []string
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == message.RoleAssistant {
			break
		}
		if msgs[i].Role == message.RoleUser {
			ids = append([]string{msgs[i].ID}, ids...)
		}
	}
	return ids
}

// anchorIndex returns the index of a turn's last user message in msgs, or
// -1 if it has none there. The turn answers the transcript up to it, and its
// answer goes right after it: messages submitted while the turn was queued
// belong to later turns.
func anchorIndex(msgs []message.Message, row streamRow) int {
	if len(row.MessageIDs) == 0 {
		return -1
	}
	last := row.MessageIDs[len(row.MessageIDs)-1]
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].ID == last {
			return i
		}
	}
	return -1
}

func lastAssistant(msgs []message.Message) *message.Message {
	if n := len(msgs); n > 0 && msgs[n-1].Role == message.RoleAssistant {
		return &msgs[n-1]
	}
	return nil
}

// startWorkerLocked starts the turn worker if it is not running. c.mu held.
func (c *core) startWorkerLocked() {
	if c.working || len(c.queue) == 0 {
		return
	}
	c.working = true
	c.release = c.b.KeepAlive()
	c.rt.Go(func(ctx context.Context) { c.work(ctx) })
}

// work runs queued turns one at a time, in order.
func (c *core) work(ctx context.Context) {
	for {
		c.mu.Lock()
		if len(c.queue) == 0 || ctx.Err() != nil {
			if ctx.Err() != nil {
				// Shutting down: the queued turns stay stored and run
				// after the restart, not in this process.
				c.dequeued(c.queue...)
				for _, t := range c.queue {
					t.slot.release()
				}
			}
			c.working = false
			release := c.release
			c.release = nil
			idle := len(c.queue) == 0
			// The last turn's end cleared the flag already, and nothing
			// was accepted since.
			cleared := c.wakeCleared && c.wakeClearedAt == c.accepts
			c.mu.Unlock()
			if idle && !cleared && ctx.Err() == nil {
				c.clearWakeIfIdle(ctx)
			}
			if release != nil {
				release()
			}
			return
		}
		t := c.queue[0]
		c.queue = c.queue[1:]
		c.dequeued(t)
		c.active, c.current = t, t
		c.mu.Unlock()

		res := c.run(ctx, t)
		t.slot.release()

		c.mu.Lock()
		c.active, c.current = nil, nil
		waiters := c.waiters[t.row.ID]
		delete(c.waiters, t.row.ID)
		c.mu.Unlock()
		for _, w := range waiters {
			w <- res
		}
		if o, ok := c.self.(TurnObserver); ok && ctx.Err() == nil {
			_ = agent.Enter(ctx, c.self, func(ctx context.Context) error {
				o.OnTurnEnd(ctx, res)
				return nil
			})
		}
	}
}

type follower struct{ fn func(seq int, body string) }

// FollowStream calls fn with every chunk of the stream id whose sequence is
// greater than afterSeq: first the chunks stored so far, then each new one as
// it is written, in order and each once, until stop is called. fn runs while
// the chat holds its lock: it must not block or call back into the chat.
// Agent tools use it to forward a child's stream to the parent's clients.
func (b *Base) FollowStream(ctx context.Context, id string, afterSeq int, fn func(seq int, body string)) (stop func(), err error) {
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	high := afterSeq
	deliver := func(seq int, body string) {
		if seq > high {
			high = seq
			fn(seq, body)
		}
	}
	queued := false
	for _, t := range c.queue {
		// A queued turn has committed nothing (a recovered one gets its
		// stored chunks delivered when it starts, see prepareRecovery).
		queued = queued || t.row.ID == id
	}
	t := c.current
	if t == nil || t.row.ID != id {
		t = c.last
	}
	if t != nil && t.row.ID == id && (t.loaded || !t.recovering) {
		// Running (a recovering turn once it read its stored stream), or ended (its waiters not told yet, or the last turn
		// that ended): its committed chunks are all in memory.
		for _, sc := range t.chunks {
			deliver(sc.Seq, sc.Body)
		}
	} else if !queued {
		var chunks []storedChunk
		err := c.rt.DB().View(ctx, func(tx store.Tx) error {
			var err error
			chunks, err = loadChunks(ctx, tx, c.iid, id)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("chat: follow %s: %w", id, err)
		}
		for _, sc := range chunks {
			deliver(sc.Seq, sc.Body)
		}
	}
	f := &follower{fn: deliver}
	if c.follow[id] == nil {
		c.follow[id] = map[*follower]struct{}{}
	}
	c.follow[id][f] = struct{}{}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.follow[id], f)
		if len(c.follow[id]) == 0 {
			delete(c.follow, id)
		}
	}, nil
}

// StreamChunks returns the stored chunks of stream id with a sequence
// greater than afterSeq (the live chunks of a running turn included).
func (b *Base) StreamChunks(ctx context.Context, id string, afterSeq int) ([]StreamChunk, error) {
	var out []StreamChunk
	stop, err := b.FollowStream(ctx, id, afterSeq, func(seq int, body string) {
		out = append(out, StreamChunk{Seq: seq, Body: body})
	})
	if err != nil {
		return nil, err
	}
	stop()
	return out, nil
}

// StreamChunk is one chunk of a turn's stream.
type StreamChunk struct {
	Seq  int
	Body string
}

// StoredChunks returns the committed chunks of the stream id of the
// instance at path with a sequence greater than afterSeq, read from db
// rather than from the instance, which may be served by another node of a
// cluster (agent tools follow a child on another node with it).
func StoredChunks(ctx context.Context, db store.DB, path agent.Path, id string, afterSeq int) ([]StreamChunk, error) {
	var out []StreamChunk
	err := db.View(ctx, func(tx store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT c.seq, c.body FROM chat_chunks c JOIN instances i ON i.id = c.instance_id
			WHERE i.path = ? AND c.stream_id = ? AND c.seq > ? ORDER BY c.seq`, path.String(), id, afterSeq)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var c StreamChunk
			if err := rows.Scan(&c.Seq, &c.Body); err != nil {
				return err
			}
			out = append(out, c)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("chat: stored chunks of %s: %w", id, err)
	}
	return out, nil
}
