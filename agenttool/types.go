// Package agenttool implements agents as tools: a parent agent hands part
// of its work to a chat-capable child agent — a real sub-agent with its own
// storage, transcript, tools and resumable stream — and keeps a registry of
// runs so that clients see the child's timeline live (agent-tool-event
// frames), rebuild it from a replay after a refresh, drill into the child's
// chat, and clear it later.
//
// Install the package on a runtime with Install; every agent can then run
// agent tools imperatively with RunAgentTool, or give its model an
// AgentTool. The child is addressed as the parent's sub-agent whose name is
// the run id, so the same run id never starts a second child.
//
// A parent's runs execute a bounded number at a time: past
// DefaultMaxRunningAgentTools (32; Options.MaxRunningAgentTools for the
// runtime, a RunningLimiter method for a class, negative for unlimited) a
// run is recorded and announced as usual, with status starting, and waits
// for a slot, first come first served among the parent's runs; its child
// starts when a running run of the parent ends. Such a run is never
// refused (ConcurrencyLimiter is the refusing cap), canceling it while it
// waits ends it aborted without a child, and one that waits when the
// process stops waits again after the restart and starts with the input
// of its dispatch. A child's own runs count against the child's slots,
// never its parent's.
package agenttool

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentry/agentry/chat"
)

// Status is the state of a run in the parent's registry.
type Status string

// Run statuses. starting and running are active; completed, error and
// aborted are hard terminals; interrupted is a soft terminal that a later
// real result replaces.
const (
	StatusStarting    Status = "starting"
	StatusRunning     Status = "running"
	StatusCompleted   Status = "completed"
	StatusError       Status = "error"
	StatusAborted     Status = "aborted"
	StatusInterrupted Status = "interrupted"
)

// Active reports whether s is starting or running.
func (s Status) Active() bool { return s == StatusStarting || s == StatusRunning }

// Hard reports whether s is a terminal no later write replaces.
func (s Status) Hard() bool { return s == StatusCompleted || s == StatusError || s == StatusAborted }

// Reason says why a run was interrupted.
type Reason string

// Interrupted reasons. ReasonInspectTimeout and ReasonRecoveryDeadline
// end a run only when the recovery's inspection of its child does not
// answer within the re-attach no-progress budget (at once for a parent
// whose budget is zero or less); a slower answer is classified as any
// other.
const (
	ReasonNoProgress       Reason = "no-progress"
	ReasonWindowExceeded   Reason = "window-exceeded"
	ReasonNotTailable      Reason = "not-tailable"
	ReasonInspectTimeout   Reason = "inspect-timeout"
	ReasonInspectFailed    Reason = "inspect-failed"
	ReasonRecoveryDeadline Reason = "recovery-deadline"
	ReasonBudgetExceeded   Reason = "budget-exceeded"
)

// Display is UI metadata of a run (name, icon and anything else the front
// end wants), sent with the started event.
type Display map[string]any

// RunOptions describe one dispatch of RunAgentTool.
type RunOptions struct {
	// Input is handed to the child (marshalled to JSON).
	Input any
	// RunID names the run and the child instance; empty means a new id.
	// Dispatching an existing run id never starts a second child.
	RunID string
	// ParentToolCallID is the tool call the run renders under; empty for
	// unbound (programmatic) runs.
	ParentToolCallID string
	// DisplayOrder orders sibling runs under one tool call.
	DisplayOrder int
	// Display is UI metadata.
	Display Display
	// InputPreview is what the registry and clients see of the input;
	// nil means a preview derived from Input (at most 500 characters).
	InputPreview any
	// Detached, when set, makes the run detached: RunAgentTool returns a
	// handle (status running, starting while it waits for a slot of the
	// parent's RunningLimiter bound, or error) right after dispatch.
	Detached *DetachedOptions
	// Tokens caps the tokens the run may use (zero fields: no cap). It
	// is stored with the run, so a run followed again after a restart
	// keeps it.
	Tokens TokenBudget
}

// Result is how a run ended (or, for an interrupted run, how far it got).
type Result struct {
	RunID     string          `json:"runId"`
	AgentType string          `json:"agentType"`
	Status    Status          `json:"status"`
	Summary   string          `json:"summary,omitempty"`
	Output    json.RawMessage `json:"output,omitempty"`
	Error     string          `json:"error,omitempty"`
	// Reason and ChildStillRunning are set for interrupted runs.
	Reason            Reason `json:"reason,omitempty"`
	ChildStillRunning *bool  `json:"childStillRunning,omitempty"`
	// Usage is the tokens the child used, its own children included (the
	// tree usage of its messages), when it reported any.
	Usage *chat.Usage `json:"usage,omitempty"`
}

// Failure is what an AgentTool returns to the model when a run did not
// complete: a structured envelope instead of an empty success.
type Failure struct {
	OK     bool   `json:"ok"`
	Status Status `json:"status"`
	Error  string `json:"error"`
	// Retryable is true only for interrupted runs: the child was reset by
	// a deploy or a recovery and never reached a logical end, so the same
	// call may succeed if sent again.
	Retryable         bool   `json:"retryable"`
	Reason            Reason `json:"reason,omitempty"`
	ChildStillRunning *bool  `json:"childStillRunning,omitempty"`
}

// FailureOf returns the failure envelope of a result that did not complete.
func FailureOf(r Result) Failure {
	f := Failure{Status: r.Status, Error: r.Error}
	switch r.Status {
	case StatusAborted:
		if f.Error == "" {
			f.Error = "agent tool run was cancelled"
		}
	case StatusInterrupted:
		if f.Error == "" {
			f.Error = "agent tool run was interrupted before it finished; it can be retried"
		}
		f.Retryable, f.Reason, f.ChildStillRunning = r.Reason != ReasonBudgetExceeded, r.Reason, r.ChildStillRunning
	default:
		f.Status = StatusError
		if f.Error == "" {
			f.Error = "agent tool run failed"
		}
	}
	return f
}

// Run is a row of the parent's registry.
type Run struct {
	RunID             string          `json:"runId"`
	ParentToolCallID  string          `json:"parentToolCallId,omitempty"`
	AgentType         string          `json:"agentType"`
	InputPreview      json.RawMessage `json:"inputPreview,omitempty"`
	Status            Status          `json:"status"`
	Summary           string          `json:"summary,omitempty"`
	Output            json.RawMessage `json:"output,omitempty"`
	Error             string          `json:"error,omitempty"`
	Reason            Reason          `json:"reason,omitempty"`
	ChildStillRunning *bool           `json:"childStillRunning,omitempty"`
	Display           Display         `json:"display,omitempty"`
	DisplayOrder      int             `json:"displayOrder"`
	StartedAt         time.Time       `json:"startedAt"`
	CompletedAt       *time.Time      `json:"completedAt,omitempty"`
	// Usage is the tokens the run's child used, its own children
	// included, as last reported.
	Usage *chat.Usage `json:"usage,omitempty"`
	// TokenBudget is the run's token cap.
	TokenBudget TokenBudget `json:"tokenBudget,omitzero"`
}

// Result returns the run's result as stored.
func (r Run) Result() Result {
	return Result{RunID: r.RunID, AgentType: r.AgentType, Status: r.Status, Summary: r.Summary,
		Output: r.Output, Error: r.Error, Reason: r.Reason, ChildStillRunning: r.ChildStillRunning, Usage: r.Usage}
}

// ErrNotInstalled is returned when agenttool.Install was not called on the
// agent's runtime.
var ErrNotInstalled = errors.New("agenttool: not installed on this runtime (call agenttool.Install)")

// CapError is returned by a dispatch refused by MaxConcurrentAgentTools. The
// run id is not consumed: the same id can be dispatched again later.
type CapError struct{ Max int }

func (e *CapError) Error() string { return fmt.Sprintf("maxConcurrentAgentTools (%d) exceeded", e.Max) }

// Messages used for results.
const (
	msgCancelled  = "agent tool run was cancelled"
	msgRunFailed  = "Agent tool run failed"
	msgSkipped    = "Agent tool run was skipped because the chat was cleared."
	msgStaleChild = "Agent tool run was interrupted before the child could finish."
	// msgRecoveryExhausted starts the error of a run whose child's chat
	// recovery gave up (chat.TurnResult.Exhausted).
	msgRecoveryExhausted = "Agent tool child gave up recovering its turn"
)

// Event is one agent-tool event of the wire protocol.
type Event struct {
	Kind              string          `json:"kind"`
	RunID             string          `json:"runId"`
	AgentType         string          `json:"agentType,omitempty"`
	InputPreview      json.RawMessage `json:"inputPreview,omitempty"`
	Order             *int            `json:"order,omitempty"`
	Display           Display         `json:"display,omitempty"`
	Body              string          `json:"body,omitempty"`
	Summary           *string         `json:"summary,omitempty"`
	Error             string          `json:"error,omitempty"`
	Reason            string          `json:"reason,omitempty"`
	ChildStillRunning *bool           `json:"childStillRunning,omitempty"`
}

// Frame is an agent-tool-event frame (type wire.AgentToolEvent).
type Frame struct {
	Type             string `json:"type"`
	ParentToolCallID string `json:"parentToolCallId,omitempty"`
	Sequence         int64  `json:"sequence"`
	Replay           bool   `json:"replay,omitempty"`
	Event            Event  `json:"event"`
}
