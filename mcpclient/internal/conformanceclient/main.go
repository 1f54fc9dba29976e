// Command conformanceclient drives mcpclient through the client scenarios
// of the official MCP conformance suite (@modelcontextprotocol/conformance):
//
//	npx conformance client --command conformanceclient --scenario NAME
//
// The suite starts a server for the scenario and runs this command with
// the server's URL as its last argument and the scenario's name in
// $MCP_CONFORMANCE_SCENARIO. The command declares the server on an
// mcpclient.Client, as a chat agent's class would, and uses its tools
// through the chat.Tools the client made of them. It exits non-zero on a
// failure. mcpclient's TestConformanceClient runs it.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/mcpclient"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: conformanceclient SERVER-URL (scenario in $MCP_CONFORMANCE_SCENARIO)")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	if err := run(ctx, os.Getenv("MCP_CONFORMANCE_SCENARIO"), os.Args[len(os.Args)-1]); err != nil {
		fmt.Fprintln(os.Stderr, "conformanceclient:", err)
		os.Exit(1)
	}
}

// scenarios are the client scenarios this command runs; the others are
// listed with the reason in docs/mcp.md and skipped by the test.
var scenarios = map[string]func(ctx context.Context, mc *mcpclient.Client) error{
	// initialize: the handshake and a tools/list.
	"initialize": func(ctx context.Context, mc *mcpclient.Client) error { return nil },
	// tools_call: call add_numbers through its chat tool.
	"tools_call": func(ctx context.Context, mc *mcpclient.Client) error {
		return call(ctx, mc, "srv_add_numbers", `{"a":5,"b":3}`, "8")
	},
	// sse-retry: the call's SSE stream closes before the result; the
	// transport reconnects after the server's retry delay and gets it.
	"sse-retry": func(ctx context.Context, mc *mcpclient.Client) error {
		return call(ctx, mc, "srv_test_reconnection", `{}`, "Reconnection test completed")
	},
}

func run(ctx context.Context, scenario, url string) error {
	f, ok := scenarios[scenario]
	var oauth auth.OAuthHandler
	if strings.HasPrefix(scenario, "auth/") {
		// The auth scenarios: authorize with the SDK's OAuth handler,
		// then list and call test-tool.
		h, err := oauthHandler()
		if err != nil {
			return err
		}
		oauth, ok = h, true
		f = func(ctx context.Context, mc *mcpclient.Client) error {
			return call(ctx, mc, "srv_test-tool", `{}`, "")
		}
	}
	if !ok {
		return fmt.Errorf("scenario %q is not supported", scenario)
	}
	mc := mcpclient.New(mcpclient.Options{
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		ClientName:    "agentry-conformance",
		ClientVersion: "1.0.0",
	})
	defer mc.Close()
	if err := mc.AddServer(ctx, mcpclient.Server{Name: "srv", URL: url, CallTimeout: 20 * time.Second, OAuthHandler: oauth}); err != nil {
		return err
	}
	return f(ctx, mc)
}

// oauthHandler is the SDK's authorization-code handler as the suite's
// authorization server expects it: client registration by metadata
// document, dynamically, or with the pre-registered credentials the
// scenario passes in $MCP_CONFORMANCE_CONTEXT.
func oauthHandler() (auth.OAuthHandler, error) {
	cfg := &auth.AuthorizationCodeHandlerConfig{
		RedirectURL:                    "http://localhost:3000/callback",
		AuthorizationCodeFetcher:       fetchCode,
		ClientIDMetadataDocumentConfig: &auth.ClientIDMetadataDocumentConfig{URL: "https://conformance-test.local/client-metadata.json"},
		DynamicClientRegistrationConfig: &auth.DynamicClientRegistrationConfig{
			Metadata: &oauthex.ClientRegistrationMetadata{RedirectURIs: []string{"http://localhost:3000/callback"}},
		},
	}
	var sc struct {
		ClientID     string `json:"client_id"`
		ClientSecret string `json:"client_secret"`
	}
	if c := os.Getenv("MCP_CONFORMANCE_CONTEXT"); c != "" {
		if err := json.Unmarshal([]byte(c), &sc); err != nil {
			return nil, fmt.Errorf("MCP_CONFORMANCE_CONTEXT: %w", err)
		}
	}
	if sc.ClientID != "" && sc.ClientSecret != "" {
		cfg.PreregisteredClient = &oauthex.ClientCredentials{ClientID: sc.ClientID,
			ClientSecretAuth: &oauthex.ClientSecretAuth{ClientSecret: sc.ClientSecret}}
	}
	return auth.NewAuthorizationCodeHandler(cfg)
}

// fetchCode follows the authorization URL: the suite's authorization
// server redirects at once to the callback with the code and state.
func fetchCode(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, args.URL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		return nil, fmt.Errorf("authorization redirect: %w", err)
	}
	q := loc.Query()
	return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
}

// call runs the chat tool name with input and checks that its output
// contains want.
func call(ctx context.Context, mc *mcpclient.Client, name, input, want string) error {
	var tool *chat.Tool
	for _, t := range mc.Tools() {
		if t.Name == name {
			tool = &t
		}
	}
	if tool == nil {
		return fmt.Errorf("no tool %s among %v", name, mc.Status())
	}
	out, err := tool.Execute(ctx, json.RawMessage(input))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	b, _ := json.Marshal(out)
	if !strings.Contains(string(b), want) {
		return fmt.Errorf("%s returned %s; want it to contain %q", name, b, want)
	}
	fmt.Printf("%s: %s\n", name, b)
	return nil
}
