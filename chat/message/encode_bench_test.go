package message

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// researchTranscript is the transcript of a demo Assistant after turns
// research turns: each a user message and an answer with a research tool
// call (its input and the Researcher's summary as output) and a text.
func researchTranscript(turns int) []Message {
	var msgs []Message
	for i := range turns {
		summary := strings.Repeat("Findings on topic "+fmt.Sprint(i)+": an overview, in practice. ", 6)
		out, _ := json.Marshal(map[string]any{"status": "completed", "summary": summary, "runId": fmt.Sprintf("agent-tool:call_%03d", i)})
		msgs = append(msgs,
			Message{ID: fmt.Sprintf("user-%03d", i), Role: RoleUser, Parts: []Part{{Type: PartText, Text: fmt.Sprintf("research topic %d of user 7", i)}}},
			Message{ID: fmt.Sprintf("asst-%03d", i), Role: RoleAssistant, Metadata: json.RawMessage(`{"finishReason":"stop"}`), Parts: []Part{
				{Type: PartStepStart},
				{Type: "tool-research", ToolCallID: fmt.Sprintf("call_%03d", i), State: StateOutputAvailable,
					Input: json.RawMessage(fmt.Sprintf(`{"query":"topic %d of user 7"}`, i)), Output: out},
				{Type: PartStepStart},
				{Type: PartText, Text: "Here is what the Researcher found. " + summary, State: StateDone},
			}})
	}
	return msgs
}

// BenchmarkEncodeMessage measures the encoding of one research answer
// (MarshalJSON, as a stored row) and of a transcript of 8 turns in a frame
// (json.Marshal of a struct holding the messages, as a transcript
// broadcast).
func BenchmarkEncodeMessage(b *testing.B) {
	msgs := researchTranscript(8)
	b.Run("answer", func(b *testing.B) {
		m := msgs[1]
		b.ReportAllocs()
		for b.Loop() {
			if _, err := m.MarshalJSON(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("transcript=8", func(b *testing.B) {
		frame := struct {
			Type     string    `json:"type"`
			Messages []Message `json:"messages"`
		}{"cf_agent_chat_messages", msgs}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(frame); err != nil {
				b.Fatal(err)
			}
		}
	})
}
