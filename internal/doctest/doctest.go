// Package doctest checks that the Go in the project's Markdown (README.md
// and docs/*.md) compiles: its test extracts every ```go block, builds each
// as a package of a temporary module that uses this module through a
// replace directive, and reports the blocks that do not compile.
//
// A block with a package clause is a whole file. Any other
// block is a fragment: its top-level declarations stay declarations, `x :=
// …` at the top level becomes a package-level var, and its other
// statements go into a function body. Imports of the packages the block
// names (agent, chat, http, …) are added. An HTML comment right before the
// block gives what the fragment leaves out:
//
//	<!-- go: context
//	var ctx context.Context
//	-->
//
// adds declarations to the block's package, and
//
//	<!-- go: wrap
//	var _ = server.Options{
//	SNIPPET
//	}
//	-->
//
// puts the block where SNIPPET is (a wrapped block is a declaration).
package doctest

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Block is one ```go block of a Markdown file.
type Block struct {
	File    string // the Markdown file, as given
	Line    int    // line of the opening fence
	Code    string
	Context string // declarations added to the package
	Wrap    string // the wrapper with SNIPPET, if any
}

// Blocks returns the ```go blocks of a Markdown text.
func Blocks(file, text string) []Block {
	var out []Block
	lines := strings.Split(text, "\n")
	var pendingContext, pendingWrap string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		trimmed := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(trimmed, "<!-- go: context") || strings.HasPrefix(trimmed, "<!-- go: wrap"):
			var body []string
			j := i + 1
			for ; j < len(lines) && strings.TrimSpace(lines[j]) != "-->"; j++ {
				body = append(body, lines[j])
			}
			if strings.HasPrefix(trimmed, "<!-- go: context") {
				pendingContext += strings.Join(body, "\n") + "\n"
			} else {
				pendingWrap = strings.Join(body, "\n")
			}
			i = j
		case trimmed == "```go":
			var code []string
			j := i + 1
			for ; j < len(lines) && strings.TrimSpace(lines[j]) != "```"; j++ {
				code = append(code, lines[j])
			}
			out = append(out, Block{File: file, Line: i + 1, Code: strings.Join(code, "\n") + "\n",
				Context: pendingContext, Wrap: pendingWrap})
			pendingContext, pendingWrap = "", ""
			i = j
		case trimmed != "":
			// A directive applies to the block right after it only.
			pendingContext, pendingWrap = "", ""
		}
	}
	return out
}

// imports maps the package names fragments use to their import paths.
var imports = map[string]string{
	"agent":      "github.com/agentry/agentry/agent",
	"agenttool":  "github.com/agentry/agentry/agenttool",
	"chat":       "github.com/agentry/agentry/chat",
	"client":     "github.com/agentry/agentry/client",
	"diag":       "github.com/agentry/agentry/diag",
	"message":    "github.com/agentry/agentry/chat/message",
	"model":      "github.com/agentry/agentry/model",
	"openai":     "github.com/agentry/agentry/model/openai",
	"anthropic":  "github.com/agentry/agentry/model/anthropic",
	"scripted":   "github.com/agentry/agentry/model/scripted",
	"server":     "github.com/agentry/agentry/server",
	"sqlite":     "github.com/agentry/agentry/store/sqlite",
	"postgres":   "github.com/agentry/agentry/store/postgres",
	"store":      "github.com/agentry/agentry/store",
	"jsonschema": "github.com/google/jsonschema-go/jsonschema",
	"mcpclient":  "github.com/agentry/agentry/mcpclient",
	"context":    "context",
	"errors":     "errors",
	"fmt":        "fmt",
	"http":       "net/http",
	"json":       "encoding/json",
	"log":        "log",
	"net":        "net",
	"os":         "os",
	"slog":       "log/slog",
	"strings":    "strings",
	"sync":       "sync",
	"time":       "time",
}

var (
	qualified = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.[A-Z]`)
	shortVar  = regexp.MustCompile(`^([A-Za-z_]\w*(\s*,\s*[A-Za-z_]\w*)*)\s*:=`)
	lineStart = regexp.MustCompile(`^(type|func|var|const|import)\b`)
)

var packageClause = regexp.MustCompile(`(?m)^package (\w+)`)

// Package returns the package name of a block that is a whole file (it has
// a package clause), or "" for a fragment.
func (b Block) Package() string {
	if m := packageClause.FindStringSubmatch(b.Code); m != nil {
		return m[1]
	}
	return ""
}

// Source returns the Go file that compiles the block as package name: a
// whole file with its package clause renamed (a command then compiles
// without linking), a fragment completed as the package doc says.
func (b Block) Source(name string) string {
	code := b.Code
	if b.Package() != "" {
		return packageClause.ReplaceAllString(code, "package "+name)
	}
	var decls, stmts string
	if b.Wrap != "" {
		decls = strings.Replace(b.Wrap, "SNIPPET", code, 1) + "\n"
	} else {
		decls, stmts = split(code)
	}
	body := decls + b.Context
	if strings.TrimSpace(stmts) != "" {
		body += "\nfunc _() error {\n" + stmts + "\treturn nil\n}\n"
	}
	used := map[string]bool{}
	for _, m := range qualified.FindAllStringSubmatch(body, -1) {
		if _, ok := imports[m[1]]; ok {
			used[m[1]] = true
		}
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	var sb strings.Builder
	fmt.Fprintf(&sb, "// Code from %s:%d.\n\npackage %s\n\n", b.File, b.Line, name)
	if len(names) > 0 {
		sb.WriteString("import (\n")
		for _, n := range names {
			fmt.Fprintf(&sb, "\t%q\n", imports[n])
		}
		sb.WriteString(")\n\n")
	}
	sb.WriteString(body)
	return sb.String()
}

// split separates a fragment's top-level declarations from its statements.
// A top-level item starts at a line in column 0 (other than a closing
// bracket) and runs to the next one.
func split(code string) (decls, stmts string) {
	var items [][]string
	for _, l := range strings.Split(code, "\n") {
		startsItem := l != "" && l[0] != ' ' && l[0] != '\t' && l[0] != '}' && l[0] != ')' && l[0] != ']'
		if startsItem || len(items) == 0 {
			items = append(items, nil)
		}
		items[len(items)-1] = append(items[len(items)-1], l)
	}
	var d, s strings.Builder
	for _, it := range items {
		text := strings.Join(it, "\n") + "\n"
		first := it[0]
		switch {
		case strings.TrimSpace(text) == "":
		case strings.HasPrefix(first, "//") && len(it) == 1:
			s.WriteString(text)
		case lineStart.MatchString(first):
			d.WriteString(text)
		case shortVar.MatchString(first):
			d.WriteString("var " + shortVar.ReplaceAllString(first, "$1 =") + "\n" + strings.Join(it[1:], "\n") + "\n")
		default:
			s.WriteString(text)
		}
	}
	return d.String(), s.String()
}
