package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/agentry/agentry/chat"
)

// TestNewRawTool: the schema is offered byte for byte, input is validated
// against it, a bad name or schema is refused, and a schema that does not
// resolve still gives a tool that takes JSON objects.
func TestNewRawTool(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer","x-extra":true}},"required":["n"]}`)
	var got json.RawMessage
	tl, err := chat.NewRawTool("srv_count", "Counts.", schema, func(ctx context.Context, in json.RawMessage) (any, error) {
		got = in
		return "ok", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if s := tl.Spec(); string(s.InputSchema) != string(schema) || s.Name != "srv_count" {
		t.Fatalf("spec %s %s, want the schema unchanged", s.Name, s.InputSchema)
	}
	var ie *chat.InputError
	if _, err := tl.Execute(context.Background(), json.RawMessage(`{"n":"x"}`)); !errors.As(err, &ie) {
		t.Fatalf("bad input: %v, want an InputError", err)
	}
	if out, err := tl.Execute(context.Background(), json.RawMessage(`{"n":2}`)); err != nil || out != "ok" || string(got) != `{"n":2}` {
		t.Fatalf("Execute: %v %v, input %s", out, err, got)
	}
	if _, err := chat.NewRawTool("bad name", "", schema, func(context.Context, json.RawMessage) (any, error) { return nil, nil }); err == nil {
		t.Fatal("a bad name was accepted")
	}
	if _, err := chat.NewRawTool("x", "", json.RawMessage(`[1]`), func(context.Context, json.RawMessage) (any, error) { return nil, nil }); err == nil {
		t.Fatal("a schema that is not an object was accepted")
	}
	remote, err := chat.NewRawTool("r", "", json.RawMessage(`{"$ref":"https://example.com/s.json"}`), func(context.Context, json.RawMessage) (any, error) { return 1, nil })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Execute(context.Background(), json.RawMessage(`{"a":1}`)); err != nil {
		t.Fatalf("unresolvable schema: %v", err)
	}
	if _, err := remote.Execute(context.Background(), json.RawMessage(`3`)); err == nil {
		t.Fatal("unresolvable schema: a non-object input was accepted")
	}
}
