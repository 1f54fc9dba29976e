package agent_test

import (
	"context"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
)

// Kebab matches the npm client's camelCaseToKebabCase exactly (expected
// values produced by running that function under Node).
func TestKebab(t *testing.T) {
	cases := map[string]string{
		"MyChatAgent": "my-chat-agent",
		"AIAssistant": "a-i-assistant",
		"ABC":         "abc",
		"my_agent":    "my-agent",
		"Counter":     "counter",
		"counter":     "counter",
		"ChatAgent":   "chat-agent",
		"MY_AGENT":    "my-agent",
		"Agent_":      "agent",
		"A":           "a",
		"a1B2":        "a1-b2",
		"HTTPServer2": "h-t-t-p-server2",
		"_Private":    "--private",
		"x__":         "x-",
		"Über":        "Über",
		"123":         "123",
	}
	for in, want := range cases {
		if got := agent.Kebab(in); got != want {
			t.Errorf("Kebab(%q) = %q, want %q", in, got, want)
		}
	}
}

// Path.String and ParsePath round-trip names with '/', '%', spaces and other
// characters that would otherwise break the key.
func TestParsePathRoundTrip(t *testing.T) {
	paths := []agent.Path{
		agent.Root("Counter", "plain"),
		agent.Root("Counter", "a/b"),
		agent.Root("Counter", "100%"),
		agent.Root("Counter", "%2F"),
		agent.Root("Counter", "Room 1"),
		agent.Root("Counter", "sub"),
		agent.Root("Counter", "ünï ✓?#&="),
		agent.Root("Counter", "a/b").Child("Chat", "c d/e%f").Child("Chat", "x"),
	}
	seen := map[string]bool{}
	for _, p := range paths {
		key := p.String()
		if seen[key] {
			t.Errorf("two paths share the key %q", key)
		}
		seen[key] = true
		if strings.Count(key, "/") != 2*len(p)-1 {
			t.Errorf("key %q of %v has unescaped slashes", key, p)
		}
		back, err := agent.ParsePath(key)
		if err != nil {
			t.Errorf("ParsePath(%q): %v", key, err)
			continue
		}
		if !back.Equal(p) {
			t.Errorf("ParsePath(%q) = %#v, want %#v", key, back, p)
		}
	}
	for _, bad := range []string{"Counter", "Counter/a/Chat", "Counter/%zz"} {
		if _, err := agent.ParsePath(bad); err == nil {
			t.Errorf("ParsePath(%q) succeeded", bad)
		}
	}
}

func TestPathHelpers(t *testing.T) {
	root := agent.Root("A", "r")
	child := root.Child("B", "c")
	grand := child.Child("C", "g")
	if !grand.Parent().Equal(child) || !child.Parent().Equal(root) || root.Parent() != nil {
		t.Error("Parent chain is wrong")
	}
	if !grand.HasPrefix(root) || !grand.HasPrefix(grand) || root.HasPrefix(child) {
		t.Error("HasPrefix is wrong")
	}
	if agent.Root("A", "r2").Child("B", "c").HasPrefix(root) {
		t.Error("HasPrefix matched another root")
	}
	if !root.IsRoot() || child.IsRoot() || grand.Leaf() != (agent.Hop{Class: "C", Name: "g"}) {
		t.Error("IsRoot or Leaf is wrong")
	}
	// Child must not alias its receiver's backing array.
	a := child.Child("X", "1")
	b := child.Child("Y", "2")
	if a.Leaf().Class != "X" || b.Leaf().Class != "Y" {
		t.Error("Child results alias each other")
	}
}

// Register refuses duplicate classes, classes sharing a route, the reserved
// route "sub", and callables that do not exist or cannot be called.
func TestRegisterValidation(t *testing.T) {
	e := newRuntime(t, rtOptions{})
	h := newHooks()
	if err := e.rt.Register(probeClass(h)); err != nil {
		t.Fatal(err)
	}
	if err := e.rt.Register(probeClass(h)); err == nil {
		t.Error("duplicate class accepted")
	}
	bad := []agent.Class{
		{Name: "probe", New: func() agent.Agent { return &Probe{} }}, // same route "probe"
		{Name: "Sub", New: func() agent.Agent { return &Probe{} }},   // reserved route
		{Name: "NoNew"}, // no constructor
		{Name: "Nil", New: func() agent.Agent { return nil }}, // nil sample
		{Name: "Missing", New: func() agent.Agent { return &Probe{h: h} }, // unknown callable
			Callable: []string{"nope"}},
	}
	for _, c := range bad {
		if err := e.rt.Register(c); err == nil {
			t.Errorf("class %q accepted", c.Name)
		}
	}
	if name, ok := e.rt.ClassByRoute("probe"); !ok || name != "Probe" {
		t.Errorf("ClassByRoute(probe) = %q, %v", name, ok)
	}
	if got := e.rt.Route("Probe"); got != "probe" {
		t.Errorf("Route(Probe) = %q", got)
	}
	if name, ok := e.rt.ClassOf(&Probe{}); !ok || name != "Probe" {
		t.Errorf("ClassOf = %q, %v", name, ok)
	}
	e.start()
	if _, err := e.rt.Get(context.Background(), agent.Root("Unknown", "x")); err == nil {
		t.Error("Get of an unregistered class succeeded")
	}
	if _, err := e.rt.Get(context.Background(), agent.Root("Probe", "")); err == nil {
		t.Error("Get with an empty name succeeded")
	}
	if ok, _ := e.rt.Exists(context.Background(), agent.Root("Probe", "x")); ok {
		t.Error("a refused Get created an instance")
	}
}
