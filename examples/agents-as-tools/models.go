package agentsastools

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/agentry/agentry/chat/message"
	"github.com/agentry/agentry/model"
	"github.com/agentry/agentry/model/anthropic"
	"github.com/agentry/agentry/model/openai"
	"github.com/agentry/agentry/model/scripted"
)

// FromEnv returns real models when OPENAI_API_KEY (with optional
// OPENAI_BASE_URL and AGENTRY_MODEL) or ANTHROPIC_API_KEY is set, and the
// offline scripted models otherwise. The name says which.
func FromEnv(delay time.Duration) (*Models, string) {
	var m model.Model
	switch {
	case os.Getenv("OPENAI_API_KEY") != "":
		m = openai.FromEnv()
		return &Models{Assistant: m, Researcher: m, Planner: m}, "openai"
	case os.Getenv("ANTHROPIC_API_KEY") != "":
		m = anthropic.FromEnv()
		return &Models{Assistant: m, Researcher: m, Planner: m}, "anthropic"
	}
	return Offline(delay, nil), "scripted"
}

// Offline returns scripted models that make the demo behave like a real
// model, with no network: children stream their text in chunks of at most
// 8 characters, delay apart. clock drives the delay (nil: real time).
func Offline(delay time.Duration, clock clockwork.Clock) *Models {
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	opts := func(rules ...scripted.Rule) []scripted.Option {
		return []scripted.Option{scripted.WithChunkSize(8), scripted.WithDelay(delay), scripted.WithClock(clock), scripted.WithRules(rules...),
			scripted.WithMaxCalls(-1)} // a server's models: nobody reads their calls
	}
	return &Models{
		Assistant:  scripted.New(opts(assistantRules()...)...),
		Researcher: scripted.New(opts(researcherRules()...)...),
		Planner:    scripted.New(opts(plannerRules()...)...),
	}
}

var (
	compare3Re   = regexp.MustCompile(`(?i)compare\s+(.+?),\s*(.+?),?\s+and\s+(.+?)[.?!]*$`)
	compareRe    = regexp.MustCompile(`(?i)compare\s+(.+?)\s+(?:and|with|to|vs\.?|versus)\s+(.+?)[.?!]*$`)
	versusRe     = regexp.MustCompile(`(?i)^(.+?)\s+(?:vs\.?|versus)\s+(.+?)[.?!]*$`)
	backgroundRe = regexp.MustCompile(`(?i)\b(background|don'?t wait|do not wait|no need to wait|later)\b`)
	planRe       = regexp.MustCompile(`(?i)\bplan\b`)
	deleteRunsRe = regexp.MustCompile(`(?i)\bdelete my helper runs\b`)
	timeRe       = regexp.MustCompile(`(?i)\bwhat time is it\b`)
	// useToolRe asks for one tool by name ("call docs_search {"q":"x"}"),
	// for the tools an application adds (agentry serve --mcp).
	useToolRe = regexp.MustCompile(`(?is)^\s*(?:please\s+)?(?:use|call)\s+([A-Za-z0-9_-]+)\s*(\{.*\})?\s*$`)
	publishRe = regexp.MustCompile(`(?i)\bpublish`)
	// backgroundPhraseRe is the whole phrase a background request adds.
	backgroundPhraseRe = regexp.MustCompile(`(?i),?\s*\b(in the background|as a background task|don'?t wait( for it)?|do not wait( for it)?|no need to wait|later)\b`)
	// greetingRe and helpRe recognize small talk and questions about the
	// assistant itself; taskRe the words of a request for work.
	greetingRe = regexp.MustCompile(`(?i)^\s*(hi|hello|hey|howdy|good (morning|afternoon|evening)|thanks|thank you)\b`)
	helpRe     = regexp.MustCompile(`(?i)\b(what can you do|what do you do|who are you|what are you|how does this work|how do you work|help)\b`)
	taskRe     = regexp.MustCompile(`(?i)\b(research|compare|plan|look into|find out|tell me about|vs\.?|versus)\b`)
	fillerRe   = regexp.MustCompile(`(?i)^(please\s+)?(can you\s+)?(hi,?|hello,?|hey,?|research|look into|find out about|tell me about|in the background,?|plan( how to)?|make a plan (for|to))\s+`)
)

// topic strips request phrasing from a user message.
func topic(s string) string {
	s = strings.TrimSpace(s)
	s = backgroundPhraseRe.ReplaceAllString(s, "")
	s = backgroundRe.ReplaceAllString(s, "")
	for {
		t := strings.TrimSpace(fillerRe.ReplaceAllString(s, ""))
		if t == s {
			break
		}
		s = t
	}
	s = strings.Trim(strings.TrimSpace(s), ".?!, ")
	if len([]rune(s)) < 3 {
		s = "the topic you asked about"
	}
	return s
}

// lastIsNotice reports whether the last user message is a background-run
// notification (Assistant.FormatDetachedCompletion, or agenttool's
// default text).
func lastIsNotice(req *model.Request) bool {
	t := scripted.LastUserText(req)
	return strings.HasPrefix(t, "Background research on ") || strings.HasPrefix(t, "Background task ")
}

// isSmallTalk reports whether the last user message greets or asks what the
// assistant can do, rather than asking for work.
func isSmallTalk(req *model.Request) bool {
	t := scripted.LastUserText(req)
	return (greetingRe.MatchString(t) || helpRe.MatchString(t)) && !taskRe.MatchString(t)
}

// HelpText is the assistant's answer to small talk: what it can do, and the
// phrases the offline models understand.
const HelpText = "Hello! I hand work to helper agents, each with its own chat you can open. Try:\n" +
	"- \"Research quantum computing\": a Researcher searches and summarizes.\n" +
	"- \"Compare HTTP/3 and gRPC\": two Researchers side by side.\n" +
	"- \"Plan adding rate limiting to the billing service\": a Planner writes a step-by-step plan.\n" +
	"- \"Research the history of TLS, don't wait\": research in the background; the result arrives later in this chat.\n" +
	"- \"Research solar power and publish it\": the Researcher asks your approval to publish its findings.\n" +
	"- \"What time is it?\": your browser (or agentry chat) answers with its clock.\n" +
	"- \"Delete my helper runs\": asks your approval, then clears the helper runs."

// noticeAnswer is the assistant's reply to a background run's notice.
func noticeAnswer(text string) string {
	head, body, _ := strings.Cut(text, "\n\n")
	q := ""
	if i, j := strings.Index(head, `"`), strings.LastIndex(head, `"`); i >= 0 && j > i {
		q = " on " + head[i:j+1]
	}
	switch {
	case strings.HasSuffix(head, "was cancelled."):
		return "The background research" + q + " was cancelled, so there is no result."
	case strings.HasSuffix(head, "finished:") || strings.Contains(head, " finished"):
		if s := firstSentence(body); s != "" {
			return "Your background research" + q + " is done. " + s
		}
		return "Your background research" + q + " is done."
	default:
		return "The background research" + q + " did not finish. You can ask me to start it again."
	}
}

func assistantRules() []scripted.Rule {
	return []scripted.Rule{
		{Name: "answer-notice", Match: lastIsNotice, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text(noticeAnswer(scripted.LastUserText(req)))}
		}},
		{Name: "answer-tools", Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text(answerFromResults(scripted.ToolResults(req)))}
		}},
		{Name: "delete-helper-runs", Match: func(req *model.Request) bool { return deleteRunsRe.MatchString(scripted.LastUserText(req)) },
			Reply: scripted.Always(scripted.Reply{scripted.ToolCall("delete_helper_runs", struct{}{})})},
		{Name: "local-time", Match: func(req *model.Request) bool { return timeRe.MatchString(scripted.LastUserText(req)) },
			Reply: scripted.Always(scripted.Reply{scripted.ToolCall("get_local_time", struct{}{})})},
		{Name: "use-tool", Match: func(req *model.Request) bool { _, _, ok := toolRequest(req); return ok },
			Reply: func(req *model.Request) scripted.Reply {
				name, input, _ := toolRequest(req)
				return scripted.Reply{scripted.ToolCall(name, input)}
			}},
		{Name: "help", Match: isSmallTalk, Reply: func(*model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text(HelpText)}
		}},
		{Name: "compare", Match: func(req *model.Request) bool { _, ok := compareSides(scripted.LastUserText(req)); return ok },
			Reply: func(req *model.Request) scripted.Reply {
				in, _ := compareSides(scripted.LastUserText(req))
				return scripted.Reply{scripted.ToolCall("compare", in)}
			}},
		{Name: "background", Match: func(req *model.Request) bool { return backgroundRe.MatchString(scripted.LastUserText(req)) },
			Reply: func(req *model.Request) scripted.Reply {
				return scripted.Reply{scripted.ToolCall("research_background", ResearchInput{Query: topic(scripted.LastUserText(req))})}
			}},
		{Name: "plan", Match: func(req *model.Request) bool { return planRe.MatchString(scripted.LastUserText(req)) },
			Reply: func(req *model.Request) scripted.Reply {
				return scripted.Reply{scripted.ToolCall("plan", PlanInput{Description: topic(scripted.LastUserText(req))})}
			}},
		{Name: "research", Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.ToolCall("research", ResearchInput{Query: topic(scripted.LastUserText(req))})}
		}},
	}
}

// toolRequest reads "call NAME {json}" from the last user message, for a
// tool the request offers that is not one of the demo's own.
func toolRequest(req *model.Request) (string, json.RawMessage, bool) {
	m := useToolRe.FindStringSubmatch(scripted.LastUserText(req))
	if m == nil || demoTools[m[1]] {
		return "", nil, false
	}
	input := json.RawMessage(`{}`)
	if m[2] != "" {
		if !json.Valid([]byte(m[2])) {
			return "", nil, false
		}
		input = json.RawMessage(m[2])
	}
	for _, t := range req.Tools {
		if t.Name == m[1] {
			return m[1], input, true
		}
	}
	return "", nil, false
}

// demoTools are the Assistant's own tools, which answerFromResults knows.
var demoTools = map[string]bool{"research": true, "plan": true, "compare": true, "research_background": true,
	"delete_helper_runs": true, "get_local_time": true}

// compareSides reads "compare A, B and C" (three sides), "compare A and
// B" or "A vs B".
func compareSides(s string) (CompareInput, bool) {
	s = strings.TrimSpace(s)
	if m := compare3Re.FindStringSubmatch(s); m != nil {
		return CompareInput{A: strings.TrimSpace(m[1]), B: strings.TrimSpace(m[2]), C: strings.TrimSpace(m[3])}, true
	}
	a, b, ok := comparePair(s)
	return CompareInput{A: a, B: b}, ok
}

func comparePair(s string) (string, string, bool) {
	s = strings.TrimSpace(s)
	for _, re := range []*regexp.Regexp{compareRe, versusRe} {
		if m := re.FindStringSubmatch(s); m != nil {
			return strings.TrimSpace(m[1]), strings.TrimSpace(m[2]), true
		}
	}
	return "", "", false
}

// answerFromResults writes the assistant's brief answer from tool results.
func answerFromResults(results []model.Content) string {
	var parts []string
	for _, r := range results {
		switch {
		case r.ToolName == "delete_helper_runs" && r.IsError && strings.Contains(string(r.Output), message.ResultDenied):
			parts = append(parts, "OK, I left your helper runs alone.")
			continue
		case r.ToolName == "delete_helper_runs" && !r.IsError:
			var d Deleted
			_ = json.Unmarshal(r.Output, &d)
			parts = append(parts, fmt.Sprintf("I deleted %d helper runs.", d.Deleted))
			continue
		case r.ToolName == "get_local_time" && !r.IsError:
			var lt struct {
				Time     string `json:"time"`
				TimeZone string `json:"timeZone"`
			}
			_ = json.Unmarshal(r.Output, &lt)
			parts = append(parts, strings.TrimSpace("It is "+lt.Time+" where you are ("+lt.TimeZone+")."))
			continue
		}
		if !demoTools[r.ToolName] {
			// A tool the application added (an MCP server's): say what
			// it returned.
			out := string(r.Output)
			if rs := []rune(out); len(rs) > 300 {
				out = string(rs[:300]) + "…"
			}
			if r.IsError {
				parts = append(parts, r.ToolName+" failed: "+strings.Trim(out, `"`))
			} else {
				parts = append(parts, r.ToolName+" returned "+out)
			}
			continue
		}
		if r.IsError {
			parts = append(parts, "A helper failed: "+strings.Trim(string(r.Output), `"`))
			continue
		}
		var s string
		if json.Unmarshal(r.Output, &s) == nil {
			if s == "" {
				continue
			}
			if strings.HasPrefix(s, "## ") {
				// A plan: its sections are the answer.
				parts = append(parts, "Here is the plan.\n\n"+s)
				continue
			}
			parts = append(parts, firstSentence(s))
			continue
		}
		var cmp map[string]Settled
		if json.Unmarshal(r.Output, &cmp) == nil && len(cmp) > 0 && cmp["a"].Status != "" {
			text := "Side A: " + settledText(cmp["a"]) + " Side B: " + settledText(cmp["b"])
			if c, ok := cmp["c"]; ok {
				text += " Side C: " + settledText(c)
			}
			parts = append(parts, text)
			continue
		}
		var d Dispatched
		if json.Unmarshal(r.Output, &d) == nil && d.Status == "dispatched" {
			parts = append(parts, "I started the research in the background; I'll post the result here when it is ready.")
			continue
		}
		var f struct {
			OK    *bool  `json:"ok"`
			Error string `json:"error"`
		}
		if json.Unmarshal(r.Output, &f) == nil && f.OK != nil && !*f.OK {
			parts = append(parts, "The helper did not finish: "+f.Error)
		}
	}
	if len(parts) == 0 {
		return "Done."
	}
	return strings.Join(parts, " ")
}

func settledText(s Settled) string {
	if s.Status == "completed" {
		return firstSentence(s.Summary)
	}
	return fmt.Sprintf("(%s: %s)", s.Status, s.Error)
}

// firstSentence returns the first sentence of s: up to the first period
// followed by a space or a line end, where the period does not end a list
// number ("1. ") or an abbreviation of one letter ("e.g. ").
func firstSentence(s string) string {
	s = strings.TrimSpace(s)
	for i := 0; i < len(s); i++ {
		if s[i] != '.' || (i+1 < len(s) && s[i+1] != ' ' && s[i+1] != '\n') {
			continue
		}
		// The word the period ends.
		start := strings.LastIndexAny(s[:i], " \n") + 1
		word := s[start:i]
		if word == "" || isDigits(word) || len(word) == 1 || strings.Contains(word, ".") {
			continue
		}
		return s[:i+1]
	}
	return s
}

func isDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// inputTopic reads the topic from a child's input message (JSON or text).
func inputTopic(req *model.Request, field string) string {
	text := scripted.LastUserText(req)
	for _, m := range req.Messages {
		if m.Role == model.RoleUser {
			for _, c := range m.Content {
				if c.Kind == model.ContentText {
					text = c.Text
				}
			}
			break
		}
	}
	var in map[string]any
	if json.Unmarshal([]byte(text), &in) == nil {
		if v, ok := in[field].(string); ok {
			return v
		}
	}
	return strings.TrimSpace(text)
}

func researcherRules() []scripted.Rule {
	return []scripted.Rule{
		{Name: "publish", Match: func(req *model.Request) bool {
			// Asked to publish: once the search is done, publish the
			// findings (the user approves it first).
			r := scripted.ToolResults(req)
			return publishRe.MatchString(inputTopic(req, "query")) && len(r) > 0 && r[0].ToolName == "web_search"
		}, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.ToolCall("publish_findings", PublishInput{Title: capitalize(withoutPublish(inputTopic(req, "query")))})}
		}},
		{Name: "summarize", Match: scripted.LastIsToolResult, Reply: func(req *model.Request) scripted.Reply {
			q := withoutPublish(inputTopic(req, "query"))
			var results []SearchResult
			published := ""
			for _, r := range scripted.ToolResults(req) {
				if r.ToolName == "publish_findings" {
					var p Published
					if !r.IsError && json.Unmarshal(r.Output, &p) == nil {
						published = " I published the findings at " + p.URL + "."
					} else {
						published = " I did not publish the findings."
					}
				}
			}
			for _, r := range searchResults(req) {
				_ = json.Unmarshal(r.Output, &results)
			}
			var titles []string
			for _, r := range results {
				titles = append(titles, r.Title)
			}
			return scripted.Reply{scripted.Text(fmt.Sprintf(
				"%s is worth knowing well. I read %d sources (%s). In short: %s is widely used, and the main trade-offs are cost, "+
					"complexity and fit for your team.%s", capitalize(q), len(results), strings.Join(titles, "; "), q, published))}
		}},
		{Name: "follow-up", Match: func(req *model.Request) bool { return countUser(req) > 1 }, Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.Text("About \"" + scripted.LastUserText(req) + "\": based on my earlier research on " +
				inputTopic(req, "query") + ", the sources agree on the basics; the details depend on your setup.")}
		}},
		{Name: "search", Reply: func(req *model.Request) scripted.Reply {
			return scripted.Reply{scripted.ToolCall("web_search", ResearchInput{Query: inputTopic(req, "query")})}
		}},
	}
}

// withoutPublish cuts a request to publish off a research topic.
func withoutPublish(q string) string {
	q = publishRe.Split(q, 2)[0]
	q = strings.TrimSpace(q)
	q = strings.TrimSuffix(q, " and")
	return strings.Trim(strings.TrimSpace(q), ",.")
}

// searchResults returns the results of every web_search call so far.
func searchResults(req *model.Request) []model.Content {
	var out []model.Content
	for _, m := range req.Messages {
		for _, c := range m.Content {
			if c.Kind == model.ContentToolResult && c.ToolName == "web_search" {
				out = append(out, c)
			}
		}
	}
	return out
}

func countUser(req *model.Request) int {
	n := 0
	for _, m := range req.Messages {
		if m.Role == model.RoleUser {
			for _, c := range m.Content {
				if c.Kind == model.ContentText {
					n++
					break
				}
			}
		}
	}
	return n
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// plannerFiles picks the files a plan inspects: one to three, from the
// description's words.
func plannerFiles(desc string) []string {
	words := strings.Fields(strings.ToLower(desc))
	var files []string
	for _, w := range words {
		w = strings.Trim(w, ".,;:!?\"'()")
		if len(w) < 4 {
			continue
		}
		files = append(files, "src/"+w+".go")
		if len(files) == 3 {
			break
		}
	}
	if len(files) == 0 {
		files = []string{"src/main.go"}
	}
	return files
}

func plannerRules() []scripted.Rule {
	return []scripted.Rule{
		{Name: "inspect-or-plan", Reply: func(req *model.Request) scripted.Reply {
			desc := inputTopic(req, "description")
			files := plannerFiles(desc)
			done := 0
			for _, m := range req.Messages {
				for _, c := range m.Content {
					if c.Kind == model.ContentToolResult && c.ToolName == "inspect_file" {
						done++
					}
				}
			}
			if countUser(req) > 1 && !scripted.LastIsToolResult(req) {
				return scripted.Reply{scripted.Text("Good question. The plan stays the same; \"" + scripted.LastUserText(req) +
					"\" fits into step 2.")}
			}
			if done < len(files) {
				return scripted.Reply{scripted.ToolCall("inspect_file", FileInput{Path: files[done]})}
			}
			var b strings.Builder
			fmt.Fprintf(&b, "## Overview\n%s.\n\n## Affected files\n", capitalize(desc))
			for _, f := range files {
				fmt.Fprintf(&b, "- %s\n", f)
			}
			b.WriteString("\n## Step-by-step\n1. Write a failing test for the new behaviour.\n2. Change ")
			b.WriteString(files[0])
			b.WriteString(".\n3. Update the callers and run the tests.\n\n## Open questions\n- Does this need a migration?\n")
			return scripted.Reply{scripted.Text(b.String())}
		}},
	}
}
