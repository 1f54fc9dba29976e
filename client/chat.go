package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/agentry/agentry/chat/message"
)

// Frame types of the chat protocol.
const (
	frameChatRequest   = "cf_agent_use_chat_request"
	frameChatResponse  = "cf_agent_use_chat_response"
	frameChatMessages  = "cf_agent_chat_messages"
	frameChatClear     = "cf_agent_chat_clear"
	frameChatCancel    = "cf_agent_chat_request_cancel"
	frameResumeRequest = "cf_agent_stream_resume_request"
	frameResumeAck     = "cf_agent_stream_resume_ack"
	frameResuming      = "cf_agent_stream_resuming"
	frameResumeNone    = "cf_agent_stream_resume_none"
	frameStreamPending = "cf_agent_stream_pending"
	frameMsgUpdated    = "cf_agent_message_updated"
)

// Turn outcomes, as the server reports them on the done frame.
const (
	OutcomeCompleted  = "completed"
	OutcomeError      = "error"
	OutcomeAborted    = "aborted"
	OutcomeSkipped    = "skipped"
	OutcomeRecovering = "recovering"
)

// ErrNoStream is returned by Chat.Resume when the agent has no turn to
// resume (cf_agent_stream_resume_none).
var ErrNoStream = errors.New("client: no chat stream to resume")

// Chat drives the chat protocol of a connection, as useAgentChat does: it
// keeps the transcript the server sends (on connect, after other clients'
// turns, on clear and on message updates) plus this client's own turns,
// sends turns, cancels and clears them, and resumes a stream after a
// reconnect. Get it with Conn.Chat; its methods are safe for concurrent
// use.
type Chat struct {
	c *Conn

	mu       sync.Mutex
	messages []message.Message
	// known is set once the transcript came from the server (a
	// cf_agent_chat_messages or clear frame, or Messages).
	known bool
	// sockKnown is closed once the current socket delivered a transcript
	// (or Dial fetched one); beginSocket replaces it.
	sockKnown   chan struct{}
	sockKnownOK bool
	// offered are the turns in flight the current socket's server offered
	// to resume (cf_agent_stream_resuming without a probe id).
	offered map[string]bool
	streams map[string]*Stream
	probes  map[string]chan probeAnswer
	// resumeWait receives stream offers without a probe id, for a Resume
	// whose probe was answered "pending".
	resumeWait chan probeAnswer
	// resuming is set after a reconnect while turns in flight wait for
	// their offer: offers are then acknowledged as they arrive.
	resuming bool
	err      error
}

type probeAnswer struct {
	typ string // frameResuming, frameResumeNone or frameStreamPending
	id  string
}

func newChat(c *Conn) *Chat {
	return &Chat{c: c, streams: map[string]*Stream{}, probes: map[string]chan probeAnswer{},
		sockKnown: make(chan struct{}), offered: map[string]bool{}}
}

// beginSocket is called before a new socket's frames are read.
func (ch *Chat) beginSocket() {
	ch.mu.Lock()
	ch.sockKnown, ch.sockKnownOK = make(chan struct{}), false
	ch.offered = map[string]bool{}
	ch.resuming = false
	ch.mu.Unlock()
}

// markKnown records that the current socket delivered the transcript;
// ch.mu is held.
func (ch *Chat) markKnown() {
	ch.known = true
	if !ch.sockKnownOK {
		ch.sockKnownOK = true
		close(ch.sockKnown)
	}
}

// awaitTranscript waits, when chat is set or this client has turns in
// flight (a reconnect must know which of them the server has), until the
// current socket has delivered the transcript (an Agentry chat agent sends
// it with the connect frames) or, if it has not by now, until
// GET …/get-messages answers, whichever comes first. An agent without a
// chat answers the GET with an error and counts as an empty chat. It
// returns early when the socket ends (lost closed).
func (ch *Chat) awaitTranscript(ctx context.Context, lost <-chan struct{}, chat bool) error {
	ch.mu.Lock()
	known := ch.sockKnown
	inFlight := len(ch.streams) > 0
	ch.mu.Unlock()
	if !chat && !inFlight {
		return nil
	}
	select {
	case <-known:
		return nil
	default:
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type answer struct {
		msgs []message.Message
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		msgs, err := ch.Messages(fctx)
		got <- answer{msgs, err}
	}()
	select {
	case <-known:
		cancel()
		<-got
		return nil
	case a := <-got:
		var he *HTTPError
		switch {
		case a.err == nil:
		case errors.As(a.err, &he):
			a.msgs = nil // no chat: an empty one
		case ctx.Err() != nil:
			return fmt.Errorf("waiting for the transcript: %w", ctx.Err())
		default:
			// The transcript stays unknown: SendMessage fetches it.
			return nil
		}
		ch.mu.Lock()
		if !ch.sockKnownOK {
			ch.markAccepted(a.msgs)
			ch.messages = ch.keepInFlight(a.msgs)
			ch.markKnown()
		}
		ch.mu.Unlock()
		return nil
	case <-lost:
		return errors.New("connection lost while waiting for the transcript")
	case <-ctx.Done():
		return fmt.Errorf("waiting for the transcript: %w", ctx.Err())
	}
}

// Chat returns the connection's chat client. It follows the chat frames
// from the moment the connection opened, so its transcript includes the one
// the server sends on connect.
func (c *Conn) Chat() *Chat { return c.chat }

// Transcript returns a copy of the transcript as this client knows it.
func (ch *Chat) Transcript() []message.Message {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return cloneMessages(ch.messages)
}

func cloneMessages(ms []message.Message) []message.Message {
	out := make([]message.Message, len(ms))
	for i, m := range ms {
		out[i] = m.Clone()
	}
	return out
}

// Send sends a user message with text as a new turn (see SendMessage).
func (ch *Chat) Send(ctx context.Context, text string) (*Stream, error) {
	return ch.SendMessage(ctx, message.Message{
		ID:    uuid.NewString(),
		Role:  message.RoleUser,
		Parts: []message.Part{{Type: message.PartText, Text: text}},
	})
}

// SendMessage sends m as a new turn (cf_agent_use_chat_request with method
// POST and the body {messages: transcript + m, trigger: "submit-message"})
// and returns the turn's stream. m is added to the transcript at once; the
// assistant message is added when the turn ends.
//
// The server takes the transcript a turn carries as the new history, so
// before the first turn the Chat makes sure it knows the server's: if no
// transcript frame has arrived yet, it fetches it with Messages (an agent
// that does not serve get-messages counts as empty, as for useAgentChat).
func (ch *Chat) SendMessage(ctx context.Context, m message.Message) (*Stream, error) {
	if m.ID == "" {
		m.ID = uuid.NewString()
	}
	if m.Role == "" {
		m.Role = message.RoleUser
	}
	ch.mu.Lock()
	known := ch.known
	ch.mu.Unlock()
	if !known {
		msgs, err := ch.Messages(ctx)
		var he *HTTPError
		if err != nil && !errors.As(err, &he) {
			return nil, fmt.Errorf("client: chat send: %w", err)
		}
		ch.mu.Lock()
		if !ch.known {
			ch.messages, ch.known = msgs, true
		}
		ch.mu.Unlock()
	}
	id := requestID()
	ch.mu.Lock()
	if ch.err != nil {
		err := ch.err
		ch.mu.Unlock()
		return nil, fmt.Errorf("client: chat send: %w", err)
	}
	ch.messages = append(ch.messages, m.Clone())
	msgs := cloneMessages(ch.messages)
	s := newStream(ch, id)
	s.userMsg = m.Clone()
	ch.streams[id] = s
	ch.mu.Unlock()
	body, err := json.Marshal(struct {
		Messages []message.Message `json:"messages"`
		Trigger  string            `json:"trigger"`
	}{msgs, "submit-message"})
	if err != nil {
		ch.forget(id)
		return nil, fmt.Errorf("client: chat send: encode body: %w", err)
	}
	type init struct {
		Method string `json:"method"`
		Body   string `json:"body"`
	}
	req, err := json.Marshal(struct {
		ID   string `json:"id"`
		Init init   `json:"init"`
		Type string `json:"type"`
	}{id, init{http.MethodPost, string(body)}, frameChatRequest})
	if err != nil {
		ch.forget(id)
		return nil, fmt.Errorf("client: chat send: encode request: %w", err)
	}
	sk, err := ch.c.socketFor(ctx)
	if err != nil {
		ch.forget(id)
		return nil, fmt.Errorf("client: chat send: %w", err)
	}
	ch.mu.Lock()
	s.request, s.sentOn = req, sk
	ch.mu.Unlock()
	if err := ch.c.writeOn(ctx, sk, req); err != nil {
		ch.forget(id)
		return nil, fmt.Errorf("client: chat send: %w", err)
	}
	return s, nil
}

// Cancel asks the server to stop the turn id (cf_agent_chat_request_cancel).
// Its stream then ends with outcome aborted.
func (ch *Chat) Cancel(ctx context.Context, id string) error {
	if err := ch.c.Send(ctx, struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	}{id, frameChatCancel}); err != nil {
		return fmt.Errorf("client: chat cancel %s: %w", id, err)
	}
	return nil
}

// Clear clears the chat's history on the server (cf_agent_chat_clear) and
// locally.
func (ch *Chat) Clear(ctx context.Context) error {
	ch.mu.Lock()
	ch.messages, ch.known = nil, true
	ch.mu.Unlock()
	if err := ch.c.Send(ctx, struct {
		Type string `json:"type"`
	}{frameChatClear}); err != nil {
		return fmt.Errorf("client: chat clear: %w", err)
	}
	return nil
}

// Messages fetches the transcript over HTTP (GET …/get-messages, with
// Options.Query and Options.Header), as useAgentChat does on mount.
func (ch *Chat) Messages(ctx context.Context) ([]message.Message, error) {
	o := ch.c.opts
	u := ch.c.httpBase + "/get-messages"
	if len(o.Query) > 0 {
		q := o.Query
		if q.Has("_pk") {
			q = cloneValues(q)
			q.Del("_pk")
		}
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("client: get messages: %w", err)
	}
	for k, vs := range o.Header {
		req.Header[k] = vs
	}
	hc := o.HTTPClient
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("client: get messages: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("client: get messages: %w",
			&HTTPError{StatusCode: resp.StatusCode, Status: resp.Status, Body: strings.TrimSpace(string(b))})
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("client: get messages: %w", err)
	}
	msgs := []message.Message{}
	if len(strings.TrimSpace(string(b))) == 0 {
		return msgs, nil
	}
	if err := json.Unmarshal(b, &msgs); err != nil {
		return nil, fmt.Errorf("client: get messages: decode: %w", err)
	}
	return msgs, nil
}

// Resume picks up the chat turn the agent is streaming, as useAgentChat
// does on mount and reconnect: it sends a resume probe, acknowledges the
// stream the server offers, and returns that stream, which replays every
// chunk so far and then follows the live turn (or ends at once with the
// stored outcome if the turn has finished). A probe answered "pending"
// waits, within ctx, for the turn to start. Without a turn it returns
// ErrNoStream.
func (ch *Chat) Resume(ctx context.Context) (*Stream, error) {
	probeID := requestID()
	ans := make(chan probeAnswer, 8)
	ch.mu.Lock()
	if ch.err != nil {
		err := ch.err
		ch.mu.Unlock()
		return nil, fmt.Errorf("client: chat resume: %w", err)
	}
	ch.probes[probeID] = ans
	ch.mu.Unlock()
	defer func() {
		ch.mu.Lock()
		delete(ch.probes, probeID)
		if ch.resumeWait == ans {
			ch.resumeWait = nil
		}
		ch.mu.Unlock()
	}()
	if err := ch.c.Send(ctx, struct {
		Type    string `json:"type"`
		ProbeID string `json:"probeId"`
	}{frameResumeRequest, probeID}); err != nil {
		return nil, fmt.Errorf("client: chat resume: %w", err)
	}
	for {
		select {
		case a := <-ans:
			switch a.typ {
			case frameResumeNone:
				return nil, ErrNoStream
			case frameStreamPending:
				ch.mu.Lock()
				ch.resumeWait = ans
				ch.mu.Unlock()
				continue
			}
			ch.mu.Lock()
			s, ok := ch.streams[a.id]
			if !ok {
				s = newStream(ch, a.id)
				ch.streams[a.id] = s
			}
			ch.mu.Unlock()
			if err := ch.c.Send(ctx, struct {
				Type string `json:"type"`
				ID   string `json:"id"`
			}{frameResumeAck, a.id}); err != nil {
				ch.forget(a.id)
				return nil, fmt.Errorf("client: chat resume: %w", err)
			}
			return s, nil
		case <-ch.c.done:
			return nil, fmt.Errorf("client: chat resume: %w", ch.c.Err())
		case <-ctx.Done():
			return nil, fmt.Errorf("client: chat resume: %w", ctx.Err())
		}
	}
}

func (ch *Chat) forget(id string) {
	ch.mu.Lock()
	delete(ch.streams, id)
	ch.mu.Unlock()
}

// fail ends every stream with the connection's error.
func (ch *Chat) fail(err error) {
	ch.mu.Lock()
	ch.err = err
	streams := ch.streams
	ch.streams = map[string]*Stream{}
	ch.mu.Unlock()
	for _, s := range streams {
		s.fail(err)
	}
}

// responseFrame is a cf_agent_use_chat_response frame.
type responseFrame struct {
	ID             string   `json:"id"`
	Body           string   `json:"body"`
	Done           bool     `json:"done"`
	Error          bool     `json:"error"`
	Continuation   bool     `json:"continuation"`
	Replay         bool     `json:"replay"`
	ReplayComplete bool     `json:"replayComplete"`
	Seq            *int     `json:"seq"`
	MessageIDs     []string `json:"messageIds"`
	Outcome        string   `json:"outcome"`
}

// handleFrame applies one chat frame of the socket sk; other frames are
// ignored.
func (ch *Chat) handleFrame(sk *socket, typ string, data []byte) {
	switch typ {
	case frameChatResponse:
		var f responseFrame
		if json.Unmarshal(data, &f) != nil {
			return
		}
		ch.mu.Lock()
		s := ch.streams[f.ID]
		if s != nil {
			s.accepted = true
			if f.Done {
				delete(ch.streams, f.ID)
			}
		}
		ch.mu.Unlock()
		if s != nil {
			s.handle(f)
		}
	case frameChatMessages:
		var f struct {
			Messages []message.Message `json:"messages"`
		}
		if json.Unmarshal(data, &f) != nil {
			return
		}
		ch.mu.Lock()
		ch.markAccepted(f.Messages)
		ch.messages = ch.keepInFlight(f.Messages)
		ch.markKnown()
		ch.mu.Unlock()
	case frameChatClear:
		ch.mu.Lock()
		ch.messages = nil
		ch.markKnown()
		ch.mu.Unlock()
	case frameMsgUpdated:
		var f struct {
			Message message.Message `json:"message"`
		}
		if json.Unmarshal(data, &f) != nil {
			return
		}
		ch.mu.Lock()
		replaceMessage(ch.messages, f.Message)
		ch.mu.Unlock()
	case frameResuming, frameResumeNone, frameStreamPending:
		var f struct {
			ID      string `json:"id"`
			ProbeID string `json:"probeId"`
		}
		if json.Unmarshal(data, &f) != nil {
			return
		}
		ch.mu.Lock()
		dst := ch.probes[f.ProbeID]
		ack := false
		if s := ch.streams[f.ID]; s != nil {
			s.accepted = true
			if f.ProbeID == "" && typ == frameResuming {
				// An offer of one of this client's turns: on connect
				// (resumeAll acknowledges it), or once a turn that was
				// pending started (acknowledged here).
				ack = ch.resuming && !ch.offered[f.ID]
				ch.offered[f.ID] = true
			}
		}
		if f.ProbeID == "" {
			dst = nil
			if typ == frameResuming {
				dst = ch.resumeWait
			}
		} else if typ == frameStreamPending && dst != nil {
			// The offer may follow at once, before Resume reads this
			// answer: it must find the probe waiting for it.
			ch.resumeWait = dst
		}
		ch.mu.Unlock()
		if ack {
			ch.c.goAck(sk, f.ID)
		}
		if dst != nil {
			select {
			case dst <- probeAnswer{typ: typ, id: f.ID}:
			default:
			}
		}
	}
}

// markAccepted records which turns in flight the server has accepted: those
// whose user message msgs holds. ch.mu is held.
func (ch *Chat) markAccepted(msgs []message.Message) {
	for _, s := range ch.streams {
		if s.userMsg.ID == "" || s.accepted {
			continue
		}
		for _, m := range msgs {
			if m.ID == s.userMsg.ID {
				s.accepted = true
				break
			}
		}
	}
}

// keepInFlight returns msgs plus the user messages of this client's turns
// still in flight that msgs lacks: a transcript sent before the server saw
// such a turn (the one sent on connect, typically) must not drop it.
// ch.mu is held.
func (ch *Chat) keepInFlight(msgs []message.Message) []message.Message {
	for _, s := range ch.streams {
		if s.userMsg.ID == "" {
			continue
		}
		found := false
		for _, m := range msgs {
			found = found || m.ID == s.userMsg.ID
		}
		if !found {
			msgs = append(msgs, s.userMsg.Clone())
		}
	}
	return msgs
}

// replaceMessage replaces the message with m's id, else the one holding one
// of m's tool calls; like useAgentChat it never appends.
func replaceMessage(msgs []message.Message, m message.Message) {
	for i := range msgs {
		if msgs[i].ID == m.ID {
			msgs[i] = m
			return
		}
	}
	for i := range msgs {
		for _, p := range msgs[i].Parts {
			if !p.IsTool() {
				continue
			}
			for _, q := range m.Parts {
				if q.IsTool() && q.ToolCallID == p.ToolCallID {
					msgs[i] = m
					return
				}
			}
		}
	}
}

// finishTurn records the assistant message of a finished turn in the
// transcript: a continuation replaces the last assistant message, a message
// the transcript already has (by id) is replaced, anything else appended.
func (ch *Chat) finishTurn(m message.Message, continuation bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if continuation {
		for i := len(ch.messages) - 1; i >= 0; i-- {
			if ch.messages[i].Role == message.RoleAssistant {
				ch.messages[i] = m
				return
			}
		}
	}
	for i := range ch.messages {
		if m.ID != "" && ch.messages[i].ID == m.ID {
			ch.messages[i] = m
			return
		}
	}
	ch.messages = append(ch.messages, m)
}

// lastAssistant returns the last message of the transcript if it is an
// assistant message.
func (ch *Chat) lastAssistant() (message.Message, bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if n := len(ch.messages); n > 0 && ch.messages[n-1].Role == message.RoleAssistant {
		return ch.messages[n-1].Clone(), true
	}
	return message.Message{}, false
}

// TurnResult is how a chat turn ended.
type TurnResult struct {
	// ID is the turn's request id.
	ID string
	// Outcome is OutcomeCompleted, OutcomeError, OutcomeAborted,
	// OutcomeSkipped or OutcomeRecovering.
	Outcome string
	// Error is the error text of an error outcome.
	Error string
	// MessageIDs are the ids of the user messages the turn answered.
	MessageIDs []string
	// Message is the assistant message built from the turn's chunks; it
	// has no parts when the turn streamed nothing.
	Message message.Message
}

// TurnError is the error of a turn that ended with outcome error.
type TurnError struct {
	ID      string
	Message string
}

// Error describes the failed turn.
func (e *TurnError) Error() string {
	return fmt.Sprintf("client: chat turn %s failed: %s", e.ID, e.Message)
}

// Stream is the chunk stream of one chat turn. Chunks are queued without
// bound as they arrive; read them with Next or All, or wait for the end
// with Wait. Chunks are deduplicated by their seq, so a replay that
// overlaps live delivery is applied once.
type Stream struct {
	ch      *Chat
	id      string
	userMsg message.Message // the message this client sent, if any
	// request is the request frame this client sent, for a resend after a
	// reconnect; accepted is set once the server showed it has the turn.
	// Both are guarded by Chat.mu.
	request  []byte
	sentOn   *socket
	accepted bool

	mu           sync.Mutex
	queue        []message.Chunk
	b            *message.Builder
	applied      bool
	lastSeq      int
	continuation bool
	errText      string
	ended        bool
	result       TurnResult
	err          error         // transport or stream error
	signal       chan struct{} // capacity 1
}

func newStream(ch *Chat, id string) *Stream {
	return &Stream{ch: ch, id: id, b: message.NewBuilder(""), lastSeq: -1, signal: make(chan struct{}, 1)}
}

// ID returns the turn's request id (for Chat.Cancel).
func (s *Stream) ID() string { return s.id }

// Message returns the assistant message built so far.
func (s *Stream) Message() message.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Message()
}

func (s *Stream) wake() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

func (s *Stream) fail(err error) {
	s.mu.Lock()
	if !s.ended {
		s.ended = true
		s.err = err
	}
	s.mu.Unlock()
	s.wake()
}

// handle applies one response frame; it runs on the reading goroutine.
func (s *Stream) handle(f responseFrame) {
	var finished *message.Message
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	if f.Continuation && !s.continuation && !s.applied {
		s.continuation = true
		if last, ok := s.ch.lastAssistant(); ok {
			_ = s.b.Continue(last)
		}
	}
	switch {
	case f.Error:
		s.errText = f.Body
	case f.Body != "":
		if f.Seq != nil && *f.Seq <= s.lastSeq {
			break
		}
		if f.Seq != nil {
			s.lastSeq = *f.Seq
		}
		var c message.Chunk
		if err := json.Unmarshal([]byte(f.Body), &c); err != nil {
			if s.err == nil {
				s.err = fmt.Errorf("client: chat turn %s: bad chunk: %w", s.id, err)
			}
			break
		}
		if err := s.b.Apply(c); err != nil {
			if s.err == nil {
				s.err = fmt.Errorf("client: chat turn %s: %w", s.id, err)
			}
			break
		}
		s.applied = true
		s.queue = append(s.queue, c)
	}
	if f.Done {
		s.ended = true
		out := f.Outcome
		if out == "" {
			out = OutcomeCompleted
			if s.errText != "" {
				out = OutcomeError
			}
		}
		if s.applied {
			s.b.Finalize()
		}
		s.result = TurnResult{ID: s.id, Outcome: out, Error: s.errText, MessageIDs: f.MessageIDs, Message: s.b.Message()}
		if s.applied {
			m := s.result.Message.Clone()
			finished = &m
		}
	}
	cont := s.continuation
	s.mu.Unlock()
	if finished != nil {
		s.ch.finishTurn(*finished, cont)
	}
	s.wake()
}

// Next returns the turn's next chunk. After the last one it returns io.EOF
// once the turn has ended (see Result), or the error that ended the stream:
// a *CloseError or ErrClosed when the connection ended first, or an error
// for a chunk that broke the stream's ordering rules.
func (s *Stream) Next(ctx context.Context) (message.Chunk, error) {
	for {
		s.mu.Lock()
		if len(s.queue) > 0 {
			c := s.queue[0]
			s.queue = s.queue[1:]
			s.mu.Unlock()
			return c, nil
		}
		ended, err := s.ended, s.err
		s.mu.Unlock()
		if ended {
			if err != nil {
				return message.Chunk{}, err
			}
			return message.Chunk{}, io.EOF
		}
		select {
		case <-s.signal:
		case <-ctx.Done():
			return message.Chunk{}, fmt.Errorf("client: chat turn %s: %w", s.id, ctx.Err())
		}
	}
}

// All returns an iterator over the turn's chunks; it stops after the last
// one, or yields the error that ended the stream (never io.EOF).
func (s *Stream) All(ctx context.Context) iter.Seq2[message.Chunk, error] {
	return func(yield func(message.Chunk, error) bool) {
		for {
			c, err := s.Next(ctx)
			if errors.Is(err, io.EOF) {
				return
			}
			if !yield(c, err) || err != nil {
				return
			}
		}
	}
}

// Result returns how the turn ended; ok is false while it has not.
func (s *Stream) Result() (r TurnResult, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended || s.result.ID == "" {
		return TurnResult{}, false
	}
	return s.result, true
}

// Wait waits for the end of the turn (discarding chunks not yet read) and
// returns its result. A turn with outcome error returns its result and a
// *TurnError; aborted and skipped turns are not errors.
func (s *Stream) Wait(ctx context.Context) (TurnResult, error) {
	for {
		s.mu.Lock()
		s.queue = nil
		ended, err, r := s.ended, s.err, s.result
		s.mu.Unlock()
		if ended {
			if err != nil {
				return r, err
			}
			if r.Outcome == OutcomeError {
				return r, &TurnError{ID: s.id, Message: r.Error}
			}
			return r, nil
		}
		select {
		case <-s.signal:
		case <-ctx.Done():
			return TurnResult{}, fmt.Errorf("client: chat turn %s: %w", s.id, ctx.Err())
		}
	}
}

// requestID returns an 8-character request id, like the npm client's
// nanoid(8).
func requestID() string { return strings.ReplaceAll(uuid.NewString(), "-", "")[:8] }
