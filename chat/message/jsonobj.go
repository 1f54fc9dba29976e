package message

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/agentry/agentry/jsonenc"
)

// field binds a JSON object key to a pointer to the Go field that holds
// it. The pointer is one of *string, *Role, *json.RawMessage, **bool,
// **Approval or *[]Part.
type field struct {
	key string
	ptr any
}

// isZero reports whether the field holds its zero value, which is left out
// of the encoding unless the key is required.
func (f field) isZero() bool {
	switch p := f.ptr.(type) {
	case *string:
		return *p == ""
	case *Role:
		return *p == ""
	case *json.RawMessage:
		return len(*p) == 0
	case **bool:
		return *p == nil
	case **Approval:
		return *p == nil
	case *[]Part:
		return *p == nil
	}
	panic(fmt.Sprintf("message: unsupported field type %T", f.ptr))
}

// unmarshalObject decodes a JSON object into the fields of a type (fields,
// and fieldPtr, which finds one by key), matching keys exactly (unlike
// encoding/json, which folds case). Members with no matching field are
// returned as extra; extra is nil when there are none.
//
// Valid data is decoded in one walk (decodeObject), its nested parts and
// approval included, instead of being validated again by encoding/json at
// every level; anything that walk does not decode as encoding/json would
// (an error to report, a value of an unexpected kind) is decoded the slow
// way from the start, so the result, errors included, is the same.
func unmarshalObject(data []byte, fieldPtr func(key []byte) any, fields func() []field) (extra map[string]json.RawMessage, err error) {
	if json.Valid(data) {
		if extra, ok := decodeObject(data, fieldPtr); ok {
			return extra, nil
		}
		zeroFields(fields())
	}
	return unmarshalObjectSlow(data, fields())
}

// unmarshalObjectSlow is unmarshalObject with encoding/json doing all the
// work.
func unmarshalObjectSlow(data []byte, fields []field) (extra map[string]json.RawMessage, err error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	for k, v := range raw {
		i := slices.IndexFunc(fields, func(f field) bool { return f.key == k })
		if i < 0 {
			if extra == nil {
				extra = make(map[string]json.RawMessage)
			}
			extra[k] = v
			continue
		}
		if err := json.Unmarshal(v, fields[i].ptr); err != nil {
			return nil, fmt.Errorf("decode %q: %w", k, err)
		}
	}
	return extra, nil
}

// decodeObject decodes the object data, which is valid JSON, into the
// fields fieldPtr finds (zero on entry), as unmarshalObjectSlow does when
// it succeeds. It reports false when it did not (data is no object, or a
// member needs encoding/json's error); fields may then be partly set.
func decodeObject(data []byte, fieldPtr func(key []byte) any) (extra map[string]json.RawMessage, ok bool) {
	ok = jsonenc.Members(data, func(key, v []byte) bool {
		ptr := fieldPtr(key)
		if ptr == nil {
			if extra == nil {
				extra = make(map[string]json.RawMessage)
			}
			extra[string(key)] = bytes.Clone(v)
			return true
		}
		// The last of repeated keys decodes as if it were alone, as in
		// the map the slow way decodes first.
		zeroField(ptr)
		return decodeField(ptr, v)
	})
	return extra, ok
}

// decodeField decodes the valid JSON value v into f as json.Unmarshal does,
// nested parts and approvals without validating v again. It reports false
// when json.Unmarshal would fail.
func decodeField(ptr any, v []byte) bool {
	switch p := ptr.(type) {
	case *string:
		if s, ok := jsonenc.PlainString(v); ok {
			*p = string(s)
			return true
		}
	case *Role:
		if s, ok := jsonenc.PlainString(v); ok {
			*p = Role(s)
			return true
		}
	case *json.RawMessage:
		*p = bytes.Clone(v)
		return true
	case **bool:
		switch string(v) {
		case "true", "false":
			b := v[0] == 't'
			*p = &b
			return true
		case "null":
			*p = nil
			return true
		}
	case **Approval:
		switch {
		case v[0] == '{':
			a := new(Approval)
			extra, ok := decodeObject(v, a.fieldPtr)
			a.extra = extra
			*p = a
			return ok
		case string(v) == "null":
			*p = nil
			return true
		}
	case *[]Part:
		switch {
		case v[0] == '[':
			parts, ok := decodeParts(v)
			*p = parts
			return ok
		case string(v) == "null":
			*p = nil
			return true
		}
	}
	return json.Unmarshal(v, ptr) == nil
}

// decodeParts decodes the valid JSON array v of parts as json.Unmarshal
// does (a null element is a zero part), reporting false when it would
// fail.
func decodeParts(v []byte) ([]Part, bool) {
	parts := []Part{}
	ok := jsonenc.Elements(v, func(e []byte) bool {
		parts = append(parts, Part{})
		switch {
		case e[0] == '{':
			p := &parts[len(parts)-1]
			extra, ok := decodeObject(e, p.fieldPtr)
			p.extra = extra
			return ok
		case string(e) == "null":
			return true
		}
		return false
	})
	return parts, ok
}

// zeroField sets the field ptr points to to its zero value.
func zeroField(ptr any) {
	switch p := ptr.(type) {
	case *string:
		*p = ""
	case *Role:
		*p = ""
	case *json.RawMessage:
		*p = nil
	case **bool:
		*p = nil
	case **Approval:
		*p = nil
	case *[]Part:
		*p = nil
	default:
		panic(fmt.Sprintf("message: unsupported field type %T", ptr))
	}
}

func zeroFields(fields []field) {
	for _, f := range fields {
		zeroField(f.ptr)
	}
}

// DecodeMessages decodes a JSON array of messages (null gives nil), what
// json.Unmarshal into a []Message returns, validating data once rather
// than once per message and per part.
func DecodeMessages(data []byte) ([]Message, error) {
	if json.Valid(data) {
		if msgs, ok := decodeMessages(data); ok {
			return msgs, nil
		}
	}
	var msgs []Message
	if err := json.Unmarshal(data, &msgs); err != nil {
		return nil, err
	}
	return msgs, nil
}

// decodeMessages decodes valid JSON data as DecodeMessages does, reporting
// false when that needs encoding/json (null, an error to report).
func decodeMessages(data []byte) ([]Message, bool) {
	msgs := []Message{}
	ok := jsonenc.Elements(data, func(e []byte) bool {
		msgs = append(msgs, Message{})
		switch {
		case e[0] == '{':
			m := &msgs[len(msgs)-1]
			extra, ok := decodeObject(e, m.fieldPtr)
			m.extra = extra
			return ok
		case string(e) == "null":
			return true
		}
		return false
	})
	return msgs, ok
}

// isNull reports whether r is absent or the JSON null.
func isNull(r json.RawMessage) bool {
	r = bytes.TrimSpace(r)
	return len(r) == 0 || string(r) == "null"
}

// isObject reports whether r holds a JSON object.
func isObject(r json.RawMessage) bool {
	r = bytes.TrimSpace(r)
	return len(r) > 0 && r[0] == '{'
}

// mergeJSON deep-merges over into base the way the AI SDK's mergeObjects
// does: members of over replace those of base, except that two objects
// under the same key are merged recursively. A null or absent over leaves
// base unchanged; if either side is not an object, over wins. The result
// is what json.Marshal writes for the merged map of members (keys sorted,
// values compacted), built from the members' bytes without decoding them.
func mergeJSON(base, over json.RawMessage) json.RawMessage {
	if isNull(over) {
		return base
	}
	if isNull(base) || !isObject(base) || !isObject(over) || !json.Valid(base) || !json.Valid(over) {
		return bytes.Clone(over)
	}
	// As in the maps of members the merge was once made of, the last of
	// repeated keys is the one that counts, on either side.
	var mbuf, obuf [8]member // most metadata has a few members
	ms, overs := mbuf[:0], obuf[:0]
	jsonenc.Members(base, func(key, v []byte) bool { ms = setMember(ms, key, v); return true })
	jsonenc.Members(over, func(key, v []byte) bool { overs = setMember(overs, key, v); return true })
	for _, o := range overs {
		i := slices.IndexFunc(ms, func(m member) bool { return bytes.Equal(m.key, o.key) })
		switch {
		case i < 0:
			ms = append(ms, o)
		case isObject(ms[i].value) && isObject(o.value):
			ms[i].value = mergeJSON(ms[i].value, o.value)
		default:
			ms[i].value = o.value
		}
	}
	slices.SortFunc(ms, func(x, y member) int { return bytes.Compare(x.key, y.key) })
	n := 2
	for _, m := range ms {
		n += len(m.key) + len(m.value) + 4
	}
	out := append(make([]byte, 0, n), '{')
	for i, m := range ms {
		if i > 0 {
			out = append(out, ',')
		}
		out = jsonenc.AppendString(out, string(m.key))
		out = append(out, ':')
		var err error
		if out, err = jsonenc.AppendRaw(out, m.value); err != nil {
			return bytes.Clone(over)
		}
	}
	return append(out, '}')
}

// member is a member of a JSON object: its key (unquoted) and value.
type member struct{ key, value []byte }

// setMember sets key to v in ms, replacing an earlier value.
func setMember(ms []member, key, v []byte) []member {
	for i := range ms {
		if bytes.Equal(ms[i].key, key) {
			ms[i].value = v
			return ms
		}
	}
	return append(ms, member{key, v})
}

// cloneRaw returns a copy of r that shares no memory with it.
func cloneRaw(r json.RawMessage) json.RawMessage {
	if r == nil {
		return nil
	}
	return bytes.Clone(r)
}

// cloneBool returns a copy of p that shares no memory with it.
func cloneBool(p *bool) *bool {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// cloneExtra deep-copies a map of unknown JSON members.
func cloneExtra(m map[string]json.RawMessage) map[string]json.RawMessage {
	if m == nil {
		return nil
	}
	out := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		out[k] = cloneRaw(v)
	}
	return out
}
