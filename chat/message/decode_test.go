package message

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// The reference decoders below are the decoding before decodeObject:
// encoding/json at every level (a map of raw members, then each member).

func refObject(data []byte, fields []field) (map[string]json.RawMessage, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	var extra map[string]json.RawMessage
	for k, v := range raw {
		i := slices.IndexFunc(fields, func(f field) bool { return f.key == k })
		if i < 0 {
			if extra == nil {
				extra = make(map[string]json.RawMessage)
			}
			extra[k] = v
			continue
		}
		var err error
		switch p := fields[i].ptr.(type) {
		case *[]Part:
			err = refParts(v, p)
		case **Approval:
			err = refApproval(v, p)
		default:
			err = json.Unmarshal(v, p)
		}
		if err != nil {
			return nil, fmt.Errorf("decode %q: %w", k, err)
		}
	}
	return extra, nil
}

func refParts(v []byte, p *[]Part) error {
	var elems []json.RawMessage
	if err := json.Unmarshal(v, &elems); err != nil {
		return err
	}
	if elems == nil {
		*p = nil
		return nil
	}
	*p = make([]Part, len(elems))
	for i, e := range elems {
		part, err := refPart(e)
		if err != nil {
			return err
		}
		(*p)[i] = part
	}
	return nil
}

func refApproval(v []byte, p **Approval) error {
	if string(v) == "null" {
		*p = nil
		return nil
	}
	a := new(Approval)
	extra, err := refObject(v, a.fields())
	if err != nil {
		return err
	}
	a.extra = extra
	*p = a
	return nil
}

func refPart(data []byte) (Part, error) {
	var p Part
	extra, err := refObject(data, p.fields())
	p.extra = extra
	return p, err
}

func refMessage(data []byte) (Message, error) {
	var m Message
	extra, err := refObject(data, m.fields())
	m.extra = extra
	return m, err
}

func refChunk(data []byte) (Chunk, error) {
	var c Chunk
	extra, err := refObject(data, c.fields())
	c.extra = extra
	return c, err
}

// checkDecoded fails unless a decoding agrees with the reference: both
// fail, or both decode the same value.
func checkDecoded[T any](t *testing.T, what string, data []byte, got T, err error, want T, wantErr error) {
	t.Helper()
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("%s %q: error %v, reference error %v", what, data, err, wantErr)
	}
	if err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%s %q:\n got %#v\nwant %#v", what, data, got, want)
	}
}

// FuzzDecodeMatchesReference decodes arbitrary JSON as a message, a part,
// a chunk, an approval and an array of messages (DecodeMessages), and
// checks each against encoding/json at every level: same value (unknown
// members, nil and empty alike), and an error exactly when it fails.
func FuzzDecodeMatchesReference(f *testing.F) {
	flow, err := os.ReadFile("testdata/flow_c_chunks.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	for _, line := range bytes.Split(flow, []byte("\n")) {
		f.Add(line)
	}
	for _, s := range []string{
		`{"id":"m","role":"assistant","metadata":{"a":"<"},"parts":[{"type":"text","text":"hi\nthere \u00e9","state":"done"},{"type":"tool-x","toolCallId":"c","state":"approval-requested","input":{ "q" : 1 },"approval":{"id":"a1","approved":true,"x":[1]}}]}`,
		`[{"id":"u","role":"user","parts":[{"type":"text","text":"a"}]},null,{"id":"a","role":"assistant","parts":null}]`,
		`{"id":"a","id":null,"role":"user","parts":[],"parts":[null,{"type":"step-start"}]}`,
		`{"ID":"x","Parts":[],"id":"\ud83d\ude00","role":"us\u0065r"}`,
		`{"parts":[{"type":"tool-y","toolCallId":"c","state":"output-available","approval":null,"providerExecuted":false,"preliminary":null}]}`,
		`{"parts":[{"type":1}]}`, `{"parts":[5]}`, `{"parts":{}}`, `{"id":5}`, `{"approval":"x"}`, `{"approved":"yes"}`,
		`{"type":"text-delta","id":"t","delta":"a\"b","transient":true,"zz":{}}`, `null`, `[]`, `[null]`, `"x"`, `{`,
		"{\"id\":\"\xff\",\"\xfe\":1}", ` { "id" : "a" , "role" : "user" } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m Message
		err := json.Unmarshal(data, &m)
		wm, werr := refMessage(data)
		if json.Valid(data) {
			// encoding/json reports a syntax error before any value.
			checkDecoded(t, "message", data, m, err, wm, werr)
		}
		var direct Message
		err = direct.UnmarshalJSON(data)
		checkDecoded(t, "message (UnmarshalJSON)", data, direct, err, wm, werr)

		var p Part
		err = p.UnmarshalJSON(data)
		wp, werr := refPart(data)
		checkDecoded(t, "part", data, p, err, wp, werr)

		var c Chunk
		err = c.UnmarshalJSON(data)
		wc, werr := refChunk(data)
		checkDecoded(t, "chunk", data, c, err, wc, werr)

		var a Approval
		err = a.UnmarshalJSON(data)
		var wa Approval
		wextra, werr := refObject(data, wa.fields())
		wa.extra = wextra
		checkDecoded(t, "approval", data, a, err, wa, werr)

		msgs, err := DecodeMessages(data)
		var wmsgs []Message
		werr = nil
		var elems []json.RawMessage
		if werr = json.Unmarshal(data, &elems); werr == nil && elems != nil {
			wmsgs = make([]Message, len(elems))
			for i, e := range elems {
				if wmsgs[i], werr = refMessage(e); werr != nil {
					break
				}
			}
		}
		checkDecoded(t, "messages", data, msgs, err, wmsgs, werr)
	})
}

// TestDecodeErrorsUnchanged: an error decoding a message reads as it did
// when encoding/json decoded every level.
func TestDecodeErrorsUnchanged(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"id":5}`, `message: decode "id": json: cannot unmarshal number into Go value of type string`},
		{`{"parts":[{"type":"text","text":1}]}`, `message: decode "parts": part: decode "text": json: cannot unmarshal number into Go value of type string`},
		{`{"parts":[{"type":"tool-x","approval":{"approved":"yes"}}]}`, `message: decode "parts": part: decode "approval": approval: decode "approved": json: cannot unmarshal string into Go value of type bool`},
		{`{"parts":[7]}`, `message: decode "parts": part: json: cannot unmarshal number into Go value of type map[string]json.RawMessage`},
	} {
		var m Message
		if err := m.UnmarshalJSON([]byte(c.in)); err == nil || err.Error() != c.want {
			t.Errorf("%s: error %v, want %s", c.in, err, c.want)
		}
	}
}

// BenchmarkDecodeMessages decodes the transcript of a chat request of 8
// research turns: DecodeMessages, and json.Unmarshal into a []Message.
func BenchmarkDecodeMessages(b *testing.B) {
	data, err := json.Marshal(researchTranscript(8))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("DecodeMessages", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeMessages(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Unmarshal", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		b.ReportAllocs()
		for b.Loop() {
			var msgs []Message
			if err := json.Unmarshal(data, &msgs); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestFieldPtrMatchesFields: fieldPtr finds the field of each key of
// fields, and nothing for another key (matched exactly, as fields are).
func TestFieldPtrMatchesFields(t *testing.T) {
	var m Message
	var p Part
	var a Approval
	var c Chunk
	for _, x := range []struct {
		name   string
		fields []field
		ptr    func([]byte) any
	}{{"message", m.fields(), m.fieldPtr}, {"part", p.fields(), p.fieldPtr}, {"approval", a.fields(), a.fieldPtr}, {"chunk", c.fields(), c.fieldPtr}} {
		for _, f := range x.fields {
			if got := x.ptr([]byte(f.key)); got != f.ptr {
				t.Errorf("%s: fieldPtr(%q) = %v, want %v", x.name, f.key, got, f.ptr)
			}
			if got := x.ptr([]byte(strings.ToUpper(f.key))); got != nil {
				t.Errorf("%s: fieldPtr(%q) = %v, want nil", x.name, strings.ToUpper(f.key), got)
			}
		}
		if got := x.ptr([]byte("unknown")); got != nil {
			t.Errorf("%s: fieldPtr(unknown) = %v", x.name, got)
		}
	}
}
