package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/client/agenttools"
	"github.com/agentry/agentry/wire"
)

// instance is one Assistant instance and what its users sent and saw, for
// the final check.
type instance struct {
	name string
	// turn is held (a token in a channel of one) by the user whose turn it
	// is to send.
	turn chan struct{}

	mu sync.Mutex
	// last is the id of the last message a user of this instance saw end
	// a turn; the next sender waits until its transcript holds it.
	last string
	// sent and answers are the ids of the user messages sent and the
	// assistant messages received.
	sent, answers []string
	// notices are the background runs whose completion notice must be in
	// the transcript.
	notices []string
	// children are the drilled children, by child name.
	children map[string]*childRecord
}

// childRecord is a drilled child and the messages its drill-ins exchanged.
type childRecord struct {
	sub           agenttools.SubAgent
	sent, answers []string
}

func newInstance(name string) *instance {
	in := &instance{name: name, turn: make(chan struct{}, 1), children: map[string]*childRecord{}}
	in.turn <- struct{}{}
	return in
}

func (in *instance) record(f func()) {
	in.mu.Lock()
	f()
	in.mu.Unlock()
}

// user is one simulated user: one connection to its instance at a time.
type user struct {
	g    *gen
	id   int
	url  string // the server (node) it talks to
	inst *instance
	rng  *rand.Rand
	tr   *agenttools.Tracker
	wake chan struct{} // a frame arrived (capacity 1)
	conn *client.Conn
	// mine are the children of this user's finished runs, for drill-ins.
	mine []agenttools.SubAgent
	n    int // actions done, for topics
	// unsend forgets the message the current action sent (under
	// inst.mu), when the server refused it: a refused request is not
	// stored.
	unsend func()
}

// onFrame wakes the user's waits; an agent-tool event that changes a
// run's status goes to the tracker. A run's chunks are not applied: the
// user reads only statuses and sub-agents, and the tracker would keep
// every chunk and rebuild the run's parts for each one.
func (u *user) onFrame(f client.Frame) {
	if f.Type == wire.AgentToolEvent && !chunkEvent(f.Data) {
		var ev agenttool.Frame
		if json.Unmarshal(f.Data, &ev) == nil && ev.Event.Kind != "chunk" {
			u.tr.Apply(ev)
		}
	}
	select {
	case u.wake <- struct{}{}:
	default:
	}
}

// chunkEvent reports an agent-tool event frame of kind "chunk" as the
// server writes it (the frame's members before its event are strings,
// numbers and booleans, so the first event member is the frame's own),
// which the generator does not apply: the child chunks are most of the
// frames, and decoding each only to drop it was a fifth of the generator's
// CPU. A frame of another shape is decoded.
func chunkEvent(data []byte) bool {
	const event = `,"event":{"kind":"`
	i := bytes.Index(data, []byte(event))
	return i >= 0 && bytes.HasPrefix(data[i+len(event):], []byte(`chunk"`))
}

func (u *user) options() client.Options {
	return client.Options{BaseURL: u.url, Agent: "Assistant", Name: u.inst.name, Chat: true,
		Token: u.g.cfg.Token, HTTPClient: u.g.hc, OnFrame: u.onFrame}
}

// connect dials the user's instance unless it is connected.
func (u *user) connect(ctx context.Context) error {
	if u.conn != nil {
		select {
		case <-u.conn.Done():
			u.conn = nil
		default:
			return nil
		}
	}
	c, err := client.Dial(ctx, u.options())
	if err != nil {
		return fmt.Errorf("dial %s: %w", u.inst.name, err)
	}
	u.conn = c
	return nil
}

func (u *user) close() {
	if u.conn != nil {
		u.conn.Close()
		u.conn = nil
	}
}

// loop runs actions until ctx (the run's duration) ends; work in flight
// then finishes within work (the drain).
func (u *user) loop(ctx, work context.Context) {
	defer u.close()
	for ctx.Err() == nil {
		a := u.g.cfg.Mix.pick(u.rng.IntN(u.g.cfg.Mix.total()))
		u.do(work, a)
		u.g.rec.action(a)
		if u.g.cfg.Think > 0 {
			t := time.NewTimer(u.g.cfg.Think)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
	}
}

func (u *user) do(ctx context.Context, a string) {
	u.n++
	topic := fmt.Sprintf("topic %d of user %d", u.n, u.id)
	var err error
	var kind string
	u.unsend = nil
	switch a {
	case ActResearch:
		kind, err = u.foreground(ctx, "research "+topic, 1, false)
	case ActFanout:
		kind, err = u.foreground(ctx, fmt.Sprintf("compare %s, %s and %s", "alpha "+topic, "beta "+topic, "gamma "+topic), 3, false)
	case ActReconnect:
		kind, err = u.foreground(ctx, "research "+topic, 1, true)
	case ActBackground:
		kind, err = u.background(ctx, topic)
	case ActDrill:
		if len(u.mine) == 0 {
			kind, err = u.foreground(ctx, "research "+topic, 1, false)
			break
		}
		kind, err = u.drill(ctx, u.mine[u.rng.IntN(len(u.mine))])
	}
	if err != nil {
		if u.g.failure(kind, err) && u.unsend != nil {
			u.inst.record(u.unsend)
		}
		// Start over on a fresh connection: the old one may be broken,
		// and its chat holds the refused message, which the server does
		// not (a chat request carries the whole transcript).
		u.close()
	}
}

// acquire waits for the user's turn to send on its instance, then until
// its connection shows the last answer any user of the instance saw.
func (u *user) acquire(ctx context.Context) (release func(), kind string, err error) {
	select {
	case <-u.inst.turn:
	case <-ctx.Done():
		return nil, "timeout-waiting-turn", ctx.Err()
	}
	release = func() { u.inst.turn <- struct{}{} }
	if err := u.connect(ctx); err != nil {
		release()
		return nil, "dial", err
	}
	u.inst.mu.Lock()
	last := u.inst.last
	u.inst.mu.Unlock()
	if last != "" {
		if err := u.waitFor(ctx, func(ms []message.Message) bool { return indexOf(ms, last) >= 0 }); err != nil {
			release()
			return nil, "stale-transcript", fmt.Errorf("message %s never reached this connection: %w", last, err)
		}
	}
	return release, "", nil
}

// waitFor waits until the connection's transcript satisfies ok.
func (u *user) waitFor(ctx context.Context, ok func([]message.Message) bool) error {
	return u.waitUntil(ctx, func() bool { return ok(u.conn.Chat().Transcript()) })
}

// waitUntil waits until ok holds, trying it again after each frame.
func (u *user) waitUntil(ctx context.Context, ok func() bool) error {
	for {
		if ok() {
			return nil
		}
		select {
		case <-u.wake:
		case <-u.conn.Done():
			return fmt.Errorf("connection ended: %w", u.conn.Err())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// send sends text as a new turn and returns its stream and the message id.
func (u *user) send(ctx context.Context, text string) (*client.Stream, string, error) {
	id := uuid.NewString()
	s, err := u.conn.Chat().SendMessage(ctx, message.Message{ID: id, Role: message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: text}}})
	return s, id, err
}

// foreground runs one awaited turn that starts runs agent-tool runs, and
// checks their events; with reconnect, it drops the connection after the
// first content chunk and resumes the turn on a new one.
func (u *user) foreground(ctx context.Context, text string, runs int, reconnect bool) (string, error) {
	tctx, end, kind, err := u.begin(ctx)
	if err != nil {
		return kind, err
	}
	defer end()
	// The tracker holds the runs of this action only: the runs of earlier
	// ones were checked, and keeping them would grow every frame's cost.
	u.tr.ResetLocalState()
	start := time.Now()
	s, id, err := u.sendRecorded(tctx, text)
	if err != nil {
		return "send", err
	}
	first, content, err := firstChunks(tctx, s, start)
	if err != nil {
		return "stream", err
	}
	if _, ended := s.Result(); ended {
		// Refused, or over before it streamed: nothing to resume.
		reconnect = false
	}
	if reconnect {
		u.close()
		if err := u.connect(tctx); err != nil {
			return "dial", err
		}
		rs, err := u.conn.Chat().Resume(tctx)
		switch {
		case errors.Is(err, client.ErrNoStream):
			// The turn ended before the probe: its answer is in the
			// transcript the new connection got.
			r, err := u.answerAfter(id)
			if err != nil {
				return "resume-lost", err
			}
			u.finish(id, r, start, first, content, nil, runs)
			return "", nil
		case err != nil:
			return "resume", err
		}
		s = rs
	}
	res, kind, err := completed(tctx, s, "turn")
	if err != nil {
		return kind, err
	}
	// The runs under the turn's tool call reach a terminal status in the
	// agent-tool events (the tool waited for them, so their terminal
	// events were sent before the tool's result).
	var calls []string
	for _, p := range res.Message.Parts {
		if p.IsTool() && p.ToolCallID != "" && (p.ToolName() == "research" || p.ToolName() == "compare") {
			calls = append(calls, p.ToolCallID)
		}
	}
	if len(calls) != 1 {
		return "answer", fmt.Errorf("turn %s answered with %d research tool calls, want 1: %s", res.ID, len(calls), textOf(res.Message))
	}
	var done []*agenttools.Run
	err = u.waitUntil(tctx, func() bool {
		done = done[:0]
		for _, r := range u.tr.RunsForToolCall(calls[0]) {
			if r.Status != agenttool.StatusRunning {
				done = append(done, r)
			}
		}
		return len(done) >= runs
	})
	if err != nil {
		return "agent-tool-events", fmt.Errorf("tool call %s: %d of %d runs ended in the events: %w", calls[0], len(done), runs, err)
	}
	for _, r := range done {
		if r.Status != agenttool.StatusCompleted {
			return "run-" + string(r.Status), fmt.Errorf("run %s ended %s: %s", r.RunID, r.Status, r.Error)
		}
	}
	u.finish(id, res.Message, start, first, content, done, runs)
	return "", nil
}

// finish records a completed turn.
func (u *user) finish(id string, answer message.Message, start time.Time, first, content time.Duration, done []*agenttools.Run, runs int) {
	end := time.Since(start)
	u.inst.record(func() {
		if answer.ID != "" {
			u.inst.answers = append(u.inst.answers, answer.ID)
			u.inst.last = answer.ID
		}
	})
	for _, r := range done {
		if r.SubAgent.Name != "" && len(u.mine) < 16 {
			u.mine = append(u.mine, r.SubAgent)
		}
	}
	u.g.rec.turn(first, content, end, runs)
}

// answerAfter finds, in the connection's transcript, the assistant message
// that follows the user message id.
func (u *user) answerAfter(id string) (message.Message, error) {
	ms := u.conn.Chat().Transcript()
	i := indexOf(ms, id)
	if i < 0 {
		return message.Message{}, fmt.Errorf("message %s is not in the transcript after the reconnect", id)
	}
	if i+1 >= len(ms) || ms[i+1].Role != message.RoleAssistant {
		return message.Message{}, fmt.Errorf("message %s has no answer after the reconnect, and no stream to resume", id)
	}
	return ms[i+1], nil
}

// background starts a detached run, then waits until its completion
// notice is answered in the chat (so that the next message this instance
// sends carries it).
func (u *user) background(ctx context.Context, topic string) (string, error) {
	tctx, end, kind, err := u.begin(ctx)
	if err != nil {
		return kind, err
	}
	defer end()
	start := time.Now()
	s, id, err := u.sendRecorded(tctx, "research "+topic+" in the background")
	if err != nil {
		return "send", err
	}
	first, content, res, kind, err := answered(tctx, s, start, "turn")
	if err != nil {
		return kind, err
	}
	var call string
	for _, p := range res.Message.Parts {
		if p.IsTool() && p.ToolName() == "research_background" {
			call = p.ToolCallID
		}
	}
	if call == "" {
		return "answer", fmt.Errorf("turn %s did not call research_background: %s", res.ID, textOf(res.Message))
	}
	u.finish(id, res.Message, start, first, content, nil, 0)
	runID := "agent-tool:" + call
	prefix := "detached-finish:" + runID + ":"
	var answer string
	err = u.waitFor(tctx, func(ms []message.Message) bool {
		for i, m := range ms {
			if strings.HasPrefix(m.ID, prefix) {
				for _, a := range ms[i+1:] {
					if a.Role == message.RoleUser {
						return false
					}
					if a.Role == message.RoleAssistant && !strings.HasPrefix(a.ID, "detached-ms:") {
						answer = a.ID
						return true
					}
				}
			}
		}
		return false
	})
	if err != nil {
		return "background-notice", fmt.Errorf("run %s: no answered completion notice: %w", runID, err)
	}
	u.inst.record(func() {
		u.inst.notices = append(u.inst.notices, runID)
		u.inst.last = answer
	})
	u.g.rec.addRuns(1)
	return "", nil
}

// drill asks a follow-up question in a child's own chat through the
// parent's sub-agent route.
func (u *user) drill(ctx context.Context, sa agenttools.SubAgent) (string, error) {
	tctx, cancel := context.WithTimeout(ctx, u.g.cfg.TurnTimeout)
	defer cancel()
	o := u.options()
	o.OnFrame = nil
	o.Sub = []client.Hop{{Agent: sa.Agent, Name: sa.Name}}
	c, err := client.Dial(tctx, o)
	if err != nil {
		return "dial-child", err
	}
	defer c.Close()
	start := time.Now()
	id := uuid.NewString()
	s, err := c.Chat().SendMessage(tctx, message.Message{ID: id, Role: message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: "what were your sources?"}}})
	if err != nil {
		return "send", err
	}
	u.inst.mu.Lock()
	cr := u.inst.children[sa.Name]
	if cr == nil {
		cr = &childRecord{sub: sa}
		u.inst.children[sa.Name] = cr
	}
	cr.sent = append(cr.sent, id)
	u.unsend = func() { cr.sent = without(cr.sent, id) }
	u.inst.mu.Unlock()
	first, content, res, kind, err := answered(tctx, s, start, "drill-in turn")
	if err != nil {
		return kind, err
	}
	u.inst.record(func() {
		if res.Message.ID != "" {
			cr.answers = append(cr.answers, res.Message.ID)
		}
	})
	u.g.rec.turn(first, content, time.Since(start), 0)
	return "", nil
}

// begin bounds a turn by Config.TurnTimeout and takes the user's turn
// slot (acquire); end gives both back. On an error it returns the kind
// acquire named.
func (u *user) begin(ctx context.Context) (tctx context.Context, end func(), kind string, err error) {
	tctx, cancel := context.WithTimeout(ctx, u.g.cfg.TurnTimeout)
	release, kind, err := u.acquire(tctx)
	if err != nil {
		cancel()
		return nil, nil, kind, err
	}
	return tctx, func() { release(); cancel() }, "", nil
}

// sendRecorded sends text as a user message and records it as sent by
// the instance (u.unsend takes it back).
func (u *user) sendRecorded(ctx context.Context, text string) (*client.Stream, string, error) {
	s, id, err := u.send(ctx, text)
	if err != nil {
		return nil, "", err
	}
	u.inst.record(func() { u.inst.sent = append(u.inst.sent, id) })
	u.unsend = func() { u.inst.sent = without(u.inst.sent, id) }
	return s, id, nil
}

// completed waits for the end of the turn of s, which must complete; what
// names the turn in the error. On an error it returns its kind.
func completed(ctx context.Context, s *client.Stream, what string) (client.TurnResult, string, error) {
	res, err := s.Wait(ctx)
	if err != nil {
		return res, turnKind(err), err
	}
	if res.Outcome != client.OutcomeCompleted {
		return res, "turn-" + res.Outcome, fmt.Errorf("%s %s ended %s", what, res.ID, res.Outcome)
	}
	return res, "", nil
}

// answered reads the turn of s to its end, which must be completed: the
// times of firstChunks and the result; what names the turn in the error.
// On an error it returns its kind.
func answered(ctx context.Context, s *client.Stream, start time.Time, what string) (first, content time.Duration, res client.TurnResult, kind string, err error) {
	first, content, err = firstChunks(ctx, s, start)
	if err != nil {
		return first, content, res, "stream", err
	}
	res, kind, err = completed(ctx, s, what)
	return first, content, res, kind, err
}

// firstChunks reads a turn's stream up to its first content chunk (one
// that is not start or start-step: text, reasoning, a tool call, data) and
// returns the times from start to the first chunk and to that one; zero
// when the turn ended before.
func firstChunks(ctx context.Context, s *client.Stream, start time.Time) (first, content time.Duration, err error) {
	for {
		c, err := s.Next(ctx)
		if errors.Is(err, io.EOF) {
			return first, content, nil
		}
		if err != nil {
			return first, content, err
		}
		if first == 0 {
			first = time.Since(start)
		}
		if c.Type != "start" && c.Type != "start-step" {
			return first, time.Since(start), nil
		}
	}
}

// turnKind names the kind of a turn's error.
func turnKind(err error) string {
	var te *client.TurnError
	if errors.As(err, &te) {
		return "turn-error"
	}
	return "stream"
}

// without returns ids without id.
func without(ids []string, id string) []string {
	out := ids[:0:0]
	for _, x := range ids {
		if x != id {
			out = append(out, x)
		}
	}
	return out
}

func indexOf(ms []message.Message, id string) int {
	for i, m := range ms {
		if m.ID == id {
			return i
		}
	}
	return -1
}
