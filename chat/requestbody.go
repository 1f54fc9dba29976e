package chat

import (
	"bytes"
	"encoding/json"
	"slices"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/jsonenc"
)

// requestBody is the decoded body of a chat request (the AI SDK's
// transport body).
type requestBody struct {
	messages []message.Message
	trigger  string
	// extra holds the members other than messages (trigger included), as
	// json.Marshal writes a map of them; nil when there are none.
	extra json.RawMessage
}

// decodeRequestBody decodes a chat request's body. A body of plain shape
// (an object whose keys are spelt as the fields' and not repeated) is
// walked once, its transcript validated once; anything else is decoded
// the slow way (decodeRequestBodySlow, which the result and errors equal).
func decodeRequestBody(data []byte) (requestBody, error) {
	if b, ok := decodeRequestBodyFast(data); ok {
		return b, nil
	}
	return decodeRequestBodySlow(data)
}

// decodeRequestBodySlow decodes the body with encoding/json: into a
// struct, as a map for the extra members.
func decodeRequestBodySlow(data []byte) (requestBody, error) {
	var body struct {
		Messages []message.Message `json:"messages"`
		Trigger  string            `json:"trigger"`
	}
	if err := json.Unmarshal(data, &body); err != nil {
		return requestBody{}, err
	}
	b := requestBody{messages: body.Messages, trigger: body.Trigger}
	var extra map[string]json.RawMessage
	_ = json.Unmarshal(data, &extra)
	delete(extra, "messages")
	if len(extra) > 0 {
		b.extra, _ = json.Marshal(extra)
	}
	return b, nil
}

// bodyMember is a member of a request body other than its messages.
type bodyMember struct{ key, value []byte }

// decodeRequestBodyFast decodes a body of plain shape as
// decodeRequestBodySlow does, reporting false for any other.
func decodeRequestBodyFast(data []byte) (b requestBody, ok bool) {
	var others []bodyMember
	seen := false
	ok = jsonenc.Members(data, func(key, v []byte) bool {
		if string(key) == "messages" {
			if seen {
				return false
			}
			seen = true
			msgs, err := message.DecodeMessages(v)
			b.messages = msgs
			return err == nil
		}
		// encoding/json matches a struct field's name folding case.
		if bytes.EqualFold(key, []byte("messages")) || (bytes.EqualFold(key, []byte("trigger")) && string(key) != "trigger") {
			return false
		}
		if !json.Valid(v) {
			return false
		}
		if string(key) == "trigger" {
			if s, ok := jsonenc.PlainString(v); ok {
				b.trigger = string(s)
			} else if json.Unmarshal(v, &b.trigger) != nil {
				return false
			}
		}
		others = append(others, bodyMember{key, v})
		return true
	})
	if !ok {
		return requestBody{}, false
	}
	if len(others) == 0 {
		return b, true
	}
	slices.SortFunc(others, func(x, y bodyMember) int { return bytes.Compare(x.key, y.key) })
	n := 2
	for i, m := range others {
		if i > 0 && bytes.Equal(m.key, others[i-1].key) {
			return requestBody{}, false // a repeated key (the trigger's too): its last value wins
		}
		n += len(m.key) + len(m.value) + 4
	}
	out := make([]byte, 0, n)
	out = append(out, '{')
	for i, m := range others {
		if i > 0 {
			out = append(out, ',')
		}
		out = jsonenc.AppendString(out, string(m.key))
		out = append(out, ':')
		var err error
		if out, err = jsonenc.AppendRaw(out, m.value); err != nil {
			return requestBody{}, false
		}
	}
	b.extra = append(out, '}')
	return b, true
}
