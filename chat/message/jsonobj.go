package message

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
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

// appendValue appends the field's value as encoding/json would write it
// (compact, HTML-safe), without reflection.
func (f field) appendValue(b []byte) ([]byte, error) {
	switch p := f.ptr.(type) {
	case *string:
		return jsonenc.AppendString(b, *p), nil
	case *Role:
		return jsonenc.AppendString(b, string(*p)), nil
	case *json.RawMessage:
		return jsonenc.AppendRaw(b, *p)
	case **bool:
		switch {
		case *p == nil:
			return append(b, "null"...), nil
		case **p:
			return append(b, "true"...), nil
		default:
			return append(b, "false"...), nil
		}
	case **Approval:
		if *p == nil {
			return append(b, "null"...), nil
		}
		v, err := (*p).MarshalJSON()
		return append(b, v...), err
	case *[]Part:
		b = append(b, '[')
		for i, part := range *p {
			if i > 0 {
				b = append(b, ',')
			}
			v, err := part.MarshalJSON()
			if err != nil {
				return b, err
			}
			b = append(b, v...)
		}
		return append(b, ']'), nil
	}
	panic(fmt.Sprintf("message: unsupported field type %T", f.ptr))
}

// marshalObject encodes fields in order, skipping zero values whose key is
// not required, then the extra members in key order. The result is what
// json.Marshal writes for it (compact, HTML-safe), so it can go on the
// wire as it is. The fields' keys are plain ASCII names, written without
// escaping.
func marshalObject(fields []field, required func(key string) bool, extra map[string]json.RawMessage) ([]byte, error) {
	b := make([]byte, 0, 128)
	b = append(b, '{')
	first := true
	for _, f := range fields {
		if f.isZero() && !required(f.key) {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, '"')
		b = append(b, f.key...)
		b = append(b, '"', ':')
		var err error
		if b, err = f.appendValue(b); err != nil {
			return nil, fmt.Errorf("encode %q: %w", f.key, err)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		v := extra[k]
		if !json.Valid(v) {
			return nil, fmt.Errorf("encode %q: invalid JSON", k)
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = jsonenc.AppendString(b, k)
		b = append(b, ':')
		var err error
		if b, err = jsonenc.AppendRaw(b, v); err != nil {
			return nil, fmt.Errorf("encode %q: %w", k, err)
		}
	}
	return append(b, '}'), nil
}

// unmarshalObject decodes a JSON object into fields, matching keys exactly
// (unlike encoding/json, which folds case). Members with no matching field
// are returned as extra; extra is nil when there are none.
func unmarshalObject(data []byte, fields []field) (extra map[string]json.RawMessage, err error) {
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
// base unchanged; if either side is not an object, over wins.
func mergeJSON(base, over json.RawMessage) json.RawMessage {
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
			bm[k] = mergeJSON(bv, ov)
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
