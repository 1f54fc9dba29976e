package clustercrash

// Runs that wait for input when the parent and the child are on different
// nodes: a child's approval request and client-tool call, answered from
// the parent's connection (through a node that owns neither) and from the
// drill-in chat, and the run's usage carried to its result.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/cluster"
	"github.com/agentry/agentry/internal/testkit/testenv"
	"github.com/agentry/agentry/wire"
)

// socket is a WebSocket client (testenv.WSClient) that waits on the raw
// frames and the agent-tool events.
type socket struct {
	t  *testing.T
	ws *testenv.WSClient[frame]
}

func dialSocket(t *testing.T, ctx context.Context, url string) *socket {
	t.Helper()
	limit := 60 * time.Second
	if d, ok := ctx.Deadline(); ok {
		limit = time.Until(d)
	}
	ws := testenv.DialWS[frame](t, limit, url)
	t.Cleanup(ws.CloseNormally)
	return &socket{t: t, ws: ws}
}

func (s *socket) send(ctx context.Context, v any) {
	s.t.Helper()
	if err := s.ws.SendContext(ctx, v); err != nil {
		s.t.Fatalf("send: %v", err)
	}
}

// split returns the raw frames and the agent-tool events among them.
func split(all []testenv.Frame[frame]) (raw []string, events []frame) {
	for _, f := range all {
		raw = append(raw, string(f.Raw))
		if f.Value.Type == wire.AgentToolEvent {
			events = append(events, f.Value)
		}
	}
	return raw, events
}

// wait waits until pred holds for the raw frames and the agent-tool
// events so far.
func (s *socket) wait(ctx context.Context, what string, pred func(raw []string, fs []frame) bool) []frame {
	s.t.Helper()
	var events []frame
	all, err := s.ws.Wait(ctx, func(all []testenv.Frame[frame]) bool {
		var raw []string
		raw, events = split(all)
		return pred(raw, events)
	})
	if err != nil {
		raw, _ := split(all)
		s.t.Fatalf("waiting for %s: %v; frames:\n%s", what, err, strings.Join(raw, "\n"))
	}
	return events
}

// chunks returns the run's chunk bodies among the events, in order.
func chunks(fs []frame, run string) []string {
	var out []string
	for _, f := range fs {
		if f.Event.RunID == run && f.Event.Kind == "chunk" {
			out = append(out, f.Event.Body)
		}
	}
	return out
}

func index(bodies []string, s string) int {
	for i, b := range bodies {
		if strings.Contains(b, s) {
			return i
		}
	}
	return -1
}

// waitingCallOf waits until the run's events carry the child's wait for
// input (the call's chunk of type typ, and the waiting progress) and
// returns the call's id.
func (s *socket) waitingCallOf(ctx context.Context, run, typ string) string {
	s.t.Helper()
	var call string
	s.wait(ctx, "the run waiting for input", func(_ []string, fs []frame) bool {
		bodies := chunks(fs, run)
		i := index(bodies, `"type":"`+typ+`"`)
		if i < 0 || index(bodies, "waiting-for-input") < i {
			return false
		}
		var c struct {
			ToolCallID string `json:"toolCallId"`
		}
		_ = json.Unmarshal([]byte(bodies[i]), &c)
		call = c.ToolCallID
		return call != ""
	})
	return call
}

// ended waits for the run's end event and returns the events.
func (s *socket) ended(ctx context.Context, run string) []frame {
	s.t.Helper()
	return s.wait(ctx, "the end of "+run, func(_ []string, fs []frame) bool {
		for _, f := range fs {
			if f.Event.RunID == run && f.Event.Kind == "finished" {
				return true
			}
		}
		return false
	})
}

type runResult struct {
	Status  string `json:"status"`
	Summary string `json:"summary"`
	Error   string `json:"error"`
	Usage   *struct {
		TotalTokens int `json:"totalTokens"`
	} `json:"usage"`
}

// startRun runs an awaited run of class on the Fan through host, in the
// background.
func startRun(t *testing.T, host, name, class, run string) <-chan runResult {
	ch := make(chan runResult, 1)
	go func() {
		var res runResult
		if err := get(t, host, "/agents/fan/"+name+"/run?class="+class+"&id="+run, &res); err != nil {
			res.Error = err.Error()
		}
		ch <- res
	}()
	return ch
}

// lastTreeUsage is the tree usage the run's last usage report carried.
func lastTreeUsage(bodies []string) int {
	n := 0
	for _, b := range bodies {
		var c struct {
			MessageMetadata struct {
				TreeUsage *struct {
					TotalTokens int `json:"totalTokens"`
				} `json:"treeUsage"`
			} `json:"messageMetadata"`
		}
		if json.Unmarshal([]byte(b), &c) == nil && c.MessageMetadata.TreeUsage != nil {
			n = c.MessageMetadata.TreeUsage.TotalTokens
		}
	}
	return n
}

// TestRemoteWaitForInput runs children on c that wait for input, for a
// parent on a, with the parent's client connected through b: a Pub
// child's approval of publish_findings, approved and then denied from the
// parent's connection (agent_tool_approval, forwarded to a, which gives it
// to c over a node call); a Clock child's client tool answered from the
// parent's connection (agent_tool_result); a Pub child's approval
// answered from the drill-in chat (routed to c). Each time the parent's
// client sees the wait, then the continuation and the end; the run
// completes with the child's answer and its usage. The answer-child node
// call refuses a request without the secret, bad input, and a run the
// child does not have.
func TestRemoteWaitForInput(t *testing.T) {
	e := newEnv(t)
	_, b, c := e.three()
	name := e.fanName("a")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	parent := dialSocket(t, ctx, "ws://"+b.Host+"/agents/fan/"+name)

	check := func(run string, res runResult, summary string, fs []frame, marker string) {
		t.Helper()
		if res.Status != "completed" || !strings.Contains(res.Summary, summary) {
			t.Errorf("run %s: %+v, want completed with %q", run, res, summary)
		}
		bodies := chunks(fs, run)
		wait, resumed, cont := index(bodies, "waiting-for-input"), index(bodies, "Input received"), index(bodies, marker)
		if wait < 0 || resumed < wait || cont < resumed {
			t.Errorf("run %s's timeline: waiting %d, input received %d, continuation %d:\n%s", run, wait, resumed, cont, strings.Join(bodies, "\n"))
		}
		if u := lastTreeUsage(bodies); u == 0 || res.Usage == nil || res.Usage.TotalTokens != u {
			t.Errorf("run %s: usage %+v, want the child's last report, %d tokens", run, res.Usage, u)
		}
	}

	for i, tc := range []struct {
		approved bool
		summary  string
		marker   string
	}{
		{true, "published t", `"type":"tool-output-available"`},
		{false, "denied", `"type":"tool-output-denied"`},
	} {
		run := e.tagOn(name, "Pub", fmt.Sprint("ap", i, "-"), "c") + "-0"
		done := startRun(t, b.Host, name, "Pub", run)
		call := parent.waitingCallOf(ctx, run, "tool-approval-request")
		if i == 0 {
			parent.send(ctx, map[string]any{"type": wire.AgentToolApproval, "runId": "nope", "toolCallId": call, "approved": true})
			parent.wait(ctx, "the refusal of an unknown run", func(raw []string, _ []frame) bool {
				return index(raw, "unknown_run") >= 0
			})
		}
		parent.send(ctx, map[string]any{"type": wire.AgentToolApproval, "runId": run, "toolCallId": call, "approved": tc.approved})
		res := <-done
		check(run, res, tc.summary, parent.ended(ctx, run), tc.marker)
	}

	// A client tool's output, from the parent's connection.
	run := e.tagOn(name, "Clock", "ct", "c") + "-0"
	done := startRun(t, b.Host, name, "Clock", run)
	call := parent.waitingCallOf(ctx, run, "tool-input-available")
	// An approval is not what this call waits for (refused on c, 409).
	parent.send(ctx, map[string]any{"type": wire.AgentToolApproval, "runId": run, "toolCallId": call, "approved": true})
	parent.wait(ctx, "the refusal of a wrong answer", func(raw []string, _ []frame) bool {
		return index(raw, "tool_call_not_waiting") >= 0
	})
	parent.send(ctx, map[string]any{"type": wire.AgentToolResult, "runId": run, "toolCallId": call, "output": map[string]any{"time": "10:42"}})
	check(run, <-done, `the time is {"time":"10:42"}`, parent.ended(ctx, run), `"delta":"the time"`)

	// The drill-in chat, through b: routed to c, the child's owner.
	run = e.tagOn(name, "Pub", "dr", "c") + "-0"
	done = startRun(t, b.Host, name, "Pub", run)
	call = parent.waitingCallOf(ctx, run, "tool-approval-request")
	drill := dialSocket(t, ctx, "ws://"+b.Host+"/agents/fan/"+name+"/sub/pub/"+run+"?drill=yes")
	drill.send(ctx, map[string]any{"type": wire.ToolApproval, "toolCallId": call, "approved": true, "autoContinue": true})
	check(run, <-done, "published t", parent.ended(ctx, run), `"type":"tool-output-available"`)

	// The node call itself.
	peer := "http://" + c.Host + cluster.PeerPrefix + "answer-child"
	if code, _ := fetch(t, "POST", peer, nil, []byte(`{}`)); code != http.StatusForbidden {
		t.Errorf("answer-child without the secret: %d, want 403", code)
	}
	var secret string
	if err := e.pool.QueryRow(context.Background(), `SELECT value FROM cluster_config WHERE key = 'peer_secret'`).Scan(&secret); err != nil {
		t.Fatal(err)
	}
	auth := http.Header{"X-Agentry-Cluster-Secret": {secret}}
	guess := e.tagOn(name, "Pub", "guess", "c") + "-0"
	child := fmt.Sprintf(`[{"class":"Fan","name":%q},{"class":"Pub","name":%q}]`, name, guess)
	for _, tc := range []struct {
		body string
		code int
	}{
		{`{"child":`, http.StatusBadRequest},
		{`{"child":[{"class":"Fan","name":"x"}],"runId":"x","toolCallId":"c","kind":"approval"}`, http.StatusBadRequest},
		{`{"child":` + child + `,"runId":"other","toolCallId":"c","kind":"approval"}`, http.StatusBadRequest},
		{`{"child":` + child + `,"runId":"` + guess + `","toolCallId":"c","kind":"maybe"}`, http.StatusBadRequest},
		{`{"child":` + child + `,"runId":"` + guess + `","toolCallId":"c","kind":"approval","approved":true}`, http.StatusNotFound},
	} {
		if code, body := fetch(t, "POST", peer, auth, []byte(tc.body)); code != tc.code || body == "" {
			t.Errorf("answer-child %s: %d %q, want %d with a reason", tc.body, code, body, tc.code)
		}
	}
	if resident(t, c.Host, agent.Root("Fan", name).Child("Pub", guess)) {
		t.Error("an answer for a guessed run woke an instance on c")
	}
}
