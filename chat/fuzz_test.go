package chat_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentry/agentry/chat"
)

type fuzzAddress struct {
	City string   `json:"city"`
	Zip  *int     `json:"zip,omitempty"`
	Tags []string `json:"tags,omitempty"`
}

type fuzzInput struct {
	Name    string             `json:"name"`
	Count   int                `json:"count"`
	Ratio   float64            `json:"ratio,omitempty"`
	Mode    string             `json:"mode,omitempty"`
	Flag    bool               `json:"flag,omitempty"`
	Address *fuzzAddress       `json:"address,omitempty"`
	Items   []fuzzAddress      `json:"items,omitempty"`
	Extra   map[string]float64 `json:"extra,omitempty"`
	Any     any                `json:"any,omitempty"`
}

// Validate is the input type's own check.
func (in *fuzzInput) Validate() error {
	if in.Count < 0 {
		return errors.New("count must not be negative")
	}
	return nil
}

// FuzzToolInput feeds arbitrary model input to a tool: validation and
// execution never panic, a refusal is an *InputError (which the model is
// shown), and the tool function only ever sees input that passed the
// schema and its Validate method.
func FuzzToolInput(f *testing.F) {
	for _, s := range []string{
		`{"name":"a","count":1}`, `{"name":"a","count":1.5}`, `{"name":"a","count":1e400}`,
		`{"name":"a","count":-1}`, `{"name":"a","count":2,"mode":"fast","address":{"city":"x","zip":7}}`,
		`{"name":"a","count":2,"items":[{"city":"y","tags":["t"]}],"extra":{"k":1}}`,
		`{"name":"a","count":2,"mode":"other"}`, `{"count":1}`, `{"name":1,"count":1}`,
		`{"name":"a","count":1,"any":[[[[{}]]]]}`, `null`, `[]`, `"x"`, `{`, ``, "\xff",
	} {
		f.Add([]byte(s))
	}
	var calls int
	tool := chat.NewTool("probe", "fuzz target", func(ctx context.Context, in fuzzInput) (string, error) {
		calls++
		return in.Name, nil
	}).WithSchema(func(s *jsonschema.Schema) {
		s.Properties["mode"].Enum = []any{"fast", "slow"}
		one := 1.0
		s.Properties["name"].MinLength = new(int)
		*s.Properties["name"].MinLength = 1
		s.Properties["ratio"].Maximum = &one
	})
	f.Fuzz(func(t *testing.T, input []byte) {
		before := calls
		out, err := tool.Execute(context.Background(), json.RawMessage(input))
		if err != nil {
			var ie *chat.InputError
			if !errors.As(err, &ie) {
				t.Fatalf("input %q: error %v is not an *InputError", input, err)
			}
			if calls != before {
				t.Fatalf("input %q: the tool ran although the input was refused", input)
			}
			return
		}
		if calls != before+1 {
			t.Fatalf("input %q: accepted but the tool ran %d times", input, calls-before)
		}
		if verr := tool.Validate(json.RawMessage(input)); verr != nil {
			t.Fatalf("input %q: Execute accepted what Validate refuses: %v", input, verr)
		}
		var in fuzzInput
		if err := json.Unmarshal(input, &in); err != nil || in.Name == "" || in.Count < 0 || out != in.Name {
			t.Fatalf("input %q accepted: decoded %+v, %v; result %v", input, in, err, out)
		}
	})
}
