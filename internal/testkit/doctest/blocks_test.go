package doctest

import (
	"strings"
	"testing"
)

// TestBlocksAndSource: directives attach to the next block only, and a
// fragment becomes declarations, package-level vars for top-level `:=`, a
// function for its statements, and the imports it names.
func TestBlocksAndSource(t *testing.T) {
	md := "text\n<!-- go: context\nvar rt *agent.Runtime\n-->\n```go\ntype T struct{ chat.Base }\n\nx, err := agenttool.RunAgentTool(ctx, a, \"R\", agenttool.RunOptions{\n\tInput: 1,\n})\nrt.MustRegister(agent.Class{Name: \"T\"})\n```\n\n" +
		"```go\n// Command c.\npackage main\n\nfunc main() {}\n```\n" +
		"<!-- go: wrap\nvar _ = server.Options{\nSNIPPET\n}\n-->\nparagraph\n```go\nPrefix: \"x\",\n```\n"
	bs := Blocks("X.md", md)
	if len(bs) != 3 {
		t.Fatalf("%d blocks", len(bs))
	}
	if bs[0].Line != 5 || !strings.Contains(bs[0].Context, "var rt") || bs[1].Context != "" {
		t.Fatalf("blocks %+v", bs)
	}
	if bs[2].Wrap != "" {
		t.Error("a wrap directive reached a block after a paragraph")
	}
	src := bs[0].Source("p")
	for _, want := range []string{"package p", `"github.com/agentry/agentry/agent"`, `"github.com/agentry/agentry/agenttool"`,
		`"github.com/agentry/agentry/chat"`, "type T struct", "var x, err = agenttool.RunAgentTool", "func _() error {\nrt.MustRegister",
		"var rt *agent.Runtime", "// Code from X.md:5."} {
		if !strings.Contains(src, want) {
			t.Errorf("source lacks %q:\n%s", want, src)
		}
	}
	if bs[1].Package() != "main" || !strings.Contains(bs[1].Source("p"), "package p\n") {
		t.Errorf("a whole file: package %q, source %q", bs[1].Package(), bs[1].Source("p"))
	}
}
