package main

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/client"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/mcpclient"
)

// TestSplitMCP covers the forms of --mcp.
func TestSplitMCP(t *testing.T) {
	rest, servers, err := splitMCP([]string{"--addr", "x", "--mcp", "docs=https://example.com/mcp", "-v",
		"--mcp=fs=-- npx -y server /tmp", "-mcp", "ev=--", "node", "ev.js", "stdio", "--mcp", "two=--", "cmd", "--flag"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"--addr", "x", "-v"}; !reflect.DeepEqual(rest, want) {
		t.Errorf("rest %q, want %q", rest, want)
	}
	want := []mcpclient.Server{
		{Name: "docs", URL: "https://example.com/mcp"},
		{Name: "fs", Command: "npx", Args: []string{"-y", "server", "/tmp"}},
		{Name: "ev", Command: "node", Args: []string{"ev.js", "stdio"}},
		{Name: "two", Command: "cmd", Args: []string{"--flag"}},
	}
	if !reflect.DeepEqual(servers, want) {
		t.Errorf("servers %+v, want %+v", servers, want)
	}
	for _, bad := range [][]string{
		{"--mcp"},
		{"--mcp", "noequals"},
		{"--mcp", "x=ftp://host"},
		{"--mcp", "x=--"},
		{"--mcp", "bad_name=http://h"},
	} {
		if _, _, err := splitMCP(bad); err == nil {
			t.Errorf("splitMCP(%q) succeeded", bad)
		}
	}
}

// TestServeMCP runs `agentry serve --mcp ev=-- node server-everything
// stdio`: the demo Assistant (offline model) calls the MCP server's echo
// tool when asked, and the call is a tool part like any other.
func TestServeMCP(t *testing.T) {
	testenv.RequireMCP(t)
	everything := filepath.Join(testenv.MCPDir(), "node_modules", "@modelcontextprotocol", "server-everything", "dist", "index.js")
	host := startServe(t, noEnv, "--mcp", "ev=--", "node", everything, "stdio")
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	conn, err := client.Dial(ctx, client.Options{Host: host, Agent: assistantClass, Name: "mcp"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s, err := conn.Chat().Send(ctx, `call ev_echo {"message":"from the playground"}`)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var tool *message.Part
	for i, p := range res.Message.Parts {
		if p.IsTool() {
			tool = &res.Message.Parts[i]
		}
	}
	if tool == nil || tool.ToolName() != "ev_echo" || tool.State != message.StateOutputAvailable || string(tool.Output) != `"Echo: from the playground"` {
		t.Fatalf("tool part %+v", tool)
	}
	var text string
	for _, p := range res.Message.Parts {
		if p.Type == message.PartText {
			text += p.Text
		}
	}
	if !strings.Contains(text, "Echo: from the playground") {
		t.Fatalf("answer %q", text)
	}
}
