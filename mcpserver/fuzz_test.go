package mcpserver_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// FuzzRequest posts arbitrary JSON-RPC bodies to the /mcp request path,
// in an initialized session, and checks that the endpoint answers each one
// with a response and never a server error: malformed frames, unknown
// methods, invalid tool input and guessed task ids are the client's.
func FuzzRequest(f *testing.F) {
	for _, seed := range []string{
		initBody,
		`{"jsonrpc":"2.0","id":2,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}`,
		`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"ask","arguments":{"q":"x"}}}`,
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"ask","arguments":{"q":1}}}`,
		`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"ask","arguments":{"q":"x"},"task":{"ttl":1}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tasks/get","params":{"taskId":"eyJjIjoiQm9zcyJ9"}}`,
		`{"jsonrpc":"2.0","id":8,"method":"tasks/list","params":{"cursor":"-1"}}`,
		`{"jsonrpc":"2.0","id":9,"method":"tasks/result","params":{}}`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`,
		`{"jsonrpc":"2.0","id":null,"method":"initialize"}`,
		`not json`,
	} {
		f.Add([]byte(seed))
	}
	url := startAuth(f)
	alice := map[string]string{"Authorization": "Bearer alice-token", "MCP-Protocol-Version": "2025-11-25"}
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(initBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", alice["Authorization"])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.Fatal(err)
	}
	resp.Body.Close()
	alice["Mcp-Session-Id"] = resp.Header.Get("Mcp-Session-Id")
	post(f, url, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, alice)
	f.Fuzz(func(t *testing.T, body []byte) {
		if bytes.Contains(body, []byte(`"initialize"`)) {
			return // a second initialize ends nothing, but is not the path under test
		}
		code, text := post(t, url, string(body), alice)
		if code >= 500 && code != http.StatusServiceUnavailable {
			t.Fatalf("%q: %d %s", body, code, text)
		}
	})
}
