package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/agentry/agentry/chat/message"
)

// ToolStream writes into the stream of the chat turn a tool runs in (the
// AI SDK's UI message stream writer, as a tool's execute gets it): data
// parts, transient data and preliminary output of the tool's own call. A
// tool function gets it with ToolStreamFrom(ctx). It is safe for
// concurrent use.
//
// Persisted data parts are stored with the stream and in the assistant
// message: a resumed stream replays them and they survive a restart.
// Transient data reaches the clients that are connected (the AI SDK's
// onData), and nothing else: it is not stored, not replayed, not part of
// the message, and not forwarded to an agent-tool parent.
type ToolStream struct {
	t    *turn
	call ToolCall

	mu     sync.Mutex // held while a preliminary output is written
	closed bool       // the call returned: its output is final
}

type toolStreamKey struct{}

// ToolStreamFrom returns the stream writer of the tool call running in
// ctx; ok is false outside a chat tool call.
func ToolStreamFrom(ctx context.Context) (*ToolStream, bool) {
	s, ok := ctx.Value(toolStreamKey{}).(*ToolStream)
	return s, ok
}

// toolContext returns the context a tool call runs in: it carries the call
// and its stream writer. end makes the writer refuse preliminary output;
// call it before the call's final output is written.
func toolContext(ctx context.Context, tc ToolCall) (tctx context.Context, end func()) {
	tctx = WithToolCall(ctx, tc)
	t, ok := ctx.Value(turnKey{}).(*turn)
	if !ok {
		return tctx, func() {}
	}
	s := &ToolStream{t: t, call: tc}
	return context.WithValue(tctx, toolStreamKey{}, s), func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
	}
}

// Call returns the tool call the stream writes for.
func (s *ToolStream) Call() ToolCall { return s.call }

// Data writes a persisted "data-{name}" part with data (marshalled to
// JSON). A later part with the same name and a non-empty id replaces it,
// in the stored message as in the client's.
func (s *ToolStream) Data(name, id string, data any) error {
	ch, err := dataChunk(name, id, data, false)
	if err != nil {
		return err
	}
	return s.t.write(ch)
}

// Transient writes a transient "data-{name}" chunk, live only: the
// connected clients' onData callbacks see it, and nothing keeps it.
func (s *ToolStream) Transient(name, id string, data any) error {
	ch, err := dataChunk(name, id, data, true)
	if err != nil {
		return err
	}
	return s.t.writeLive(ch)
}

// File writes a file part into the assistant message (the AI SDK's "file"
// chunk): url is where the file is, often a data: URL with its bytes, and
// mediaType its IANA media type. It is stored and replayed like any part;
// the model does not see it (a tool's output is what the model reads).
func (s *ToolStream) File(mediaType, url string) error {
	if mediaType == "" || url == "" {
		return errors.New("chat: a file part needs a media type and a URL")
	}
	return s.t.write(message.Chunk{Type: message.ChunkFile, URL: url, MediaType: mediaType})
}

// ErrToolCallEnded is returned by ToolStream.Preliminary after the tool
// call returned.
var ErrToolCallEnded = errors.New("chat: the tool call has ended; its output is final")

// Preliminary writes a preliminary output of the tool's call (a
// tool-output-available chunk with preliminary:true): the client shows it
// in the tool part until the next preliminary output or the final one
// (what the tool function returns) replaces it. It is stored like the
// final output; a call that a restart interrupts after a preliminary
// output still runs again.
func (s *ToolStream) Preliminary(output any) error {
	raw, err := json.Marshal(output)
	if err != nil {
		return fmt.Errorf("chat: preliminary output is not JSON: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrToolCallEnded
	}
	ch := message.ToolOutputAvailable(s.call.ID, raw)
	yes := true
	ch.Preliminary = &yes
	return s.t.write(ch)
}

// dataChunk builds a data chunk, refusing the names the framework
// reserves.
func dataChunk(name, id string, data any, transient bool) (message.Chunk, error) {
	if err := checkDataName(name); err != nil {
		return message.Chunk{}, err
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return message.Chunk{}, fmt.Errorf("chat: data part %q is not JSON: %w", name, err)
	}
	return message.Data(name, id, raw, transient), nil
}

// checkDataName refuses an empty data name and the names the framework
// reserves: "agent-progress" and "agent-milestone" (agent-tool runs) and
// anything starting with "agentry-".
func checkDataName(name string) error {
	switch {
	case name == "" || strings.ContainsAny(name, " \t\n"):
		return fmt.Errorf("chat: bad data part name %q", name)
	case name == "agent-progress" || name == "agent-milestone" || strings.HasPrefix(name, "agentry-"):
		return fmt.Errorf("chat: data part name %q is reserved by the framework", name)
	}
	return nil
}
