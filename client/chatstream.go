package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"sync"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/wire"
)

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
func (s *Stream) handle(f wire.ChatResponseFrame) {
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
