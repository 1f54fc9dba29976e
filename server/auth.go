package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"github.com/agentry/agentry/agent"
)

// admit runs the Authenticate and Authorize hooks on a request to path.
// It returns the request to serve: r with the caller's identity in its
// context when Authenticate gave one.
func (s *Server) admit(r *http.Request, path agent.Path) (*http.Request, error) {
	if s.opts.Authenticate != nil {
		id, err := s.opts.Authenticate(r)
		if err != nil {
			return r, err
		}
		if id != nil {
			r = r.WithContext(agent.WithIdentity(r.Context(), id))
		}
	}
	if s.opts.Authorize != nil {
		if err := s.opts.Authorize(r, path); err != nil {
			return r, err
		}
	}
	return r, nil
}

// Admit runs the server's Authenticate and Authorize hooks on a request
// addressed to the instance at path, as the agent routes do: another
// front door to the same runtime (the MCP endpoint) admits its callers
// with it. It returns r with the caller's identity in its context, or the
// hooks' refusal (see RefusalStatus).
func (s *Server) Admit(r *http.Request, path agent.Path) (*http.Request, error) {
	return s.admit(r, path)
}

// RefusalStatus returns the HTTP status and message that answer a refusal
// of Admit: an *agent.HTTPError's own, and 401 otherwise.
func RefusalStatus(err error) (status int, message string) {
	var he *agent.HTTPError
	if errors.As(err, &he) {
		return he.Status, he.Message
	}
	return http.StatusUnauthorized, "unauthorized"
}

// TokenQueryParam is the query parameter RequireToken reads a token from:
// what the npm clients send with useAgent({query: {token}}) or
// new AgentClient({query: {token}}), since a browser WebSocket cannot set
// headers.
const TokenQueryParam = "token"

// errBadToken is RequireToken's refusal: a 401 for HTTP, and for a
// WebSocket the default refusal, close 4001, on which the npm client stops
// reconnecting.
var errBadToken = &agent.HTTPError{Status: http.StatusUnauthorized, Message: "missing or wrong token"}

// RequireToken returns an Authorize hook that admits only the requests
// that carry token, either as an "Authorization: Bearer <token>" header or
// as the token query parameter (TokenQueryParam). The npm clients' chat
// history request (get-messages) carries the socket's query, so a client
// that connects with useAgent({query: {token}}) needs nothing else. Tokens
// are compared in constant time, their lengths included.
//
// It panics if token is empty. To combine it with a hook of your own, call
// it first:
//
//	check := server.RequireToken(token)
//	opts.Authorize = func(r *http.Request, p agent.Path) error {
//		if err := check(r, p); err != nil {
//			return err
//		}
//		return mine(r, p)
//	}
func RequireToken(token string) func(r *http.Request, path agent.Path) error {
	if token == "" {
		panic("server: RequireToken with an empty token")
	}
	want := sha256.Sum256([]byte(token))
	match := func(got string) bool {
		sum := sha256.Sum256([]byte(got))
		return subtle.ConstantTimeCompare(sum[:], want[:]) == 1
	}
	return func(r *http.Request, _ agent.Path) error {
		if got, ok := bearer(r.Header.Get("Authorization")); ok && match(got) {
			return nil
		}
		if got := r.URL.Query().Get(TokenQueryParam); got != "" && match(got) {
			return nil
		}
		return errBadToken
	}
}

// bearer returns the token of an "Authorization: Bearer <token>" header.
func bearer(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// CheckSubAgent decides, as a request for the sub-agent at path would be
// decided here, whether r may reach it: r is authenticated and authorized
// (Options.Authenticate, Options.Authorize) and the parent's gates run
// (agent.Runtime.CheckSubAgent). A cluster node that owns the parent
// answers with it when the request reached another node.
func (s *Server) CheckSubAgent(r *http.Request, path agent.Path) error {
	r, err := s.admit(r, path)
	if err != nil {
		return err
	}
	return s.rt.CheckSubAgent(r.Context(), r, path)
}
