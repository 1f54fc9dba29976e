package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/client"
)

// CheckResult is the final transcript check.
type CheckResult struct {
	// Transcripts and Messages are how many were read.
	Transcripts, Messages int
	// Sent and Answers are the user messages sent and answers received
	// that the check looked for.
	Sent, Answers int
	// Problems are what is wrong, one line each.
	Problems []string
}

// OK reports whether every transcript passed.
func (c CheckResult) OK() bool { return len(c.Problems) == 0 }

// Print writes the result for people.
func (c CheckResult) Print(w io.Writer) {
	fmt.Fprintf(w, "transcripts: %d read, %d messages; %d sent messages and %d answers looked for: ", c.Transcripts, c.Messages, c.Sent, c.Answers)
	if c.OK() {
		fmt.Fprintln(w, "nothing lost, nothing doubled")
		return
	}
	fmt.Fprintf(w, "%d problems\n", len(c.Problems))
	for i, p := range c.Problems {
		if i == 20 {
			fmt.Fprintf(w, "  … and %d more\n", len(c.Problems)-i)
			break
		}
		fmt.Fprintln(w, "  "+p)
	}
}

// check reads every instance's transcript, and every drilled child's, and
// checks them.
func (g *gen) check(ctx context.Context, insts []*instance) CheckResult {
	var mu sync.Mutex
	var res CheckResult
	add := func(ms []message.Message, probs []string, sent, answers int) {
		mu.Lock()
		res.Transcripts++
		res.Messages += len(ms)
		res.Sent += sent
		res.Answers += answers
		res.Problems = append(res.Problems, probs...)
		mu.Unlock()
	}
	eg, ctx := errgroup.WithContext(ctx)
	eg.SetLimit(16)
	for _, in := range insts {
		in.mu.Lock()
		exp := expect{sent: in.sent, answers: in.answers, notices: in.notices}
		var kids []*childRecord
		for _, c := range in.children {
			kids = append(kids, c)
		}
		in.mu.Unlock()
		eg.Go(func() error {
			ms, err := g.messages(ctx, in.name, nil)
			if err != nil {
				add(nil, []string{err.Error()}, 0, 0)
				return nil
			}
			add(ms, checkTranscript(in.name, ms, exp), len(exp.sent), len(exp.answers))
			return nil
		})
		for _, c := range kids {
			eg.Go(func() error {
				hop := &client.Hop{Agent: c.sub.Agent, Name: c.sub.Name}
				name := in.name + "/sub/" + c.sub.Name
				ms, err := g.messages(ctx, in.name, hop)
				if err != nil {
					add(nil, []string{err.Error()}, 0, 0)
					return nil
				}
				add(ms, checkTranscript(name, ms, expect{sent: c.sent, answers: c.answers}), len(c.sent), len(c.answers))
				return nil
			})
		}
	}
	_ = eg.Wait()
	return res
}

// messages reads a transcript with GET …/get-messages, as useAgentChat
// does on mount.
func (g *gen) messages(ctx context.Context, name string, sub *client.Hop) ([]message.Message, error) {
	u := g.cfg.URLs[0] + "/agents/assistant/" + client.EncodeURIComponent(name)
	if sub != nil {
		u += "/sub/" + agent.Kebab(sub.Agent) + "/" + client.EncodeURIComponent(sub.Name)
	}
	u += "/get-messages"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if g.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+g.cfg.Token)
	}
	resp, err := g.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("get messages of %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("get messages of %s: %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	var ms []message.Message
	if err := json.NewDecoder(resp.Body).Decode(&ms); err != nil {
		return nil, fmt.Errorf("get messages of %s: %w", u, err)
	}
	return ms, nil
}

// expect is what one transcript must hold.
type expect struct {
	sent, answers []string
	// notices are background runs whose completion notice must be there.
	notices []string
}

// checkTranscript returns what is wrong with ms, one line each, naming the
// transcript: duplicate message ids or tool call ids, a message sent or an
// answer received that is missing or there twice, a user message not
// answered exactly once (the assistant messages up to the next user
// message, not counting milestone narrations), a missing completion
// notice.
func checkTranscript(name string, ms []message.Message, exp expect) []string {
	var probs []string
	bad := func(format string, args ...any) {
		probs = append(probs, name+": "+fmt.Sprintf(format, args...))
	}
	ids := map[string]int{}
	calls := map[string]int{}
	for _, m := range ms {
		ids[m.ID]++
		for _, p := range m.Parts {
			if p.IsTool() && p.ToolCallID != "" {
				calls[p.ToolCallID]++
			}
		}
	}
	for id, n := range ids {
		if n > 1 {
			bad("message id %s appears %d times", id, n)
		}
	}
	for id, n := range calls {
		if n > 1 {
			bad("tool call id %s appears %d times", id, n)
		}
	}
	for _, id := range exp.sent {
		if ids[id] != 1 {
			bad("sent message %s appears %d times", id, ids[id])
		}
	}
	for _, id := range exp.answers {
		if ids[id] != 1 {
			bad("answer %s appears %d times", id, ids[id])
		}
	}
	for _, run := range exp.notices {
		n := 0
		for id := range ids {
			if strings.HasPrefix(id, "detached-finish:"+run+":") {
				n++
			}
		}
		if n != 1 {
			bad("background run %s has %d completion notices", run, n)
		}
	}
	for i, m := range ms {
		if m.Role != message.RoleUser {
			continue
		}
		n := 0
		for _, a := range ms[i+1:] {
			if a.Role == message.RoleUser {
				break
			}
			if a.Role == message.RoleAssistant && !strings.HasPrefix(a.ID, "detached-ms:") {
				n++
			}
		}
		if n != 1 {
			bad("user message %s (%.40q) is answered %d times", m.ID, textOf(m), n)
		}
	}
	return probs
}

// textOf is the text of a message's text parts.
func textOf(m message.Message) string {
	var b strings.Builder
	for _, p := range m.Parts {
		if p.Type == message.PartText {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}
