package doctest_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentry/agentry/internal/testkit/doctest"
)

// root is the module's root folder: the nearest folder above the test's
// that holds go.mod.
var root = moduleRoot()

func moduleRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		panic(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			panic("doctest: no go.mod above " + dir)
		}
	}
}

func markdown(t *testing.T) []doctest.Block {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{filepath.Join(root, "README.md")}, files...)
	var blocks []doctest.Block
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		blocks = append(blocks, doctest.Blocks(rel, string(data))...)
	}
	return blocks
}

// TestMarkdownGoCompiles builds every ```go block of README.md and
// docs/*.md (see the package doc) in a temporary module that requires this
// one through a replace directive.
func TestMarkdownGoCompiles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	blocks := markdown(t)
	if len(blocks) < 10 {
		t.Fatalf("only %d Go blocks found", len(blocks))
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goMod := fmt.Sprintf("module agentry.test/snippets\n\ngo 1.26\n\nrequire github.com/agentry/agentry v0.0.0\n\nreplace github.com/agentry/agentry => %s\n", abs)
	write(t, filepath.Join(dir, "go.mod"), goMod)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.sum"), string(sum))
	where := map[string]doctest.Block{}
	for i, b := range blocks {
		pkg := fmt.Sprintf("b%02d", i)
		write(t, filepath.Join(dir, pkg, "snippet.go"), b.Source("snippet"))
		where[pkg] = b
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command: %v", err)
	}
	cmd := exec.Command(goCmd, "build", "-mod=mod", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-buildvcs=false")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		// Name each failing block by its Markdown file and line.
		report := out.String()
		for pkg, b := range where {
			report = strings.ReplaceAll(report, "./"+pkg+"/snippet.go", fmt.Sprintf("[%s:%d]", b.File, b.Line))
			report = strings.ReplaceAll(report, pkg+"/snippet.go", fmt.Sprintf("[%s:%d]", b.File, b.Line))
		}
		t.Fatalf("Go in the Markdown does not compile (%v); line numbers are of the generated file, which starts with the block:\n%s", err, report)
	}
}

// TestReadmeProgramIsTheExample: the README's complete program is
// examples/app/main.go, which TestApp runs.
func TestReadmeProgramIsTheExample(t *testing.T) {
	app, err := os.ReadFile(filepath.Join(root, "examples", "app", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range markdown(t) {
		if b.File == "README.md" && b.Code == string(app) {
			return
		}
	}
	t.Fatal("README.md has no ```go block identical to examples/app/main.go")
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
