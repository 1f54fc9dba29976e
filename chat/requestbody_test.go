package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/agentry/agentry/chat/message"
)

// researchBody is the body of a chat request of the demo's Assistant after
// turns research turns, as the AI SDK sends it.
func researchBody(turns int) []byte {
	var msgs []message.Message
	for i := range turns {
		summary := strings.Repeat(fmt.Sprintf("Findings on topic %d: an overview, in practice. ", i), 6)
		out, _ := json.Marshal(map[string]any{"status": "completed", "summary": summary, "runId": fmt.Sprintf("agent-tool:call_%03d", i)})
		msgs = append(msgs,
			message.Message{ID: fmt.Sprintf("user-%03d", i), Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: fmt.Sprintf("research topic %d of user 7", i)}}},
			message.Message{ID: fmt.Sprintf("asst-%03d", i), Role: message.RoleAssistant, Metadata: json.RawMessage(`{"finishReason":"stop"}`), Parts: []message.Part{
				{Type: message.PartStepStart},
				{Type: "tool-research", ToolCallID: fmt.Sprintf("call_%03d", i), State: message.StateOutputAvailable,
					Input: json.RawMessage(fmt.Sprintf(`{"query":"topic %d of user 7"}`, i)), Output: out},
				{Type: message.PartStepStart},
				{Type: message.PartText, Text: "Here is what the Researcher found.\n" + summary, State: message.StateDone},
			}})
	}
	msgs = append(msgs, message.Message{ID: "user-next", Role: message.RoleUser, Parts: []message.Part{{Type: message.PartText, Text: "research more"}}})
	body, err := json.Marshal(map[string]any{"id": "chat-1", "messages": msgs, "trigger": "submit-message", "messageId": nil})
	if err != nil {
		panic(err)
	}
	return body
}

// FuzzDecodeRequestBody: a chat request body decodes (messages, trigger,
// extra members, errors) as encoding/json decoded it before the one-walk
// path.
func FuzzDecodeRequestBody(f *testing.F) {
	f.Add(researchBody(2))
	for _, s := range []string{
		`{"messages":[{"id":"u","role":"user","parts":[{"type":"text","text":"hi"}]}],"trigger":"submit-message","id":"x"}`,
		`{"messages":[],"zz":{ "a" : [1, 2] },"aa":"<&>","trigger":null}`,
		`{"messages":null}`, `{"trigger":"x"}`, `{}`, `null`, `[]`, `{"messages":{}}`, `{"messages":[5]}`,
		`{"Messages":[],"messages":[]}`, `{"messages":[],"TRIGGER":"regenerate-message"}`, `{"messages":[],"trigger":"a","trigger":"b"}`,
		`{"messages":[],"messages":[{"id":"x"}]}`, `{"messages":[],"trigger":5}`, `{"messages":[],"tr\u0069gger":"regenerate-message"}`,
		"{\"messages\":[],\"\xff\":1,\"\xfe\":2}", `{"messages":[],"x":1,"x":2}`, ` {"messages" : [ ] , "a" : 1 } `, `{"messages":[],"a":[}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeRequestBody(data)
		want, werr := decodeRequestBodySlow(data)
		if (err == nil) != (werr == nil) || err != nil && err.Error() != werr.Error() {
			t.Fatalf("%q: error %v, want %v", data, err, werr)
		}
		if err != nil {
			return
		}
		if !reflect.DeepEqual(got.messages, want.messages) || got.trigger != want.trigger || !bytes.Equal(got.extra, want.extra) {
			t.Fatalf("%q:\n got %#v %q %s\nwant %#v %q %s", data, got.messages, got.trigger, got.extra, want.messages, want.trigger, want.extra)
		}
	})
}

// TestDecodeRequestBodyFast: the request bodies a chat client sends take
// the one-walk path.
func TestDecodeRequestBodyFast(t *testing.T) {
	for _, body := range [][]byte{researchBody(0), researchBody(8),
		[]byte(`{"id":"c","messages":[{"id":"u","role":"user","parts":[{"type":"text","text":"a \"quoted\"\nline"}]}],"trigger":"regenerate-message","messageId":"m"}`)} {
		b, ok := decodeRequestBodyFast(body)
		if !ok || b.messages == nil || b.trigger == "" || b.extra == nil {
			t.Errorf("%.80s…: fast path %v, decoded %d messages, trigger %q, extra %s", body, ok, len(b.messages), b.trigger, b.extra)
		}
	}
}

// BenchmarkDecodeRequestBody decodes the body of a chat request after 8
// research turns: decodeRequestBody, and encoding/json as before
// (decodeRequestBodySlow).
func BenchmarkDecodeRequestBody(b *testing.B) {
	body := researchBody(8)
	for _, c := range []struct {
		name   string
		decode func([]byte) (requestBody, error)
	}{{"walk", decodeRequestBody}, {"encoding-json", decodeRequestBodySlow}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.decode(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
