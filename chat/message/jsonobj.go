package message

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
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
