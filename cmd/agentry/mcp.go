package main

import (
	"fmt"
	"strings"

	"github.com/agentry/agentry/mcpclient"
)

// splitMCP takes serve's --mcp flags out of args and returns the other
// arguments and the servers they declare:
//
//	--mcp NAME=URL                  a streamable HTTP server
//	--mcp NAME=-- COMMAND ARGS…     a stdio server; the command and its
//	                                arguments run to the next --mcp or the
//	                                end of the line
//	--mcp 'NAME=-- COMMAND ARGS…'   the same in one argument (split at spaces)
//
// "-mcp" and "--mcp=…" are accepted too, as the flag package accepts them.
func splitMCP(args []string) ([]string, []mcpclient.Server, error) {
	var rest []string
	var servers []mcpclient.Server
	isMCP := func(a string) (value string, inline, ok bool) {
		for _, p := range []string{"--mcp", "-mcp"} {
			if a == p {
				return "", false, true
			}
			if v, found := strings.CutPrefix(a, p+"="); found {
				return v, true, true
			}
		}
		return "", false, false
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		value, inline, ok := isMCP(a)
		if !ok {
			rest = append(rest, a)
			continue
		}
		if !inline {
			if i+1 >= len(args) {
				return nil, nil, fmt.Errorf("--mcp needs NAME=URL or NAME=-- COMMAND ARGS…")
			}
			i++
			value = args[i]
		}
		name, spec, found := strings.Cut(value, "=")
		if !found || name == "" || spec == "" {
			return nil, nil, fmt.Errorf("--mcp %q: want NAME=URL or NAME=-- COMMAND ARGS…", value)
		}
		s := mcpclient.Server{Name: name}
		switch {
		case spec == "--":
			for i+1 < len(args) {
				if _, _, next := isMCP(args[i+1]); next {
					break
				}
				i++
				s.Args = append(s.Args, args[i])
			}
			if len(s.Args) == 0 {
				return nil, nil, fmt.Errorf("--mcp %s=--: no command follows", name)
			}
			s.Command, s.Args = s.Args[0], s.Args[1:]
		case strings.HasPrefix(spec, "-- "):
			f := strings.Fields(strings.TrimPrefix(spec, "-- "))
			if len(f) == 0 {
				return nil, nil, fmt.Errorf("--mcp %s=--: no command follows", name)
			}
			s.Command, s.Args = f[0], f[1:]
		case strings.HasPrefix(spec, "http://") || strings.HasPrefix(spec, "https://"):
			s.URL = spec
		default:
			return nil, nil, fmt.Errorf("--mcp %s=%s: want an http(s) URL or -- COMMAND ARGS…", name, spec)
		}
		if err := s.Check(); err != nil {
			return nil, nil, fmt.Errorf("--mcp: %w", err)
		}
		servers = append(servers, s)
	}
	return rest, servers, nil
}
