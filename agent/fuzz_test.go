package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentry/agentry/agent"
)

// Fuzzy is the agent of FuzzHandleFrame: callables of every kind (plain,
// context and arguments, a failing one, a streaming one, a state writer)
// and a state validator, none of which blocks.
type Fuzzy struct{ agent.Base }

func (f *Fuzzy) Echo(v any) any                        { return v }
func (f *Fuzzy) Add(ctx context.Context, a, b int) int { return a + b }
func (f *Fuzzy) Fail(ctx context.Context) (int, error) { return 0, errors.New("no") }
func (f *Fuzzy) Boom() int                             { panic("boom") }
func (f *Fuzzy) Save(ctx context.Context, v any) error { return f.SetState(ctx, v) }
func (f *Fuzzy) Parts(ctx context.Context, s *agent.Stream, parts []string) (int, error) {
	for _, p := range parts {
		if err := s.Send(p); err != nil {
			return 0, err
		}
	}
	return len(parts), nil
}

func (f *Fuzzy) ValidateState(ctx context.Context, next json.RawMessage, from *agent.Conn) error {
	if strings.Contains(string(next), "bad") {
		return errors.New("bad state")
	}
	return nil
}

// countTransport counts the frames it is given and drops them.
type countTransport struct{ frames, closes atomic.Int64 }

func (c *countTransport) Send(frame []byte) bool        { c.frames.Add(1); return true }
func (c *countTransport) Close(code int, reason string) { c.closes.Add(1) }

// FuzzHandleFrame feeds arbitrary client frames to a connection: none may
// panic or wedge the instance; every frame gets an answer or is handled
// silently, and the instance still answers a call afterwards.
func FuzzHandleFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"rpc","id":"1","method":"echo","args":[{"a":1}]}`,
		`{"type":"rpc","id":"2","method":"add","args":[1,2]}`,
		`{"type":"rpc","id":"3","method":"add","args":["x",2,3]}`,
		`{"type":"rpc","id":"4","method":"parts","args":[["a","b"]]}`,
		`{"type":"rpc","id":"5","method":"fail","args":[]}`,
		`{"type":"rpc","id":"6","method":"boom","args":[]}`,
		`{"type":"rpc","id":"7","method":"save","args":[{"n":1e999}]}`,
		`{"type":"rpc","id":"8","method":"destroy","args":[]}`,
		`{"type":"rpc","method":"echo"}`,
		`{"type":"rpc","id":9}`,
		`{"type":"cf_agent_state","state":{"count":1}}`,
		`{"type":"cf_agent_state","state":"bad"}`,
		`{"type":"cf_agent_state"}`,
		`{"type":"cf_agent_use_chat_request","id":"x"}`,
		`{"type":""}`, `{}`, `[]`, `null`, `"rpc"`, `{"type":"rpc"`, "\xff", ``,
	} {
		f.Add([]byte(s))
	}
	h := newHooks()
	e := startRuntime(f, rtOptions{classes: []agent.Class{{
		Name: "Fuzzy", New: func() agent.Agent { return &Fuzzy{} },
		Callable: []string{"echo", "add", "fail", "boom", "save", "parts"},
	}, probeClass(h)}})
	ctx := context.Background()
	path := agent.Root("Fuzzy", "f")
	tr := &countTransport{}
	conn, err := e.rt.Connect(ctx, path, "fuzz", nil, tr)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { conn.Disconnect(1000, "") })
	f.Fuzz(func(t *testing.T, data []byte) {
		conn.HandleFrame(ctx, data)
		if res, err := e.rt.Call(ctx, path, "add", 2, 3); err != nil || string(res) != "5" {
			t.Fatalf("after frame %q the instance answers add(2,3) = %s, %v", data, res, err)
		}
	})
}

// FuzzParsePath: ParsePath never panics, and a path it accepts prints back
// to a key that parses to the same path; any path built from a class and
// a name round-trips.
func FuzzParsePath(f *testing.F) {
	for _, s := range []string{"Counter/a", "Counter/a/Child/b%2Fc", "A", "A/b/C", "/", "A/%zz", "A/", "A/b%00"} {
		f.Add(s, "Class", "na/me")
	}
	f.Fuzz(func(t *testing.T, key, class, name string) {
		if p, err := agent.ParsePath(key); err == nil {
			q, err := agent.ParsePath(p.String())
			if err != nil || !q.Equal(p) {
				t.Fatalf("ParsePath(%q) = %v; its String %q parses to %v, %v", key, p, p.String(), q, err)
			}
		}
		if strings.Contains(class, "/") {
			return // class names are Go identifiers
		}
		p := agent.Root("Root", "r").Child(class, name)
		q, err := agent.ParsePath(p.String())
		if err != nil || !q.Equal(p) {
			t.Fatalf("path %v printed as %q parses to %v, %v", p, p.String(), q, err)
		}
	})
}
