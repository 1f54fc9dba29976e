package chat

import (
	"strconv"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/jsonenc"
	"github.com/agentry/agentry/wire"
)

// The two frames a chat sends most, a transcript and a stream's chunk,
// are written here byte for byte as json.Marshal writes them, into one
// buffer: json.Marshal would copy and re-scan each message's encoding, and
// escape each chunk's body, on its second pass.

// encode returns f's JSON, what json.Marshal writes for it. A message
// that cannot be encoded (raw JSON that is not) panics, as encode does.
func (f messagesFrame) encode() []byte {
	n := 64
	for i := range f.Messages {
		n += 128 + len(f.Messages[i].Metadata)
		for j := range f.Messages[i].Parts {
			p := &f.Messages[i].Parts[j]
			n += 64 + len(p.Text) + len(p.Input) + len(p.Output) + len(p.Data)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, `{"type":`...)
	b = jsonenc.AppendString(b, f.Type)
	b = append(b, `,"messages":`...)
	b = appendMessagesJSON(b, f.Messages)
	if f.Connect {
		b = append(b, `,"connect":true`...)
	}
	return append(b, '}')
}

// appendMessagesJSON appends msgs as a JSON array; nil as null, like
// json.Marshal.
func appendMessagesJSON(b []byte, msgs []message.Message) []byte {
	if msgs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = msgs[i].AppendJSON(b); err != nil {
			panic("chat: encode frame: " + err.Error())
		}
	}
	return append(b, ']')
}

// encodeResponse returns f's JSON, what json.Marshal writes for it.
func encodeResponse(f wire.ChatResponseFrame) []byte {
	b := make([]byte, 0, 96+len(f.ID)+len(f.Body)+len(f.Body)/8)
	b = append(b, `{"type":`...)
	b = jsonenc.AppendString(b, f.Type)
	b = append(b, `,"id":`...)
	b = jsonenc.AppendString(b, f.ID)
	b = append(b, `,"body":`...)
	b = jsonenc.AppendString(b, f.Body)
	b = append(b, `,"done":`...)
	b = strconv.AppendBool(b, f.Done)
	if f.Error {
		b = append(b, `,"error":true`...)
	}
	if f.Continuation {
		b = append(b, `,"continuation":true`...)
	}
	if f.Replay {
		b = append(b, `,"replay":true`...)
	}
	if f.ReplayComplete {
		b = append(b, `,"replayComplete":true`...)
	}
	if f.Seq != nil {
		b = append(b, `,"seq":`...)
		b = strconv.AppendInt(b, int64(*f.Seq), 10)
	}
	if len(f.MessageIDs) > 0 {
		b = append(b, `,"messageIds":[`...)
		for i, id := range f.MessageIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonenc.AppendString(b, id)
		}
		b = append(b, ']')
	}
	if f.Outcome != "" {
		b = append(b, `,"outcome":`...)
		b = jsonenc.AppendString(b, f.Outcome)
	}
	return append(b, '}')
}
