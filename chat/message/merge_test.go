package message

import (
	"bytes"
	"encoding/json"
	"testing"
)

// refMergeJSON is mergeJSON as it was written on maps of members: decode
// both sides, merge, json.Marshal.
func refMergeJSON(base, over json.RawMessage) json.RawMessage {
	if isNull(over) {
		return base
	}
	if isNull(base) || !isObject(base) || !isObject(over) {
		return bytes.Clone(over)
	}
	var bm, om map[string]json.RawMessage
	if json.Unmarshal(base, &bm) != nil || json.Unmarshal(over, &om) != nil {
		return bytes.Clone(over)
	}
	for k, ov := range om {
		if bv, ok := bm[k]; ok && isObject(bv) && isObject(ov) {
			bm[k] = refMergeJSON(bv, ov)
			continue
		}
		bm[k] = ov
	}
	out, err := json.Marshal(bm)
	if err != nil {
		return bytes.Clone(over)
	}
	return out
}

// FuzzMergeJSONMatchesReference: mergeJSON writes byte for byte what the
// merge on maps wrote, for any two inputs (split at the first NUL byte),
// and its result shares no memory with over.
func FuzzMergeJSONMatchesReference(f *testing.F) {
	for _, s := range []string{
		`{"finishReason":"stop"}` + "\x00" + `{"usage":{"inputTokens":3}}`,
		`{"a":{"x":1,"y":[1, 2]},"b":"<&>"}` + "\x00" + `{ "a" : { "y" : null , "z" : { } } , "c" : 1 }`,
		`{"a":{"x":1}}` + "\x00" + `{"a":{"y":1},"a":{"z":1}}`,
		`{"a":1,"a":{"x":1}}` + "\x00" + `{"a":{"y":2}}`,
		`null` + "\x00" + `{"a":1}`, `{"a":1}` + "\x00" + `null`, `{"a":1}` + "\x00", `[1]` + "\x00" + `{"a":1}`,
		`{"a":1}` + "\x00" + `{"a":`, `{"\u00e9":1,"\ud800":2}` + "\x00" + `{"é":3}`, "{\"\xff\":1}\x00{\"\xfe\":2}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		base, over, _ := bytes.Cut(data, []byte{0})
		got := mergeJSON(json.RawMessage(base), json.RawMessage(over))
		want := refMergeJSON(json.RawMessage(base), json.RawMessage(over))
		if !bytes.Equal(got, want) {
			t.Fatalf("mergeJSON(%q, %q) = %q, want %q", base, over, got, want)
		}
		if len(got) > 0 && len(over) > 0 && &got[0] == &over[0] {
			t.Fatalf("mergeJSON(%q, %q) returned over itself", base, over)
		}
	})
}

// BenchmarkMergeJSON merges a finish chunk's usage metadata into a
// message's metadata, as a turn's end does.
func BenchmarkMergeJSON(b *testing.B) {
	base := json.RawMessage(`{"createdAt":1764780000000,"model":"scripted","usage":{"inputTokens":120,"outputTokens":48}}`)
	over := json.RawMessage(`{"finishReason":"stop","usage":{"outputTokens":52,"totalTokens":172},"treeUsage":{"inputTokens":480,"outputTokens":210}}`)
	for _, c := range []struct {
		name  string
		merge func(base, over json.RawMessage) json.RawMessage
	}{{"members", mergeJSON}, {"maps", refMergeJSON}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.merge(base, over)
			}
		})
	}
}
