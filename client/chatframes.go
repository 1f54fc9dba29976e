package client

import (
	"encoding/json"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/wire"
)

// handleFrame applies one chat frame of the socket sk; other frames are
// ignored.
func (ch *Chat) handleFrame(sk *socket, typ string, data []byte) {
	switch typ {
	case wire.ChatResponse:
		var f wire.ChatResponseFrame
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
	case wire.ChatMessages:
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
	case wire.ChatClear:
		ch.mu.Lock()
		ch.messages = nil
		ch.markKnown()
		ch.mu.Unlock()
	case wire.MessageUpdated:
		var f struct {
			Message message.Message `json:"message"`
		}
		if json.Unmarshal(data, &f) != nil {
			return
		}
		ch.mu.Lock()
		replaceMessage(ch.messages, f.Message)
		ch.mu.Unlock()
	case wire.StreamResuming, wire.StreamResumeNone, wire.StreamPending:
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
			if f.ProbeID == "" && typ == wire.StreamResuming {
				// An offer of one of this client's turns: on connect
				// (resumeAll acknowledges it), or once a turn that was
				// pending started (acknowledged here).
				ack = ch.resuming && !ch.offered[f.ID]
				ch.offered[f.ID] = true
			}
		}
		if f.ProbeID == "" {
			dst = nil
			if typ == wire.StreamResuming {
				dst = ch.resumeWait
			}
		} else if typ == wire.StreamPending && dst != nil {
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
