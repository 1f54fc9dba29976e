package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/client"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/server"
)

const testToken = "s3cret-token"

// startServe runs the serve command with args (on a free port and a
// temporary data folder) and getenv, and returns its host:port. The
// command is stopped and awaited at cleanup.
func startServe(t *testing.T, getenv func(string) string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	args = append([]string{"--addr", "127.0.0.1:0", "--data", t.TempDir(), "--delay", "0"}, args...)
	go func() {
		done <- serveContext(ctx, args, getenv, io.Discard, func(a net.Addr) { addrc <- a })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	select {
	case a := <-addrc:
		return a.String()
	case err := <-done:
		t.Fatalf("serve returned before listening: %v", err)
	}
	return ""
}

// httpGet sends a GET with header and returns the status.
func httpGet(t *testing.T, url string, header http.Header) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// dialAssistant connects to the Assistant with token ("" for none).
func dialAssistant(host, token string) (*client.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	return client.Dial(ctx, client.Options{Host: host, Agent: assistantClass, Name: "auth", Token: token})
}

func noEnv(string) string { return "" }

// TestServeAuthToken runs `agentry serve --auth-token`: the agent routes
// (HTTP, get-messages, WebSocket) refuse requests without the token and
// admit it as a Bearer header or the token query parameter; the
// playground's page stays public. $AGENTRY_AUTH_TOKEN does the same, and a
// serve without either is open as before.
func TestServeAuthToken(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		getenv func(string) string
	}{
		{"flag", []string{"--auth-token", testToken}, noEnv},
		{"env", nil, func(k string) string {
			if k == tokenEnv {
				return testToken
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := startServe(t, tc.getenv, tc.args...)
			base := "http://" + host
			msgs := base + "/agents/assistant/auth/get-messages"
			for _, c := range []struct {
				url    string
				header http.Header
				want   int
			}{
				{msgs, nil, http.StatusUnauthorized},
				{msgs + "?token=wrong", nil, http.StatusUnauthorized},
				{msgs, http.Header{"Authorization": {"Bearer wrong"}}, http.StatusUnauthorized},
				{base + "/agents/assistant/auth/sub/researcher/r1/get-messages", nil, http.StatusUnauthorized},
				{msgs, http.Header{"Authorization": {"Bearer " + testToken}}, http.StatusOK},
				{msgs + "?token=" + testToken, nil, http.StatusOK},
				{base + "/", nil, http.StatusOK}, // the playground page
			} {
				if got := httpGet(t, c.url, c.header); got != c.want {
					t.Errorf("GET %s (%v) = %d, want %d", c.url, c.header, got, c.want)
				}
			}
			_, err := dialAssistant(host, "")
			if ce := (*client.CloseError)(nil); !errors.As(err, &ce) || ce.Code != 4001 {
				t.Errorf("WebSocket without the token: %v, want close 4001", err)
			}
			_, err = dialAssistant(host, "wrong")
			if ce := (*client.CloseError)(nil); !errors.As(err, &ce) || ce.Code != 4001 {
				t.Errorf("WebSocket with a wrong token: %v, want close 4001", err)
			}
			conn, err := dialAssistant(host, testToken)
			if err != nil {
				t.Fatalf("WebSocket with the token: %v", err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			if _, err := conn.Call(ctx, "listHelperRuns"); err != nil {
				t.Errorf("a call with the token: %v", err)
			}
			if _, err := conn.Chat().Messages(ctx); err != nil {
				t.Errorf("get-messages through the client with Options.Token: %v", err)
			}
		})
	}
	t.Run("open", func(t *testing.T) {
		host := startServe(t, noEnv)
		if got := httpGet(t, "http://"+host+"/agents/assistant/auth/get-messages", nil); got != http.StatusOK {
			t.Errorf("get-messages without --auth-token = %d, want 200", got)
		}
	})
}

// startTokenServer starts the agents-as-tools demo (offline models) behind
// server.RequireToken(testToken), as `agentry serve --auth-token` does.
func startTokenServer(t *testing.T) *testenv.Env {
	t.Helper()
	return testenv.Start(t, testenv.Options{
		Classes: agentsastools.Classes(agentsastools.Options{Models: agentsastools.Offline(0, nil)}),
		Setup: func(rt *agent.Runtime) error {
			chat.Configure(rt, chat.Config{})
			agenttool.Install(rt, agenttool.Options{})
			return nil
		},
		Server: server.Options{Authorize: server.RequireToken(testToken)},
	})
}

// TestRunsToken runs `agentry runs` against a server that requires a
// token: refused without it or with a wrong one (an error that names
// --token), admitted with --token or $AGENTRY_AUTH_TOKEN.
func TestRunsToken(t *testing.T) {
	host := startServe(t, noEnv, "--auth-token", testToken)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := runRuns(ctx, append([]string{"--addr", host}, args...), &out)
		return out.String(), err
	}
	t.Setenv(tokenEnv, "")
	for _, args := range [][]string{{"list"}, {"--token", "wrong", "list"}, {"clear"}} {
		out, err := run(args...)
		if err == nil || !strings.Contains(err.Error(), "refused the token") || !strings.Contains(err.Error(), "--token") {
			t.Errorf("runs %v without the token: err = %v, want a refusal naming --token\n%s", args, err, out)
		}
	}
	if out, err := run("--token", testToken, "list"); err != nil || !strings.Contains(out, "no runs") {
		t.Errorf("runs list --token: %v\n%s", err, out)
	}
	if out, err := run("list", "--token", testToken); err != nil {
		t.Errorf("runs list with --token after the subcommand: %v\n%s", err, out)
	}
	t.Setenv(tokenEnv, testToken)
	if out, err := run("list"); err != nil {
		t.Errorf("runs list with $%s: %v\n%s", tokenEnv, err, out)
	}
	if out, err := run("--token", "wrong", "list"); err == nil {
		t.Errorf("--token wrong must win over a right $%s:\n%s", tokenEnv, out)
	}
}

// TestChatToken runs `agentry chat --token` against a server that requires
// it: the turn completes; without the token the command fails at once.
func TestChatToken(t *testing.T) {
	t.Setenv(tokenEnv, "")
	env := startTokenServer(t)
	c := startChat(t, env, false, "--token", testToken)
	c.say(t, "Research quantum computing")
	c.out.waitFor(t, `^assistant> Quantum computing is worth knowing well\.$`)
	c.exit(t)

	refused := startChat(t, env, false)
	all := refused.out.rest()
	err := <-refused.done
	if err == nil || !strings.Contains(err.Error(), "refused the token") {
		t.Errorf("chat without the token: err = %v\n%s", err, all)
	}
}
