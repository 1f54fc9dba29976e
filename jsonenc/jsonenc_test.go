package jsonenc

import (
	"bytes"
	"encoding/json"
	"testing"
)

// FuzzAppendString checks AppendString against json.Marshal of a string.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "a<b>&c", "\x00\x1f\"\\\n\r\t\b\f", "\u2028\u2029", "\xff\xfe é 😀"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendString([]byte("x"), s); !bytes.Equal(got, append([]byte("x"), want...)) {
			t.Fatalf("AppendString(%q) = %s, json.Marshal = %s", s, got[1:], want)
		}
	})
}

// FuzzAppendRaw checks AppendRaw against json.Marshal of a
// json.RawMessage: the same bytes, or an error from both.
func FuzzAppendRaw(f *testing.F) {
	for _, s := range []string{"", "null", `{"a":1}`, `{ "a" : [1, 2] }`, `"<b>&"`, "\"\u2028\"", `{"a":`, "\"\xff\"", `[1,2,]`, "  7  "} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		want, werr := json.Marshal(json.RawMessage(raw))
		got, gerr := AppendRaw([]byte("x"), raw)
		if (werr != nil) != (gerr != nil) {
			t.Fatalf("AppendRaw(%q) error %v, json.Marshal error %v", raw, gerr, werr)
		}
		if werr == nil && !bytes.Equal(got, append([]byte("x"), want...)) {
			t.Fatalf("AppendRaw(%q) = %s, json.Marshal = %s", raw, got[1:], want)
		}
	})
}
