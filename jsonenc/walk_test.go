package jsonenc

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"testing"
)

// FuzzWalk checks Members and Elements against encoding/json on valid
// JSON: an object's members, the last of a repeated key winning, are the
// map json.Unmarshal decodes (values byte for byte), an array's elements
// the []json.RawMessage it decodes, and neither accepts what is not an
// object or an array. On any input neither panics.
func FuzzWalk(f *testing.F) {
	for _, s := range []string{
		`{}`, ` { } `, `[]`, `[ ]`, `{"a":1}`, `{"a" : { "b" : [1, "x]"] } , "c":null }`,
		`{"a\u0062":"c\"d","a":1,"a":true}`, `{"\ud800":1,"\u00e9":2}`, `[1, "x", {"y":[]}, null, -0.5e3]`,
		"{\"\xff\":1}", `"str"`, `null`, `12`, `{"a":1,}`, `{"a" 1}`, `[1 2]`, `{"a":[}`, `{"a":"b\`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got := map[string][]byte{}
		isObject := Members(data, func(key, value []byte) bool {
			got[string(key)] = bytes.Clone(value)
			return true
		})
		var elems [][]byte
		isArray := Elements(data, func(value []byte) bool {
			elems = append(elems, bytes.Clone(value))
			return true
		})
		if !json.Valid(data) {
			return
		}
		var m map[string]json.RawMessage
		wantObject := json.Unmarshal(data, &m) == nil && m != nil
		if isObject != wantObject {
			t.Fatalf("Members(%q) = %v, want %v", data, isObject, wantObject)
		}
		if wantObject {
			if !maps.EqualFunc(got, m, func(a []byte, b json.RawMessage) bool { return bytes.Equal(a, b) }) {
				t.Fatalf("Members(%q) = %q, want %q", data, got, m)
			}
		}
		var a []json.RawMessage
		wantArray := json.Unmarshal(data, &a) == nil && a != nil
		if isArray != wantArray {
			t.Fatalf("Elements(%q) = %v, want %v", data, isArray, wantArray)
		}
		if wantArray && !slices.EqualFunc(elems, a, func(x []byte, y json.RawMessage) bool { return bytes.Equal(x, y) }) {
			t.Fatalf("Elements(%q) = %q, want %q", data, elems, a)
		}
	})
}

// FuzzPlainString: a string PlainString accepts decodes with encoding/json
// to its contents.
func FuzzPlainString(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\"b"`, `"é"`, "\"\xff\"", `"`, `""`, `"a"b"`, "\"\x01\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, ok := PlainString(data)
		if !ok {
			return
		}
		var want string
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatalf("PlainString(%q) accepted what encoding/json refuses: %v", data, err)
		}
		if string(s) != want {
			t.Fatalf("PlainString(%q) = %q, want %q", data, s, want)
		}
	})
}

// TestMembersStops: fn returning false ends the walk, and Members reports
// false.
func TestMembersStops(t *testing.T) {
	var keys []string
	ok := Members([]byte(`{"a":1,"b":2,"c":3}`), func(key, _ []byte) bool {
		keys = append(keys, string(key))
		return string(key) != "b"
	})
	if ok || !slices.Equal(keys, []string{"a", "b"}) {
		t.Fatalf("Members = %v after %q, want false after a, b", ok, keys)
	}
	n := 0
	if Elements([]byte(`[1,2,3]`), func([]byte) bool { n++; return n < 2 }) || n != 2 {
		t.Fatalf("Elements went on after false (%d elements)", n)
	}
}
