package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/client"
	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
)

// assistantClass is the agent class the chat and runs commands talk to.
const assistantClass = "Assistant"

// dialTimeout bounds connecting to the server.
const dialTimeout = 10 * time.Second

// timeLayout is how the runs command prints times (local time).
const timeLayout = "2006-01-02 15:04:05"

// connFlags are the flags every client command takes.
type connFlags struct {
	addr  string
	name  string
	token string
}

// register adds --addr, --name and --token to fs.
func (c *connFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8787", "address of the agentry server (host:port or URL)")
	fs.StringVar(&c.name, "name", "default", "name of the Assistant instance")
	fs.StringVar(&c.token, "token", "", "token the server requires (agentry serve --auth-token) (default $"+tokenEnv+")")
}

// dial connects to the Assistant instance the flags name. opts may set
// callbacks; Host, Agent and Name are filled in.
func (c *connFlags) dial(ctx context.Context, opts client.Options) (*client.Conn, error) {
	host := c.addr
	if strings.HasPrefix(host, ":") {
		host = "127.0.0.1" + host
	}
	opts.Host, opts.Agent, opts.Name = host, assistantClass, c.name
	opts.Token = c.token
	if opts.Token == "" {
		opts.Token = os.Getenv(tokenEnv)
	}
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	conn, err := client.Dial(dctx, opts)
	if err != nil {
		if ce := (*client.CloseError)(nil); errors.As(err, &ce) && ce.Code == 4001 {
			hint := "set --token or $" + tokenEnv
			if opts.Token != "" {
				hint = "check --token or $" + tokenEnv
			}
			return nil, fmt.Errorf("connect to %s %q at %s: the server refused the token (%s): %w", assistantClass, c.name, c.addr, hint, err)
		}
		return nil, fmt.Errorf("connect to %s %q at %s: %w", assistantClass, c.name, c.addr, err)
	}
	return conn, nil
}

const runsUsage = `usage: agentry runs [--addr 127.0.0.1:8787] [--name default] [--token T] <subcommand>

subcommands:
  list             list the Assistant's helper runs
  inspect <runId>  show one run: progress, milestones, summary or error
  cancel <runId>   cancel a run still in flight
  clear            delete every run and its child agent
`

// runRuns is the runs command: it lists, inspects, cancels or clears the
// helper runs of an Assistant on a running server, through the Assistant's
// callables (listHelperRuns, inspectHelperRun, cancelBackground,
// clearHelperRuns), and writes the result to out.
func runRuns(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("runs", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() { fmt.Fprint(fs.Output(), runsUsage); fs.PrintDefaults() }
	var cf connFlags
	cf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("runs: missing subcommand (list, inspect, cancel or clear); see agentry runs -h")
	}
	sub := fs.Arg(0)
	// Flags may also follow the subcommand: agentry runs list --name bob.
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return err
	}
	rest := fs.Args()
	want := 0
	if sub == "inspect" || sub == "cancel" {
		want = 1
	}
	switch sub {
	case "list", "inspect", "cancel", "clear":
	default:
		return fmt.Errorf("runs: unknown subcommand %q; see agentry runs -h", sub)
	}
	if len(rest) != want {
		if want == 1 {
			return fmt.Errorf("runs %s: want one run id, got %d arguments", sub, len(rest))
		}
		return fmt.Errorf("runs %s: unexpected arguments %q", sub, rest)
	}

	conn, err := cf.dial(ctx, client.Options{})
	if err != nil {
		return fmt.Errorf("runs: %w", err)
	}
	defer conn.Close()
	switch sub {
	case "list":
		err = listRuns(ctx, conn, out)
	case "inspect":
		err = inspectRun(ctx, conn, out, rest[0])
	case "cancel":
		err = cancelRun(ctx, conn, out, rest[0])
	case "clear":
		err = clearRuns(ctx, conn, out)
	}
	if err != nil {
		return fmt.Errorf("runs %s: %w", sub, err)
	}
	return nil
}

// fetchRuns calls listHelperRuns.
func fetchRuns(ctx context.Context, conn *client.Conn) ([]agenttool.Run, error) {
	raw, err := conn.Call(ctx, "listHelperRuns")
	if err != nil {
		return nil, err
	}
	var runs []agenttool.Run
	if err := json.Unmarshal(raw, &runs); err != nil {
		return nil, fmt.Errorf("decode listHelperRuns result: %w", err)
	}
	return runs, nil
}

// listRuns prints the runs as a table.
func listRuns(ctx context.Context, conn *client.Conn, out io.Writer) error {
	runs, err := fetchRuns(ctx, conn)
	if err != nil {
		return err
	}
	if len(runs) == 0 {
		_, err := fmt.Fprintln(out, "no runs")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN ID\tCLASS\tSTATUS\tSTARTED\tCOMPLETED\tTOOL CALL")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.RunID, r.AgentType, r.Status,
			formatTime(&r.StartedAt), formatTime(r.CompletedAt), orDash(r.ParentToolCallID))
	}
	return tw.Flush()
}

// inspectRun prints one run with the child's view of it.
func inspectRun(ctx context.Context, conn *client.Conn, out io.Writer, runID string) error {
	raw, err := conn.Call(ctx, "inspectHelperRun", runID)
	if err != nil {
		return err
	}
	var d agentsastools.HelperRunDetail
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("decode inspectHelperRun result: %w", err)
	}
	r := d.Run
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, v) }
	row("run", r.RunID)
	row("class", r.AgentType)
	status := string(r.Status)
	if r.Reason != "" {
		status += " (" + string(r.Reason) + ")"
	}
	row("status", status)
	row("tool call", orDash(r.ParentToolCallID))
	row("started", formatTime(&r.StartedAt))
	row("completed", formatTime(r.CompletedAt))
	if len(r.InputPreview) > 0 {
		row("input", previewJSON(r.InputPreview, 200))
	}
	var prog progressSnapshot
	if in := d.Inspection; in != nil && len(in.Progress) > 0 {
		// An unreadable snapshot is shown as no progress.
		_ = json.Unmarshal(in.Progress, &prog)
	}
	if r.Status == agenttool.StatusCompleted {
		row("progress", progressText(ptr(1.0), "completed", ""))
	} else {
		row("progress", progressText(prog.Fraction, prog.Phase, prog.Message))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if in := d.Inspection; in != nil && len(in.Milestones) > 0 {
		fmt.Fprintln(out, "milestones:")
		for _, m := range in.Milestones {
			line := fmt.Sprintf("  #%d %s  %s", m.Sequence, m.Name, time.UnixMilli(m.At).Local().Format(timeLayout))
			if m.Message != "" {
				line += "  " + m.Message
			}
			if len(m.Data) > 0 {
				line += "  " + compactJSON(m.Data, 120)
			}
			fmt.Fprintln(out, line)
		}
	} else {
		fmt.Fprintln(out, "milestones: none")
	}
	summary, errText := r.Summary, r.Error
	if in := d.Inspection; in != nil {
		summary, errText = cmp.Or(summary, in.Summary), cmp.Or(errText, in.Error)
	}
	if summary != "" {
		fmt.Fprintf(out, "summary:\n%s\n", indent(summary, "  "))
	}
	if errText != "" {
		_, err := fmt.Fprintf(out, "error: %s\n", errText)
		return err
	}
	return nil
}

// cancelRun cancels a run and prints the status it ended with.
func cancelRun(ctx context.Context, conn *client.Conn, out io.Writer, runID string) error {
	before, err := findRun(ctx, conn, runID)
	if err != nil {
		return err
	}
	if before.Status.Hard() {
		_, err := fmt.Fprintf(out, "run %s already ended: %s\n", runID, before.Status)
		return err
	}
	if _, err := conn.Call(ctx, "cancelBackground", runID); err != nil {
		return err
	}
	after, err := findRun(ctx, conn, runID)
	if err != nil {
		return err
	}
	line := fmt.Sprintf("cancelled run %s: %s", runID, after.Status)
	if after.Error != "" {
		line += " (" + after.Error + ")"
	}
	_, err = fmt.Fprintln(out, line)
	return err
}

// findRun returns one run of the registry, or an error naming the run.
func findRun(ctx context.Context, conn *client.Conn, runID string) (agenttool.Run, error) {
	runs, err := fetchRuns(ctx, conn)
	if err != nil {
		return agenttool.Run{}, err
	}
	for _, r := range runs {
		if r.RunID == runID {
			return r, nil
		}
	}
	return agenttool.Run{}, fmt.Errorf("no run %q", runID)
}

// clearRuns clears the registry and prints how many runs were deleted.
func clearRuns(ctx context.Context, conn *client.Conn, out io.Writer) error {
	raw, err := conn.Call(ctx, "clearHelperRuns")
	if err != nil {
		return err
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("decode clearHelperRuns result: %w", err)
	}
	_, err = fmt.Fprintf(out, "cleared %d run%s\n", n, plural(n))
	return err
}

// progressSnapshot is the stored progress of a child run.
type progressSnapshot struct {
	Fraction *float64 `json:"fraction"`
	Message  string   `json:"message"`
	Phase    string   `json:"phase"`
}

func formatTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.Local().Format(timeLayout)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func ptr[T any](v T) *T { return &v }

// indent prefixes every line of s.
func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix)
}

// previewJSON renders an input preview, JSON or a string holding JSON, as
// compact JSON of at most limit runes.
func previewJSON(raw json.RawMessage, limit int) string {
	var str string
	if json.Unmarshal(raw, &str) == nil && json.Valid([]byte(str)) {
		raw = json.RawMessage(str)
	}
	return compactJSON(raw, limit)
}

// compactJSON returns raw on one line, cut to at most limit runes.
func compactJSON(raw json.RawMessage, limit int) string {
	var v any
	s := string(raw)
	if json.Unmarshal(raw, &v) == nil {
		if b, err := json.Marshal(v); err == nil {
			s = string(b)
		}
	}
	return truncate(s, limit)
}

// truncate cuts s to at most limit runes, marking the cut with "…".
func truncate(s string, limit int) string {
	r := []rune(s)
	if len(r) <= limit {
		return s
	}
	return string(r[:limit-1]) + "…"
}
