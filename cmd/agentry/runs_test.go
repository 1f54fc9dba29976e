package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	agentsastools "github.com/agentry/agentry/examples/agents-as-tools"
)

// TestRunsListInspectClear lists, inspects and clears the run a chat
// research question leaves.
func TestRunsListInspectClear(t *testing.T) {
	env := startServer(t, nil)
	c := startChat(t, env, false)
	c.say(t, "Research quantum computing")
	runID := c.out.waitFor(t, `^▸ \[1\] Researcher started · run (agent-tool:\S+)`)[1]
	c.out.waitFor(t, `^assistant> `)
	c.exit(t)

	list := runsCmd(t, env, "list")
	if !regexp.MustCompile(`(?m)^RUN ID\s+CLASS\s+STATUS\s+STARTED\s+COMPLETED\s+TOOL CALL$`).MatchString(list) ||
		!regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(runID)+`\s+Researcher\s+completed\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+call_\S+$`).MatchString(list) {
		t.Fatalf("runs list:\n%s", list)
	}

	insp := runsCmd(t, env, "inspect", runID)
	for _, want := range []string{
		`(?m)^run\s+` + regexp.QuoteMeta(runID) + `$`,
		`(?m)^status\s+completed$`,
		`(?m)^input\s+\{"query":"quantum computing"\}$`,
		`(?m)^progress\s+\[##########\] 100% completed$`,
		`(?m)^  #0 sources-gathered  .*\{"query":"quantum computing","sources":2\}$`,
		`(?m)^summary:\n  Quantum computing is worth knowing well\.`,
	} {
		if !regexp.MustCompile(want).MatchString(insp) {
			t.Errorf("runs inspect lacks %s:\n%s", want, insp)
		}
	}

	if got := runsCmd(t, env, "clear"); got != "cleared 1 run\n" {
		t.Errorf("runs clear = %q", got)
	}
	if got := runsCmd(t, env, "list"); got != "no runs\n" {
		t.Errorf("runs list after clear = %q", got)
	}
}

// TestRunsCancelBackground cancels a background run that is still in
// flight; the open chat shows it aborted and gets the notification.
func TestRunsCancelBackground(t *testing.T) {
	// The Researcher streams its first event and then waits for a clock
	// that never moves: the background run stays in flight.
	fast := agentsastools.Offline(0, nil)
	slow := agentsastools.Offline(time.Hour, clockwork.NewFakeClock())
	env := startServer(t, &agentsastools.Models{Assistant: fast.Assistant, Researcher: slow.Researcher, Planner: fast.Planner})
	c := startChat(t, env, false)
	c.say(t, "Research solar panels in the background")
	runID := c.out.waitFor(t, `^▸ \[1\] Researcher started in the background · run (agent-tool:\S+)`)[1]
	c.out.waitFor(t, `when it is ready\.$`)

	list := runsCmd(t, env, "list")
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(runID) + `\s+Researcher\s+running\s+\S+ \S+\s+-\s+-$`).MatchString(list) {
		t.Fatalf("runs list:\n%s", list)
	}
	if got, want := runsCmd(t, env, "cancel", runID), "cancelled run "+runID+": aborted (cancelled by the user)\n"; got != want {
		t.Fatalf("runs cancel = %q, want %q", got, want)
	}
	c.out.waitFor(t, `^✗ \[1\] Researcher \[\.{10}\]   \?% aborted · cancelled by the user$`)
	c.out.waitAll(t,
		`^notice: Background research on "solar panels" was cancelled\.$`,
		`^assistant> The background research on "solar panels" was cancelled, so there is no result\.$`)
	c.exit(t)

	if got := runsCmd(t, env, "cancel", runID); got != "run "+runID+" already ended: aborted\n" {
		t.Errorf("second cancel = %q", got)
	}
	insp := runsCmd(t, env, "inspect", runID)
	if !strings.Contains(insp, "milestones: none") || !regexp.MustCompile(`(?m)^error: cancelled by the user$`).MatchString(insp) {
		t.Errorf("runs inspect:\n%s", insp)
	}
}

// TestRunsErrors checks the usage errors and an unknown run.
func TestRunsErrors(t *testing.T) {
	env := startServer(t, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing subcommand"},
		{[]string{"frob"}, `unknown subcommand "frob"`},
		{[]string{"inspect"}, "want one run id"},
		{[]string{"list", "extra"}, "unexpected arguments"},
		{[]string{"--addr", env.Host, "inspect", "nope"}, `no helper run "nope"`},
		{[]string{"--addr", env.Host, "cancel", "nope"}, `no run "nope"`},
	} {
		var out bytes.Buffer
		err := runRuns(ctx, tc.args, &out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("runs %v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}
