package jsonenc

import "testing"

// BenchmarkAppendRaw appends raw JSON of the kinds a chat stores and
// sends: a compact object with spaces in its strings (a tool's output), a
// compact object with an ampersand (escaped), and an indented object
// (compacted).
func BenchmarkAppendRaw(b *testing.B) {
	for _, c := range []struct{ name, raw string }{
		{"compact", `{"status":"completed","summary":"Findings on topic 3: an overview, in practice. How teams use it today.","runId":"agent-tool:call_003"}`},
		{"html", `{"status":"completed","summary":"Findings on R&D: an overview, in practice.","runId":"agent-tool:call_003"}`},
		{"indented", "{\n  \"status\": \"completed\",\n  \"summary\": \"Findings on topic 3: an overview.\",\n  \"runId\": \"agent-tool:call_003\"\n}"},
	} {
		b.Run(c.name, func(b *testing.B) {
			raw := []byte(c.raw)
			buf := make([]byte, 0, 256)
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if buf, err = AppendRaw(buf[:0], raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
