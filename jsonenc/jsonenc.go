// Package jsonenc appends JSON values to byte slices without reflection,
// byte for byte as encoding/json writes them, for the hot paths that
// encode a frame or a chunk per streamed token; and walks the members of
// an object and the elements of an array without decoding them (Members,
// Elements), for the decoders that would otherwise validate the same
// bytes once per level of nesting.
package jsonenc

import (
	"encoding/json"
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string with encoding/json's
// escaping: HTML-safe (<, >, & as \u003c …), U+2028 and U+2029 escaped,
// invalid UTF-8 replaced by U+FFFD.
func AppendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// AppendRaw appends raw as encoding/json writes a json.RawMessage: null
// when nil, otherwise validated and compacted, with HTML-safe escaping
// (<, >, & and U+2028, U+2029 as \u escapes), in one pass into b without a
// buffer of its own (compact raw JSON with none of those characters is
// appended in one piece).
func AppendRaw(b []byte, raw json.RawMessage) ([]byte, error) {
	if raw == nil {
		return append(b, "null"...), nil
	}
	if !json.Valid(raw) {
		// The error json.Marshal reports for it.
		v, err := json.Marshal(raw)
		if err != nil {
			return b, err
		}
		return append(b, v...), nil
	}
	return appendCompactSafe(b, raw), nil
}

// appendCompactSafe appends valid JSON raw without the spaces outside its
// strings and with <, >, &, U+2028 and U+2029 escaped: what
// encoding/json's compaction with HTML escaping writes.
func appendCompactSafe(b, raw []byte) []byte {
	inString, escaped := false, false
	start := 0
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '<' || c == '>' || c == '&':
			b = append(b, raw[start:i]...)
			b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			start = i + 1
		case c == 0xE2 && i+2 < len(raw) && raw[i+1] == 0x80 && raw[i+2]&^1 == 0xA8:
			b = append(b, raw[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[raw[i+2]&0xF])
			i += 2
			start = i + 1
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			b = append(b, raw[start:i]...)
			start = i + 1
		}
	}
	return append(b, raw[start:]...)
}
