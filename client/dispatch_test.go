package client

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/agentry/agentry/jsonenc"
)

// FuzzLeadingType: the type leadingType reads without decoding the frame
// is the one encoding/json reads, whenever it reads one.
func FuzzLeadingType(f *testing.F) {
	for _, s := range []string{
		`{"type":"cf_agent_chat_response","id":"r1","body":"{}","done":false}`,
		`{"type":"agent-tool-event","sequence":3,"event":{"kind":"chunk"}}`,
		`{"type":"cf_agent_identity","name":"a","agent":"assistant"}`,
		`{"type":"a\"b","x":1}`,
		`{"type":"a\u0062"}`,
		`{ "type":"spaced"}`,
		`{"type":"unterminated`,
		`{"type":"x"} trailing`,
		`[1]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		typ, ok := leadingType(data)
		if !ok {
			return
		}
		var h struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(data, &h); err != nil {
			return // a frame the handlers refuse in their own decoding
		}
		// A second "type" member (in any case: encoding/json matches keys
		// so) wins in encoding/json; leadingType reads the first, and the
		// server never writes two.
		types := 0
		jsonenc.Members(data, func(key, _ []byte) bool {
			if bytes.EqualFold(key, []byte("type")) {
				types++
			}
			return true
		})
		if types > 1 {
			return
		}
		if typ != h.Type {
			t.Fatalf("leadingType(%q) = %q, encoding/json reads %q", data, typ, h.Type)
		}
	})
}

// TestLeadingType: the frames of the server are read by their prefix;
// any other shape is left to the full decoding.
func TestLeadingType(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
		ok   bool
	}{
		{`{"type":"cf_agent_chat_response","id":"r1"}`, "cf_agent_chat_response", true},
		{`{"type":"agent-tool-event"}`, "agent-tool-event", true},
		{`{"type":"a\"b"}`, "", false},
		{`{ "type":"spaced"}`, "", false},
		{`{"id":"x","type":"late"}`, "", false},
		{`{"type":"unterminated`, "", false},
	} {
		got, ok := leadingType([]byte(c.in))
		if got != c.want || ok != c.ok {
			t.Errorf("leadingType(%s) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	if !headDecoded("cf_agent_identity") || !headDecoded("cf_agent_state") || headDecoded("cf_agent_chat_response") {
		t.Error("headDecoded: identity and state frames need their members decoded, stream frames do not")
	}
}

// BenchmarkFrameHead: what dispatch spends to learn a stream frame's type,
// by its prefix (leadingType) and by decoding it (json.Unmarshal into head,
// what it did before for every frame).
func BenchmarkFrameHead(b *testing.B) {
	frame := []byte(`{"type":"agent-tool-event","parentToolCallId":"call_1","sequence":42,"event":{"kind":"chunk","runId":"agent-tool:call_1","body":"{\"type\":\"text-delta\",\"id\":\"t1\",\"delta\":\"Wave energy converts the motion of ocean surface waves \"}"}}`)
	b.Run("prefix", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if typ, ok := leadingType(frame); !ok || headDecoded(typ) {
				b.Fatal(typ)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var h head
			if err := json.Unmarshal(frame, &h); err != nil {
				b.Fatal(err)
			}
		}
	})
}
