package message

import (
	"bytes"
	"encoding/json"
	"strings"
)

// parsePartialJSON returns the JSON value that the possibly truncated JSON
// text s starts, like the AI SDK's parsePartialJson: s itself when it is
// valid, else s repaired by closing what is open and dropping what is
// incomplete, else nil.
func parsePartialJSON(s string) json.RawMessage {
	if !json.Valid([]byte(s)) {
		s = repairJSON(s)
		if s == "" || !json.Valid([]byte(s)) {
			return nil
		}
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, []byte(s)); err != nil {
		return nil
	}
	return buf.Bytes()
}

// Scanner states of repairJSON.
const (
	expectValue      = iota // a value (top level, after ':' or after ',' in an array)
	expectArrayFirst        // a value or ']' right after '['
	expectObjFirst          // a key or '}' right after '{'
	expectKey               // a key after ',' in an object
	expectColon             // ':' after a key
	expectComma             // ',' or a closing bracket after a value
)

// repairJSON completes the truncated JSON text s: an unterminated string
// value is closed (dropping a partial escape), a partial literal or number
// at the end is completed or trimmed, an incomplete member or element is
// dropped, and open objects and arrays are closed. It returns "" when s is
// not a prefix of any JSON text or holds no value yet.
func repairJSON(s string) string {
	var stack []byte
	state := expectValue
	// safe is the length of the longest prefix of s that becomes valid
	// JSON once the open containers are closed. Every push and pop of the
	// stack moves safe, so the stack at EOF is the stack at safe.
	safe := -1
	closeAll := func(prefix string) string {
		var b strings.Builder
		b.WriteString(prefix)
		for i := len(stack) - 1; i >= 0; i-- {
			if stack[i] == '{' {
				b.WriteByte('}')
			} else {
				b.WriteByte(']')
			}
		}
		return b.String()
	}
	n := len(s)
	i := 0
	for i < n {
		c := s[i]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			i++
			continue
		}
		switch state {
		case expectValue, expectArrayFirst:
			switch {
			case c == ']' && state == expectArrayFirst:
				stack = stack[:len(stack)-1]
				i++
				safe, state = i, expectComma
			case c == '{':
				stack = append(stack, '{')
				i++
				safe, state = i, expectObjFirst
			case c == '[':
				stack = append(stack, '[')
				i++
				safe, state = i, expectArrayFirst
			case c == '"':
				end, cut, ok := scanString(s, i)
				if !ok {
					return closeAll(s[:cut] + `"`)
				}
				i = end
				safe, state = i, expectComma
			case c == '-' || (c >= '0' && c <= '9'):
				end := i
				for end < n && strings.IndexByte("0123456789+-.eE", s[end]) >= 0 {
					end++
				}
				if end == n {
					num := strings.TrimRight(s[i:], "+-.eE")
					if num == "" || num[len(num)-1] < '0' || num[len(num)-1] > '9' {
						return finish(safe, s, closeAll)
					}
					return closeAll(s[:i] + num)
				}
				i = end
				safe, state = i, expectComma
			case c == 't' || c == 'f' || c == 'n':
				lit := "null"
				if c == 't' {
					lit = "true"
				} else if c == 'f' {
					lit = "false"
				}
				rest := s[i:]
				switch {
				case strings.HasPrefix(rest, lit):
					i += len(lit)
					safe, state = i, expectComma
				case strings.HasPrefix(lit, rest):
					return closeAll(s[:i] + lit)
				default:
					return ""
				}
			default:
				return ""
			}
		case expectObjFirst, expectKey:
			switch {
			case c == '}' && state == expectObjFirst:
				stack = stack[:len(stack)-1]
				i++
				safe, state = i, expectComma
			case c == '"':
				end, _, ok := scanString(s, i)
				if !ok {
					return finish(safe, s, closeAll)
				}
				i = end
				state = expectColon
			default:
				return ""
			}
		case expectColon:
			if c != ':' {
				return ""
			}
			i++
			state = expectValue
		case expectComma:
			if len(stack) == 0 {
				return ""
			}
			top := stack[len(stack)-1]
			switch {
			case c == ',' && top == '{':
				state = expectKey
			case c == ',':
				state = expectValue
			case (c == '}' && top == '{') || (c == ']' && top == '['):
				stack = stack[:len(stack)-1]
				safe = i + 1
			default:
				return ""
			}
			i++
		}
	}
	return finish(safe, s, closeAll)
}

// finish truncates s at safe and closes the open containers, or returns ""
// when there is no safe prefix.
func finish(safe int, s string, closeAll func(string) string) string {
	if safe < 0 {
		return ""
	}
	return closeAll(s[:safe])
}

// scanString scans the JSON string that starts with the quote at s[start].
// It returns the index just past the closing quote and ok, or, when s ends
// inside the string, ok false and cut, the length of the prefix of s that
// holds only whole characters and escapes of the string.
func scanString(s string, start int) (end, cut int, ok bool) {
	n := len(s)
	j := start + 1
	for j < n {
		switch s[j] {
		case '\\':
			if j+1 >= n {
				return 0, j, false
			}
			if s[j+1] == 'u' {
				if j+6 > n {
					return 0, j, false
				}
				j += 6
				continue
			}
			j += 2
		case '"':
			return j + 1, 0, true
		default:
			j++
		}
	}
	return 0, n, false
}
