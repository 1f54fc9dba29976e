package message

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/agentry/agentry/jsonenc"
)

// objectEncoder appends the members of a JSON object after its first one,
// which every type here always writes (a part's type, a message's or an
// approval's id): each member is left out when zero unless required says
// its key must be written. The result is what json.Marshal writes
// (compact, HTML-safe), member by member in the order of the type's
// fields (see fields), without reflection and without a buffer of its
// own: a message is encoded whole into every transcript frame and every
// stored row.
type objectEncoder struct {
	b   []byte
	err error
	// part is the part encoded, whose type says which keys are required;
	// nil for an approval, whose id is.
	part *Part
}

func (e *objectEncoder) required(key string) bool {
	if e.part != nil {
		return e.part.required(key)
	}
	return key == "id"
}

func (e *objectEncoder) key(key string) {
	e.b = append(e.b, ',', '"')
	e.b = append(e.b, key...)
	e.b = append(e.b, '"', ':')
}

func (e *objectEncoder) str(key, v string) {
	if v == "" && !e.required(key) {
		return
	}
	e.key(key)
	e.b = jsonenc.AppendString(e.b, v)
}

func (e *objectEncoder) raw(key string, v json.RawMessage) {
	if e.err != nil || len(v) == 0 && !e.required(key) {
		return
	}
	e.key(key)
	b, err := jsonenc.AppendRaw(e.b, v)
	if err != nil {
		e.err = fmt.Errorf("encode %q: %w", key, err)
		return
	}
	e.b = b
}

func (e *objectEncoder) flag(key string, v *bool) {
	if v == nil && !e.required(key) {
		return
	}
	e.key(key)
	switch {
	case v == nil:
		e.b = append(e.b, "null"...)
	case *v:
		e.b = append(e.b, "true"...)
	default:
		e.b = append(e.b, "false"...)
	}
}

// close appends the unknown members in key order, then closes the object.
func (e *objectEncoder) close(extra map[string]json.RawMessage) {
	if e.err == nil && len(extra) > 0 {
		e.b, e.err = appendExtra(e.b, extra)
	}
	e.b = append(e.b, '}')
}

// appendExtra appends unknown members, each after a comma, in key order.
func appendExtra(b []byte, extra map[string]json.RawMessage) ([]byte, error) {
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		v := extra[k]
		if !json.Valid(v) {
			return b, fmt.Errorf("encode %q: invalid JSON", k)
		}
		b = append(b, ',')
		b = jsonenc.AppendString(b, k)
		b = append(b, ':')
		var err error
		if b, err = jsonenc.AppendRaw(b, v); err != nil {
			return b, fmt.Errorf("encode %q: %w", k, err)
		}
	}
	return b, nil
}

// AppendJSON appends m's encoding, what MarshalJSON returns, to b. A
// caller that writes several messages into one frame or row uses it to
// encode them without a buffer each.
func (m *Message) AppendJSON(b []byte) ([]byte, error) {
	start := len(b)
	b = append(b, `{"id":`...)
	b = jsonenc.AppendString(b, m.ID)
	b = append(b, `,"role":`...)
	b = jsonenc.AppendString(b, string(m.Role))
	if len(m.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		var err error
		if b, err = jsonenc.AppendRaw(b, m.Metadata); err != nil {
			return b[:start], fmt.Errorf("message %q: encode %q: %w", m.ID, "metadata", err)
		}
	}
	b = append(b, `,"parts":[`...)
	for i := range m.Parts {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = m.Parts[i].appendJSON(b); err != nil {
			return b[:start], fmt.Errorf("message %q: encode %q: %w", m.ID, "parts", err)
		}
	}
	b = append(b, ']')
	if len(m.extra) > 0 {
		var err error
		if b, err = appendExtra(b, m.extra); err != nil {
			return b[:start], fmt.Errorf("message %q: %w", m.ID, err)
		}
	}
	return append(b, '}'), nil
}

// appendJSON appends p's encoding, what MarshalJSON returns, to b.
func (p *Part) appendJSON(b []byte) ([]byte, error) {
	start := len(b)
	e := objectEncoder{b: b, part: p}
	e.b = append(e.b, `{"type":`...)
	e.b = jsonenc.AppendString(e.b, p.Type)
	e.str("id", p.ID)
	e.str("text", p.Text)
	e.str("toolName", p.DynamicToolName)
	e.str("toolCallId", p.ToolCallID)
	e.str("state", p.State)
	e.raw("input", p.Input)
	e.raw("output", p.Output)
	e.raw("rawInput", p.RawInput)
	e.str("errorText", p.ErrorText)
	if e.err == nil && (p.Approval != nil || p.required("approval")) {
		e.key("approval")
		if p.Approval == nil {
			e.b = append(e.b, "null"...)
		} else if e.b, e.err = p.Approval.appendJSON(e.b); e.err != nil {
			e.err = fmt.Errorf("encode %q: %w", "approval", e.err)
		}
	}
	e.flag("providerExecuted", p.ProviderExecuted)
	e.flag("preliminary", p.Preliminary)
	e.str("title", p.Title)
	e.raw("toolMetadata", p.ToolMetadata)
	e.raw("callProviderMetadata", p.CallProviderMetadata)
	e.raw("resultProviderMetadata", p.ResultProviderMetadata)
	e.str("sourceId", p.SourceID)
	e.str("url", p.URL)
	e.str("mediaType", p.MediaType)
	e.str("filename", p.Filename)
	e.raw("data", p.Data)
	e.raw("providerMetadata", p.ProviderMetadata)
	e.close(p.extra)
	if e.err != nil {
		return b[:start], fmt.Errorf("part %q: %w", p.Type, e.err)
	}
	return e.b, nil
}

// appendJSON appends a's encoding, what MarshalJSON returns, to b.
func (a *Approval) appendJSON(b []byte) ([]byte, error) {
	start := len(b)
	e := objectEncoder{b: b}
	e.b = append(e.b, `{"id":`...)
	e.b = jsonenc.AppendString(e.b, a.ID)
	e.flag("approved", a.Approved)
	e.str("reason", a.Reason)
	e.raw("descriptor", a.Descriptor)
	e.raw("signature", a.Signature)
	e.close(a.extra)
	if e.err != nil {
		return b[:start], fmt.Errorf("approval: %w", e.err)
	}
	return e.b, nil
}
