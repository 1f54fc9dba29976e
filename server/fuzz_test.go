package server_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/examples/counter"
	"github.com/agentry/agentry/internal/testkit/testenv"
)

// FuzzParseRoute: ParseRoute never panics; a route it accepts names only
// registered classes and valid names, and printing it back as a URL path
// (names escaped) parses to the same route, as does its storage key.
func FuzzParseRoute(f *testing.F) {
	for _, s := range []string{
		"/agents/counter/a", "/agents/counter/a/sub/counter/b", "/agents/counter/a/sub/counter/b/get-messages",
		"/agents/counter/a%2Fb/x/y", "/agents/counter/%zz", "/agents/counter/sub", "/agents/counter/a/sub/counter",
		"/agents/nope/a", "/agents/counter/", "/agents", "/other/counter/a", "/agents/counter/a%00", "/agents/counter/a/",
	} {
		f.Add(s)
	}
	env := testenv.Start(f, testenv.Options{Classes: []agent.Class{counter.Class()}})
	f.Fuzz(func(t *testing.T, path string) {
		route, ok, err := env.Server.ParseRoute(path)
		if !ok || err != nil {
			return
		}
		if len(route.Path) == 0 {
			t.Fatalf("ParseRoute(%q) accepted an empty path", path)
		}
		var b strings.Builder
		b.WriteString("/agents")
		for i, h := range route.Path {
			if !env.RT.HasClass(h.Class) {
				t.Fatalf("ParseRoute(%q): unknown class %q", path, h.Class)
			}
			if h.Name == "" || h.Name == "sub" || strings.ContainsRune(h.Name, 0) {
				t.Fatalf("ParseRoute(%q): invalid name %q", path, h.Name)
			}
			if i > 0 {
				b.WriteString("/sub")
			}
			b.WriteString("/" + env.RT.Route(h.Class) + "/" + url.PathEscape(h.Name))
		}
		b.WriteString(route.Rest)
		again, ok, err := env.Server.ParseRoute(b.String())
		if !ok || err != nil || !again.Path.Equal(route.Path) || again.Rest != route.Rest {
			t.Fatalf("ParseRoute(%q) = %v %q; printed as %q it parses to %v %q, %v, %v",
				path, route.Path, route.Rest, b.String(), again.Path, again.Rest, ok, err)
		}
		if p, err := agent.ParsePath(route.Path.String()); err != nil || !p.Equal(route.Path) {
			t.Fatalf("storage key %q of %v parses to %v, %v", route.Path.String(), route.Path, p, err)
		}
	})
}
