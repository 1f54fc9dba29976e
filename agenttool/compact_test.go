package agenttool

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"reflect"
	"testing"
)

// mergeMetadata is the AI SDK's mergeObjects, as a client applies message
// metadata: objects merge field by field, anything else replaces.
func mergeMetadata(target, source any) any {
	t, tok := target.(map[string]any)
	s, sok := source.(map[string]any)
	if !tok || !sok {
		return source
	}
	out := maps.Clone(t)
	for k, v := range s {
		out[k] = mergeMetadata(out[k], v)
	}
	return out
}

// finalMetadata is the metadata a client ends with after chunks (a
// chunk's null metadata changes nothing).
func finalMetadata(t *testing.T, chunks []chunk) any {
	t.Helper()
	var md any = map[string]any{}
	for _, c := range chunks {
		var ch struct {
			MessageMetadata json.RawMessage `json:"messageMetadata"`
		}
		if err := json.Unmarshal([]byte(c.body), &ch); err != nil {
			t.Fatal(err)
		}
		if len(ch.MessageMetadata) == 0 {
			continue
		}
		var v any
		if err := json.Unmarshal(ch.MessageMetadata, &v); err != nil {
			t.Fatal(err)
		}
		if v != nil {
			md = mergeMetadata(md, v)
		}
	}
	return md
}

func TestCompactSupersededMetadata(t *testing.T) {
	usage := `{"type":"message-metadata","messageMetadata":{"usage":{"inputTokens":10,"outputTokens":2},"treeUsage":{"inputTokens":10}}}`
	for _, tc := range []struct {
		name   string
		bodies []string
		kept   int // chunks the replay keeps
	}{
		{"usage then a finish with all of it", []string{
			`{"type":"start"}`, usage, `{"type":"finish-step"}`,
			`{"type":"finish","messageMetadata":{"finishReason":"stop","usage":{"inputTokens":10,"outputTokens":2},"treeUsage":{"inputTokens":10}}}`,
		}, 3},
		{"a field the finish does not set stays", []string{
			`{"type":"message-metadata","messageMetadata":{"usage":{"inputTokens":10,"cachedTokens":4}}}`,
			`{"type":"finish","messageMetadata":{"usage":{"inputTokens":12}}}`,
		}, 2},
		{"a later non-object replaces an object", []string{
			usage,
			`{"type":"finish","messageMetadata":{"usage":null,"treeUsage":7}}`,
		}, 1},
		{"app metadata after the finish is kept", []string{
			usage,
			`{"type":"finish","messageMetadata":{"usage":{"inputTokens":10,"outputTokens":2},"treeUsage":{"inputTokens":10}}}`,
			`{"type":"message-metadata","messageMetadata":{"rating":"good"}}`,
		}, 2},
		{"usage twice, the later covering the earlier", []string{
			usage, `{"type":"text-delta","id":"t","delta":"x"}`,
			`{"type":"message-metadata","messageMetadata":{"usage":{"inputTokens":20,"outputTokens":4},"treeUsage":{"inputTokens":20}}}`,
		}, 2},
		{"no finish: the last usage stays", []string{usage}, 1},
		{"a finish without metadata covers nothing", []string{usage, `{"type":"finish"}`}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var chunks []chunk
			for i, b := range tc.bodies {
				chunks = append(chunks, chunk{seq: i, body: b})
			}
			got := compact(chunks)
			if len(got) != tc.kept {
				t.Errorf("kept %d chunks, want %d: %v", len(got), tc.kept, got)
			}
			if want, have := finalMetadata(t, chunks), finalMetadata(t, got); !reflect.DeepEqual(want, have) {
				t.Errorf("metadata after the replay %v, want %v (as live)", have, want)
			}
		})
	}
}

// TestCompactMetadataProperty checks, over random streams of metadata
// chunks, that a replay without the superseded ones ends with the metadata
// the live stream ends with.
func TestCompactMetadataProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	keys := []string{"a", "b", "c"}
	var value func(depth int) any
	value = func(depth int) any {
		switch n := r.IntN(5); {
		case n == 0:
			return nil
		case n == 1 || depth > 2:
			return r.IntN(3)
		default:
			obj := map[string]any{}
			for _, k := range keys {
				if r.IntN(2) == 0 {
					obj[k] = value(depth + 1)
				}
			}
			return obj
		}
	}
	for i := range 5000 {
		var chunks []chunk
		for j := range 1 + r.IntN(6) {
			typ := "message-metadata"
			switch r.IntN(4) {
			case 0:
				typ = "finish"
			case 1:
				chunks = append(chunks, chunk{seq: len(chunks), body: `{"type":"text-delta","id":"t","delta":"x"}`})
				continue
			}
			// Metadata is an object (or null), with any values inside.
			top := value(0)
			if _, ok := top.(map[string]any); !ok && top != nil {
				top = map[string]any{"a": top}
			}
			md, _ := json.Marshal(top)
			chunks = append(chunks, chunk{seq: j, body: `{"type":"` + typ + `","messageMetadata":` + string(md) + `}`})
		}
		got := compact(chunks)
		if want, have := finalMetadata(t, chunks), finalMetadata(t, got); !reflect.DeepEqual(want, have) {
			t.Fatalf("case %d: %v\nafter the replay %v, want %v", i, chunks, have, want)
		}
	}
}
