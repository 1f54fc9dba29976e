// Package jsonenc appends JSON values to byte slices without reflection,
// byte for byte as encoding/json writes them, for the hot paths that
// encode a frame or a chunk per streamed token.
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
// inside its strings. Raw JSON that is compact and holds none of the
// characters escaping changes is appended as it is, after validation.
func AppendRaw(b []byte, raw json.RawMessage) ([]byte, error) {
	if raw == nil {
		return append(b, "null"...), nil
	}
	plain := len(raw) > 0
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r', '<', '>', '&', 0xE2: // 0xE2 starts U+2028 and U+2029
			plain = false
		}
		if !plain {
			break
		}
	}
	if plain && json.Valid(raw) {
		return append(b, raw...), nil
	}
	v, err := json.Marshal(raw)
	if err != nil {
		return b, err
	}
	return append(b, v...), nil
}
