package agenttool_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/agentry/agentry/agent"
	"github.com/agentry/agentry/agenttool"
	"github.com/agentry/agentry/chat"
	"github.com/agentry/agentry/internal/testkit/teststore"
	"github.com/agentry/agentry/model"
)

// newUnstarted returns a runtime on a fresh database, not started; it is
// closed at cleanup.
func newUnstarted(t *testing.T) *agent.Runtime {
	t.Helper()
	return teststore.NewRuntime(t, agent.Options{IdleTimeout: -1})
}

// TestSetupAfterStartFails: chat.Configure and agenttool.Install after
// Start return agent.ErrStarted instead of silently doing nothing.
func TestSetupAfterStartFails(t *testing.T) {
	rt := newUnstarted(t)
	if err := rt.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := chat.Configure(rt, chat.Config{}); !errors.Is(err, agent.ErrStarted) {
		t.Errorf("Configure after Start: %v, want ErrStarted", err)
	}
	if err := agenttool.Install(rt, agenttool.Options{}); !errors.Is(err, agent.ErrStarted) {
		t.Errorf("Install after Start: %v, want ErrStarted", err)
	}
}

// TestInstallTwiceFails: a second Install on one runtime is an error (it
// would add a second agent-tool layer to every agent).
func TestInstallTwiceFails(t *testing.T) {
	rt := newUnstarted(t)
	if err := agenttool.Install(rt, agenttool.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := agenttool.Install(rt, agenttool.Options{}); err == nil {
		t.Error("a second Install succeeded")
	}
}

// wrongPrompt is a chat agent whose SystemPrompt has the wrong type.
type wrongPrompt struct{ chat.Base }

func (w *wrongPrompt) SystemPrompt() []string { return nil }

// plainPrompt is not a chat agent: its SystemPrompt is its own business.
type plainPrompt struct{ agent.Base }

func (p *plainPrompt) SystemPrompt() []string { return nil }

// wrongFinish is a parent whose OnAgentToolFinish lacks the result.
type wrongFinish struct{ chat.Base }

func (w *wrongFinish) OnAgentToolFinish(ctx context.Context, run agenttool.Run) {}

// TestRegisterRefusesWrongLayerHooks: a method named as a chat hook or an
// agent-tool hook with another signature is refused, by Register after
// Configure/Install, and by Configure/Install for classes registered
// before; a chat hook's name on an agent that is not a chat agent is not a
// hook.
func TestRegisterRefusesWrongLayerHooks(t *testing.T) {
	prompt := agent.Class{Name: "WrongPrompt", New: func() agent.Agent { return &wrongPrompt{} }}
	finish := agent.Class{Name: "WrongFinish", New: func() agent.Agent { return &wrongFinish{} }}
	plain := agent.Class{Name: "PlainPrompt", New: func() agent.Agent { return &plainPrompt{} }}

	rt := newUnstarted(t)
	if err := chat.Configure(rt, chat.Config{}); err != nil {
		t.Fatal(err)
	}
	if err := agenttool.Install(rt, agenttool.Options{}); err != nil {
		t.Fatal(err)
	}
	err := rt.Register(prompt)
	if err == nil || !strings.Contains(err.Error(), "SystemPrompt") || !strings.Contains(err.Error(), "chat.SystemPrompter") {
		t.Errorf("Register(WrongPrompt): %v", err)
	}
	err = rt.Register(finish)
	if err == nil || !strings.Contains(err.Error(), "OnAgentToolFinish") || !strings.Contains(err.Error(), "agenttool.FinishObserver") {
		t.Errorf("Register(WrongFinish): %v", err)
	}
	if err := rt.Register(plain); err != nil {
		t.Errorf("Register(PlainPrompt): %v", err)
	}

	before := newUnstarted(t)
	if err := before.Register(prompt); err != nil {
		t.Fatal(err) // no chat hooks declared yet
	}
	if err := chat.Configure(before, chat.Config{}); err == nil || !strings.Contains(err.Error(), "WrongPrompt") {
		t.Errorf("Configure after registering WrongPrompt: %v", err)
	}
	if err := before.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "WrongPrompt") {
		t.Errorf("Start: %v, want an error naming WrongPrompt", err)
	}
}

// Handles of the classes of TestAgentToolUnknownClassFailsStart.
var (
	typoParent      = agent.NewClass[*typoAssistant]("TypoAssistant")
	researcherClass = agent.NewClass[*plainResearcher]("Researcher")
)

// typoAssistant's model may call a helper whose class name is misspelt.
type typoAssistant struct {
	chat.Base
	child string
}

func (a *typoAssistant) ChatModel() model.Model { return echoResearcher() }
func (a *typoAssistant) Tools() []chat.Tool {
	return []chat.Tool{
		agenttool.AgentTool[researchInput](researcherClass, agenttool.ToolOptions{Description: "typed handle"}),
		agenttool.AgentTool[researchInput](a.child, agenttool.ToolOptions{Name: "helper", Description: "by name"}),
	}
}

type plainResearcher struct{ chat.Base }

// TestAgentToolUnknownClassFailsStart: an AgentTool naming a class that is
// not registered fails Start (naming the class and the tool), instead of
// failing only when the model calls it; with the right name, and with a
// typed handle, Start succeeds.
func TestAgentToolUnknownClassFailsStart(t *testing.T) {
	for _, tc := range []struct {
		child string
		ok    bool
	}{{"Reseacher", false}, {"Researcher", true}} {
		rt := newUnstarted(t)
		if err := chat.Configure(rt, chat.Config{}); err != nil {
			t.Fatal(err)
		}
		if err := agenttool.Install(rt, agenttool.Options{}); err != nil {
			t.Fatal(err)
		}
		child := tc.child
		if err := rt.Register(typoParent.Class(agent.Class{New: func() agent.Agent { return &typoAssistant{child: child} }})); err != nil {
			t.Fatal(err)
		}
		if err := rt.Register(researcherClass.Class(agent.Class{})); err != nil {
			t.Fatal(err)
		}
		err := rt.Start(context.Background())
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: Start: %v", tc.child, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), `"`+tc.child+`"`) || !strings.Contains(err.Error(), "helper")):
			t.Errorf("%s: Start: %v, want an error naming the class and the tool", tc.child, err)
		}
	}
}

// TestOnFinishMethodValue: a detached run's OnFinish given as a method
// value (agenttool.OnFinish, or agent.Method) is the method's name; a
// closure is refused at dispatch, with an error that says what to give.
func TestOnFinishMethodValue(t *testing.T) {
	k := newDetKit()
	env := detStart(t, k, "")
	ctx := detCtx(t)
	p := detParentOf(t, env, "mv")
	if got := agenttool.OnFinish(p.OnDone); got != "OnDone" {
		t.Fatalf("OnFinish(p.OnDone) = %q", got)
	}
	if agent.Method(p.OnDone) != "OnDone" {
		t.Fatalf("Method(p.OnDone) = %q", agent.Method(p.OnDone))
	}
	detDispatch(t, ctx, p, "DetWorker", "mv-1", agenttool.DetachedOptions{OnFinish: agenttool.OnFinish(p.OnDone)})
	if r := getRun(t, p, "mv-1"); r.Status != agenttool.StatusRunning {
		t.Fatalf("run %+v", r)
	}
	closure := func(context.Context, agenttool.Run, agenttool.Result) error { return nil }
	for _, key := range []string{agent.Method(closure), agenttool.OnFinish(closure)} {
		_, err := agenttool.RunAgentTool(ctx, p, "DetWorker", agenttool.RunOptions{Input: "x", RunID: "mv-2",
			Detached: &agenttool.DetachedOptions{OnFinish: key}})
		if err == nil || !strings.Contains(err.Error(), "agenttool.OnFinish(a.OnDone)") {
			t.Fatalf("a closure as OnFinish: %v, want a refusal that says what to give", err)
		}
	}
	if _, err := agenttool.RunAgentTool(ctx, p, "DetWorker", agenttool.RunOptions{Input: "x", RunID: "mv-3",
		Detached: &agenttool.DetachedOptions{OnFinish: "OnDoen"}}); err == nil || !strings.Contains(err.Error(), `"OnDoen" does not exist`) {
		t.Fatalf("a misspelt OnFinish: %v, want a refusal naming it", err)
	}
	k.finishWorker(t, ctx)
	k.waitCall(t, ctx, "done")
}
