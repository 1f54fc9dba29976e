package agent

import (
	"fmt"
	"net/url"
	"strings"
)

// Hop is one step of an instance path: a class and an instance name.
type Hop struct {
	Class string
	Name  string
}

// Path addresses an agent instance: the root instance's class and name, then
// each sub-agent's class and name.
type Path []Hop

// Root returns the path of a root instance; class is a class name or a
// ClassHandle.
func Root[C ClassName](class C, name string) Path { return Path{{Class: string(class), Name: name}} }

// Child returns the path of p's sub-agent of class and name.
func (p Path) Child(class, name string) Path {
	out := make(Path, len(p), len(p)+1)
	copy(out, p)
	return append(out, Hop{Class: class, Name: name})
}

// Parent returns the parent's path, or nil for a root instance.
func (p Path) Parent() Path {
	if len(p) <= 1 {
		return nil
	}
	return p[:len(p)-1]
}

// Leaf returns the last hop.
func (p Path) Leaf() Hop { return p[len(p)-1] }

// IsRoot reports whether p addresses a root instance.
func (p Path) IsRoot() bool { return len(p) == 1 }

// String returns the path's storage key, "Class/name/Child/name", with names
// escaped so the key can be split again.
func (p Path) String() string {
	var b strings.Builder
	for i, h := range p {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(h.Class)
		b.WriteByte('/')
		b.WriteString(url.PathEscape(h.Name))
	}
	return b.String()
}

// Equal reports whether p and q address the same instance.
func (p Path) Equal(q Path) bool {
	if len(p) != len(q) {
		return false
	}
	for i := range p {
		if p[i] != q[i] {
			return false
		}
	}
	return true
}

// HasPrefix reports whether p is q or a descendant of q.
func (p Path) HasPrefix(q Path) bool { return len(p) >= len(q) && p[:len(q)].Equal(q) }

// ParsePath parses a key produced by Path.String.
func ParsePath(key string) (Path, error) {
	parts := strings.Split(key, "/")
	if len(parts)%2 != 0 || len(parts) == 0 {
		return nil, fmt.Errorf("agent: malformed path %q", key)
	}
	p := make(Path, 0, len(parts)/2)
	for i := 0; i < len(parts); i += 2 {
		name, err := url.PathUnescape(parts[i+1])
		if err != nil {
			return nil, fmt.Errorf("agent: malformed path %q: %w", key, err)
		}
		p = append(p, Hop{Class: parts[i], Name: name})
	}
	return p, nil
}

// Kebab returns the route name of a class exactly as the npm agents client
// computes it (camelCaseToKebabCase): "AIAssistant" becomes "a-i-assistant",
// "ABC" becomes "abc" and "my_agent" becomes "my-agent".
func Kebab(s string) string {
	if s == strings.ToUpper(s) && s != strings.ToLower(s) {
		return strings.ReplaceAll(strings.ToLower(s), "_", "-")
	}
	var b strings.Builder
	for _, r := range s {
		if r >= 'A' && r <= 'Z' {
			b.WriteByte('-')
			b.WriteRune(r + ('a' - 'A'))
			continue
		}
		b.WriteRune(r)
	}
	out := strings.TrimPrefix(b.String(), "-")
	out = strings.ReplaceAll(out, "_", "-")
	return strings.TrimSuffix(out, "-")
}
