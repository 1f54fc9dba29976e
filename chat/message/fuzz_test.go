package message

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// maxFuzzChunks bounds the chunks of one fuzz input: the target checks the
// whole message after every chunk, so its cost grows with the square of
// the count.
const maxFuzzChunks = 200

// fuzzChunks turns fuzz input into at most maxFuzzChunks chunks. Input
// that starts with '{' is read as JSON lines (undecodable lines are
// skipped); anything else as 3-byte ops: chunk type, id, argument.
func fuzzChunks(data []byte) []Chunk {
	var out []Chunk
	if len(data) > 0 && data[0] == '{' {
		for line := range bytes.SplitSeq(data, []byte("\n")) {
			var c Chunk
			if json.Unmarshal(line, &c) == nil {
				out = append(out, c)
			}
			if len(out) == maxFuzzChunks {
				break
			}
		}
		return out
	}
	fuzzIDs := [...]string{"a", "b", "c"}
	fuzzFragments := [...]string{``, `{"x":`, `1`, `"s`, `}`, `[`, `tr`, `,`, `"é\`, `]`, `"k":null`, `{`, `-`, `.5`, `\u00`, `x`}
	fuzzValues := [...]json.RawMessage{nil, json.RawMessage(`{}`), json.RawMessage(`{"a":{"b":1}}`), json.RawMessage(`null`), json.RawMessage(`[1,"x"]`), json.RawMessage(`"str"`), json.RawMessage(`{`)}
	yes, no := true, false
	fuzzBools := [...]*bool{nil, &no, &yes}
	for i := 0; i+2 < len(data) && len(out) < maxFuzzChunks; i += 3 {
		op, id, arg := data[i], fuzzIDs[int(data[i+1])%len(fuzzIDs)], int(data[i+2])
		frag := fuzzFragments[arg%len(fuzzFragments)]
		val := fuzzValues[arg%len(fuzzValues)]
		flag := fuzzBools[arg%len(fuzzBools)]
		var c Chunk
		switch op % 26 {
		case 0:
			c = Start(id)
			c.MessageMetadata = val
		case 1:
			c = Chunk{Type: ChunkFinish, FinishReason: frag, MessageMetadata: val}
		case 2:
			c = MessageMetadata(val)
		case 3:
			c = StartStep()
		case 4:
			c = FinishStep()
		case 5:
			c = TextStart(id)
		case 6:
			c = TextDelta(id, frag)
		case 7:
			c = TextEnd(id)
		case 8:
			c = ReasoningStart(id)
		case 9:
			c = ReasoningDelta(id, frag)
		case 10:
			c = ReasoningEnd(id)
		case 11:
			c = ToolInputStart(id, frag)
			c.Dynamic, c.ProviderExecuted = flag, flag
		case 12:
			c = ToolInputDelta(id, frag)
		case 13:
			c = ToolInputAvailable(id, "t", val)
			c.Dynamic = flag
		case 14:
			c = ToolInputError(id, "t", val, frag)
			c.Dynamic = flag
		case 15:
			c = ToolApprovalRequest(frag, id)
		case 16:
			c = ToolOutputAvailable(id, val)
			c.Preliminary = flag
		case 17:
			c = ToolOutputError(id, frag)
		case 18:
			c = ToolOutputDenied(id)
		case 19:
			c = Data(id, fuzzIDs[arg%len(fuzzIDs)], val, arg%2 == 0)
		case 20:
			c = Chunk{Type: ChunkSourceURL, SourceID: id, URL: frag}
		case 21:
			c = Chunk{Type: ChunkFile, URL: frag, MediaType: "text/plain"}
		case 22:
			c = Error(frag)
		case 23:
			c = Abort(frag)
		case 24:
			c = Chunk{Type: frag}
		case 25:
			c = Chunk{Type: ChunkSourceDocument, SourceID: id, Title: frag}
		}
		out = append(out, c)
	}
	return out
}

func FuzzBuilder(f *testing.F) {
	flow, err := os.ReadFile("testdata/flow_c_chunks.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(flow)
	f.Add([]byte{3, 0, 0, 11, 0, 1, 12, 0, 1, 12, 0, 4, 13, 0, 2, 16, 0, 1, 5, 1, 0, 6, 1, 3, 7, 1, 0, 4, 0, 0, 1, 0, 0})
	f.Add([]byte{6, 0, 0, 12, 1, 0, 17, 2, 0, 15, 0, 0, 19, 0, 1, 19, 0, 1, 19, 0, 2})
	f.Add([]byte{13, 0, 2, 15, 0, 0, 18, 0, 0, 14, 1, 1, 3, 0, 0, 16, 0, 3, 8, 0, 0, 9, 0, 5, 10, 0, 0})
	f.Add([]byte("{\"type\":\"tool-input-start\",\"toolCallId\":\"x\",\"toolName\":\"t\"}\n{\"type\":\"tool-input-delta\",\"toolCallId\":\"x\",\"inputTextDelta\":\"{\\\"a\\\":[1,\"}"))

	f.Fuzz(func(t *testing.T, data []byte) {
		b := NewBuilder("m")
		for _, c := range fuzzChunks(data) {
			before, err := json.Marshal(b.Message())
			if err != nil {
				t.Fatalf("marshal message: %v", err)
			}
			if err := b.Apply(c); err != nil {
				var se *StreamError
				if !errors.As(err, &se) {
					t.Fatalf("Apply(%+v) = %v, not a *StreamError", c, err)
				}
				after, _ := json.Marshal(b.Message())
				if !bytes.Equal(before, after) {
					t.Fatalf("failed Apply(%+v) changed the message\nbefore: %s\n after: %s", c, before, after)
				}
			}
		}

		// The message encodes, and decoding it gives the same encoding.
		m := b.Message()
		enc, err := json.Marshal(m)
		if err != nil {
			t.Fatalf("marshal message: %v", err)
		}
		var back Message
		if err := json.Unmarshal(enc, &back); err != nil {
			t.Fatalf("unmarshal %s: %v", enc, err)
		}
		if enc2, err := json.Marshal(back); err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip changed the message (%v)\nfirst:  %s\nsecond: %s", err, enc, enc2)
		}

		_, conv := ToModel([]Message{m})
		for _, mm := range conv {
			for _, c := range mm.Content {
				if len(c.Input) > 0 && !json.Valid(c.Input) {
					t.Fatalf("invalid tool call input %q", c.Input)
				}
				if len(c.Output) > 0 && !json.Valid(c.Output) {
					t.Fatalf("invalid tool result output %q", c.Output)
				}
			}
		}

		b.Finalize()
		for _, p := range b.Message().Parts {
			if (p.Type == PartText || p.Type == PartReasoning) && p.State == StateStreaming {
				t.Fatalf("part still streaming after Finalize: %+v", p)
			}
			if p.IsTool() && strings.TrimSpace(p.State) == "" {
				t.Fatalf("tool part without state: %+v", p)
			}
		}
	})
}
