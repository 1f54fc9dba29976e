package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/server"
)

// doHTTP sends a GET to path with header and returns the response's
// status, WWW-Authenticate header and body.
func doHTTP(t *testing.T, env *testenv.Env, path string, header http.Header) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+env.Host+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), b.String()
}

func bearerHeader(tok string) http.Header {
	return http.Header{"Authorization": {"Bearer " + tok}}
}

// RequireToken admits a request only with the token, as a Bearer header or
// the token query parameter, over HTTP and WebSocket, sub-agent routes
// included; a refused WebSocket is accepted and closed with 4001 before any
// frame, a refused HTTP request gets 401 with WWW-Authenticate, and a
// refused request creates nothing.
func TestRequireToken(t *testing.T) {
	h := newHooks()
	env := testenv.Start(t, testenv.Options{
		Classes: []agent.Class{hookedClass(h)},
		Server:  server.Options{Authorize: server.RequireToken("s3cret")},
	})
	refusedWS := map[string]http.Header{
		"/agents/hooked/tok":                           nil,
		"/agents/hooked/tok?token=wrong":               nil,
		"/agents/hooked/tok?token=s3cre":               nil, // a prefix
		"/agents/hooked/tok?token=s3cret2":             nil, // longer
		"/agents/hooked/tok?_pk=x":                     bearerHeader("wrong"),
		"/agents/hooked/tok?Token=s3cret":              nil, // the parameter's name is exact
		"/agents/hooked/tok/sub/hooked/kid":            nil,
		"/agents/hooked/tok?token=":                    {"Authorization": {"Basic czNjcmV0"}},
		"/agents/hooked/tok?access_token=s3cret&x=abc": {"Authorization": {"Bearer"}},
	}
	for path, hdr := range refusedWS {
		c := dialHeader(t, env, path, hdr)
		if code, reason := c.closed(); code != 4001 {
			t.Errorf("%s (%v): closed with %d %q, want 4001", path, hdr, code, reason)
		}
		if n := len(c.frames); n != 0 {
			t.Errorf("%s: a refused socket got %d frames", path, n)
		}
	}
	refusedHTTP := map[string]http.Header{
		"/agents/hooked/tok/x":                   nil,
		"/agents/hooked/tok/x?token=wrong":       nil,
		"/agents/hooked/tok/get-messages":        nil,
		"/agents/hooked/tok/y":                   bearerHeader("S3CRET"), // tokens are case-sensitive
		"/agents/hooked/tok/sub/hooked/kid/info": {"X-Token": {"s3cret"}},
	}
	for path, hdr := range refusedHTTP {
		status, www, body := doHTTP(t, env, path, hdr)
		if status != http.StatusUnauthorized || www != "Bearer" || !strings.Contains(body, "missing or wrong token") {
			t.Errorf("%s (%v) = %d %q %q, want 401 with WWW-Authenticate: Bearer", path, hdr, status, www, body)
		}
	}
	if ok, _ := env.RT.Exists(context.Background(), agent.Root("Hooked", "tok")); ok {
		t.Fatal("refused requests created the instance")
	}
	if n := h.starts.Load(); n != 0 {
		t.Fatalf("refused requests started %d instances", n)
	}

	for path, hdr := range map[string]http.Header{
		"/agents/hooked/tok?token=s3cret&_pk=q": nil,
		"/agents/hooked/tok?_pk=b":              bearerHeader("s3cret"),
		"/agents/hooked/tok?_pk=lower":          {"Authorization": {"bearer s3cret"}},
		"/agents/hooked/tok?token=wrong&_pk=w":  bearerHeader("s3cret"), // either place admits
	} {
		c := dialHeader(t, env, path, hdr)
		c.handshake()
		c.expectType("welcome")
		if got := c.ok("echo", "hi"); got != "hi" {
			t.Errorf("%s: echo = %v", path, got)
		}
	}
	for path, hdr := range map[string]http.Header{
		"/agents/hooked/tok/x?token=s3cret&q=v":  nil,
		"/agents/hooked/tok/x?q=v":               bearerHeader("s3cret"),
		"/agents/hooked/tok/sub/hooked/kid/info": bearerHeader("s3cret "), // spaces around it are trimmed
	} {
		if status, _, body := doHTTP(t, env, path, hdr); status != http.StatusOK || !strings.Contains(body, "GET path=/") {
			t.Errorf("%s (%v) = %d %q, want 200 from OnRequest", path, hdr, status, body)
		}
	}
}

// RequireToken refuses to build a hook that would admit an empty token.
func TestRequireTokenEmpty(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("RequireToken(\"\") did not panic")
		}
	}()
	server.RequireToken("")
}
