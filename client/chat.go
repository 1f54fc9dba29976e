package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/wire"
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
	typ string // wire.StreamResuming, wire.StreamResumeNone or wire.StreamPending
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
	}{id, init{http.MethodPost, string(body)}, wire.ChatRequest})
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
	}{id, wire.ChatCancel}); err != nil {
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
	}{wire.ChatClear}); err != nil {
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
	}{wire.StreamResumeRequest, probeID}); err != nil {
		return nil, fmt.Errorf("client: chat resume: %w", err)
	}
	for {
		select {
		case a := <-ans:
			switch a.typ {
			case wire.StreamResumeNone:
				return nil, ErrNoStream
			case wire.StreamPending:
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
			}{wire.StreamResumeAck, a.id}); err != nil {
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

// requestID returns an 8-character request id, like the npm client's
// nanoid(8).
func requestID() string { return strings.ReplaceAll(uuid.NewString(), "-", "")[:8] }
