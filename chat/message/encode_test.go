package message

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"testing"
)

// referenceValue and referenceMarshalObject are the encoder before the
// reflection-free one: every value through json.Marshal. The fast encoder
// must write what json.Marshal wrote over the reference.
func referenceValue(f field) any {
	switch p := f.ptr.(type) {
	case *string:
		return *p
	case *Role:
		return *p
	case *json.RawMessage:
		return *p
	case **bool:
		return *p
	case **Approval:
		return *p
	case *[]Part:
		if *p == nil {
			return []Part{}
		}
		return *p
	}
	panic(fmt.Sprintf("unsupported field type %T", f.ptr))
}

func referenceMarshalObject(fields []field, required func(key string) bool, extra map[string]json.RawMessage) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	first := true
	put := func(key string, v []byte) {
		if !first {
			buf.WriteByte(',')
		}
		first = false
		k, _ := json.Marshal(key)
		buf.Write(k)
		buf.WriteByte(':')
		buf.Write(v)
	}
	for _, f := range fields {
		if f.isZero() && !required(f.key) {
			continue
		}
		v, err := json.Marshal(referenceValue(f))
		if err != nil {
			return nil, err
		}
		put(f.key, v)
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		put(k, extra[k])
	}
	buf.WriteByte('}')
	// What json.Marshal made of a MarshalJSON result: compacted, HTML-safe.
	return json.Marshal(json.RawMessage(buf.Bytes()))
}

// checkEncoding compares a value's MarshalJSON with the reference and
// with json.Marshal (which must have nothing left to compact or escape).
func checkEncoding(t *testing.T, what string, got []byte, err error, fields []field, required func(string) bool, extra map[string]json.RawMessage, v any) {
	t.Helper()
	want, werr := referenceMarshalObject(fields, required, extra)
	if (err != nil) != (werr != nil) {
		t.Fatalf("%s: error %v, reference error %v", what, err, werr)
	}
	if err != nil {
		return
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s:\n got %s\nwant %s", what, got, want)
	}
	if viaJSON, err := json.Marshal(v); err != nil || !bytes.Equal(viaJSON, got) {
		t.Fatalf("%s: json.Marshal %s (%v), MarshalJSON %s", what, viaJSON, err, got)
	}
}

// FuzzEncodeMatchesReference decodes arbitrary JSON as a chunk, a part, a
// message and an approval, and checks that each encodes as before.
func FuzzEncodeMatchesReference(f *testing.F) {
	flow, err := os.ReadFile("testdata/flow_c_chunks.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	for _, line := range bytes.Split(flow, []byte("\n")) {
		f.Add(line)
	}
	f.Add([]byte(`{"type":"text-delta","id":"t","delta":"a<b>&c \u2028","extra": { "x" : [1, 2] }}`))
	f.Add([]byte(`{"id":"m","role":"assistant","metadata":{"a":"<"},"parts":[{"type":"text","text":"hi","state":"done"},{"type":"tool-x","toolCallId":"c","state":"approval-requested","input":{},"approval":{"id":"a1","approved":true}}]}`))
	f.Add([]byte(`{"type":"tool-input-available","toolCallId":"c","toolName":"t","input":null,"providerExecuted":false,"dynamic":true}`))
	// Required members left empty, unknown members, a data chunk.
	f.Add([]byte(`{"type":"text-delta"}`))
	f.Add([]byte(`{"type":"tool-input-available"}`))
	f.Add([]byte(`{"type":"data-x","zz":{"b" : 1},"aa":"<"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c Chunk
		if json.Unmarshal(data, &c) == nil {
			got, err := c.MarshalJSON()
			checkEncoding(t, "chunk", got, err, c.fields(), c.required, c.extra, c)
		}
		var p Part
		if json.Unmarshal(data, &p) == nil {
			got, err := p.MarshalJSON()
			checkEncoding(t, "part", got, err, p.fields(), p.required, p.extra, p)
		}
		var m Message
		if json.Unmarshal(data, &m) == nil {
			got, err := m.MarshalJSON()
			checkEncoding(t, "message", got, err, m.fields(), func(key string) bool {
				return key == "id" || key == "role" || key == "parts"
			}, m.extra, m)
		}
		var a Approval
		if json.Unmarshal(data, &a) == nil {
			got, err := a.MarshalJSON()
			checkEncoding(t, "approval", got, err, a.fields(), func(key string) bool { return key == "id" }, a.extra, a)
		}
	})
}

// The fields' keys are written without escaping: each must be a plain
// ASCII name.
func TestFieldKeysArePlain(t *testing.T) {
	var c Chunk
	var p Part
	var m Message
	var a Approval
	for _, fs := range [][]field{c.fields(), p.fields(), m.fields(), a.fields()} {
		for _, f := range fs {
			k, _ := json.Marshal(f.key)
			if string(k) != `"`+f.key+`"` {
				t.Errorf("key %q needs escaping", f.key)
			}
		}
	}
}

// BenchmarkEncodeChunk compares the encoder with the reference (json.Marshal
// of each value, then of the whole) on a text delta and a finish chunk.
func BenchmarkEncodeChunk(b *testing.B) {
	for _, c := range []Chunk{
		TextDelta("okCBMX8vAmqQ", "abcde"),
		{Type: ChunkFinish, FinishReason: "stop", MessageMetadata: json.RawMessage(`{"finishReason":"stop","model":"scripted","usage":{"inputTokens":11,"outputTokens":25,"totalTokens":36}}`)},
	} {
		b.Run(c.Type+"/fast", func(b *testing.B) {
			for b.Loop() {
				if _, err := c.MarshalJSON(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.Type+"/reference", func(b *testing.B) {
			for b.Loop() {
				if _, err := referenceMarshalObject(c.fields(), c.required, c.extra); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
