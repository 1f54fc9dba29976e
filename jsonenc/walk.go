package jsonenc

import (
	"encoding/json"
	"unicode/utf8"
)

// Members walks the JSON object data member by member: fn gets each key,
// unquoted as encoding/json unquotes it, and the bytes of its value
// (without the white space around it), in order, until it returns false.
// A key is a slice of data unless it had to be unquoted; fn must not keep
// it, nor the value, beyond data's life.
//
// Members checks the object's own syntax (braces, keys, colons, commas)
// but of each value only its extent, found by matching brackets and
// quotes: the caller validates data beforehand (json.Valid) or each value
// it uses. It reports false when data is not one JSON object (white space
// around it aside) or fn stopped the walk.
func Members(data []byte, fn func(key, value []byte) bool) bool {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return skipSpace(data, i+1) == len(data)
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return false
		}
		end := stringEnd(data, i)
		if end < 0 {
			return false
		}
		key, ok := unquoteKey(data[i:end])
		if !ok {
			return false
		}
		i = skipSpace(data, end)
		if i >= len(data) || data[i] != ':' {
			return false
		}
		i = skipSpace(data, i+1)
		vend := valueEnd(data, i)
		if vend < 0 || !fn(key, data[i:vend]) {
			return false
		}
		next, closed, sepOK := separator(data, vend, '}')
		if !sepOK || closed {
			return sepOK
		}
		i = next
	}
}

// separator reads what follows a member or element ending at i: a comma
// (next is where the next one starts), or closer ending data (end, ok when
// nothing but white space follows it). ok is false for anything else.
func separator(data []byte, i int, closer byte) (next int, end, ok bool) {
	i = skipSpace(data, i)
	switch {
	case i >= len(data):
		return 0, false, false
	case data[i] == ',':
		return skipSpace(data, i+1), false, true
	case data[i] == closer:
		return 0, true, skipSpace(data, i+1) == len(data)
	}
	return 0, false, false
}

// Elements walks the JSON array data element by element: fn gets the
// bytes of each element (without the white space around it), in order,
// until it returns false. Like Members, it checks the array's own syntax
// and of each element only its extent. It reports false when data is not
// one JSON array (white space around it aside) or fn stopped the walk.
func Elements(data []byte, fn func(value []byte) bool) bool {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '[' {
		return false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == ']' {
		return skipSpace(data, i+1) == len(data)
	}
	for {
		vend := valueEnd(data, i)
		if vend < 0 || !fn(data[i:vend]) {
			return false
		}
		next, closed, sepOK := separator(data, vend, ']')
		if !sepOK || closed {
			return sepOK
		}
		i = next
	}
}

// PlainString returns the contents of the JSON string v when they need no
// unquoting: no escape, no control character, valid UTF-8. Then they are
// what encoding/json decodes v to; otherwise ok is false and the caller
// decodes v with encoding/json.
func PlainString(v []byte) (s []byte, ok bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return nil, false
	}
	s = v[1 : len(v)-1]
	for _, c := range s {
		if c < 0x20 || c == '"' || c == '\\' {
			return nil, false
		}
	}
	return s, utf8.Valid(s)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(data []byte, i int) int {
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	return i
}

// stringEnd returns the index after the closing quote of the string that
// starts at data[i], or -1 when it does not close or holds a control
// character.
func stringEnd(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return j + 1
		case c == '\\':
			j++
		case c < 0x20:
			return -1
		}
	}
	return -1
}

// valueEnd returns the index after the value that starts at data[i]: a
// string, an object or array (to its matching bracket), or a literal or
// number (to the next delimiter); -1 when there is none.
func valueEnd(data []byte, i int) int {
	if i >= len(data) {
		return -1
	}
	switch data[i] {
	case '"':
		return stringEnd(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				end := stringEnd(data, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	case ',', ':', '}', ']':
		return -1
	}
	j := i
	for j < len(data) && !isSpace(data[j]) && data[j] != ',' && data[j] != '}' && data[j] != ']' && data[j] != ':' {
		j++
	}
	return j
}

// unquoteKey returns the key of the quoted JSON string q: its contents
// when they need no unquoting, else what encoding/json decodes q to (ok
// false when it is no valid string).
func unquoteKey(q []byte) ([]byte, bool) {
	if s, ok := PlainString(q); ok {
		return s, true
	}
	var s string
	if json.Unmarshal(q, &s) != nil {
		return nil, false
	}
	return []byte(s), true
}
