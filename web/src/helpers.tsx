// Helper runs as useAgentToolEvents reduces them: the inline panel under a
// tool call, its progress bar and chips, and the background-runs panel.
import { useState } from "react";
import type { AgentToolRunState } from "agents/chat";
import { Badge, previewInput, Timeline, type OnApprove, type Part, type ToolPart } from "./parts";

export type Run = AgentToolRunState<Part>;

// The helper classes that drill-in can open (the server's
// OnBeforeSubAgent admits these and nothing else).
export const DRILLABLE = new Set(["Researcher", "Planner"]);

export function runLabel(run: Run): string {
  return (typeof run.display?.name === "string" && run.display.name) || run.agentType;
}

// A helper's avatar: its initial on a colour of its class. (The server's
// display.icon is an emoji, which a machine without emoji fonts shows as
// a box, so the page draws its own.)
export function Avatar({ run }: { run: Run }) {
  const label = runLabel(run);
  return (
    <span className={`avatar avatar-${run.agentType.toLowerCase()}`} aria-hidden="true">
      {label.charAt(0).toUpperCase()}
    </span>
  );
}

export function isTerminal(status: Run["status"]): boolean {
  return status !== "running";
}

export function StatusBadge({ status, cancelling }: { status: Run["status"]; cancelling?: boolean }) {
  if (cancelling && status === "running") return <Badge tone="warn" testId="run-status">Cancelling…</Badge>;
  switch (status) {
    case "running":
      return <Badge tone="live" testId="run-status">Running</Badge>;
    case "completed":
      return <Badge tone="ok" testId="run-status">Done</Badge>;
    case "aborted":
      return <Badge tone="warn" testId="run-status">Cancelled</Badge>;
    case "interrupted":
      return <Badge tone="bad" testId="run-status">Interrupted</Badge>;
    default:
      return <Badge tone="bad" testId="run-status">Error</Badge>;
  }
}

// The bar follows run.progress (the child's latest data-agent-progress);
// a finished run shows a full bar, a run with no fraction yet an
// indeterminate one.
export function ProgressBar({ run }: { run: Run }) {
  const p = run.progress;
  let pct: number | undefined;
  if (run.status === "completed") pct = 100;
  else if (typeof p?.fraction === "number") pct = Math.round(Math.max(0, Math.min(1, p.fraction)) * 100);
  const phase = run.status === "running" ? p?.phase : undefined;
  const message = run.status === "running" ? p?.message : undefined;
  return (
    <div className="progress" data-testid="progress" data-pct={pct ?? ""}>
      <div className="progress-line">
        {phase && (
          <span className="chip chip-phase" data-testid="phase-chip">
            {phase}
          </span>
        )}
        {message && <span className="progress-message">{message}</span>}
        {pct !== undefined && <span className="progress-pct">{pct}%</span>}
      </div>
      <div className={`progress-track ${run.status}`}>
        <div
          className={`progress-fill ${pct === undefined && run.status === "running" ? "indeterminate" : ""}`}
          style={pct === undefined ? undefined : { width: `${pct}%` }}
        />
      </div>
    </div>
  );
}

export function Milestones({ run }: { run: Run }) {
  if (!run.milestones || run.milestones.length === 0) return null;
  return (
    <div className="chips" data-testid="milestones">
      {run.milestones.map((m) => (
        <span key={m.sequence} className="chip chip-milestone" data-testid="milestone-chip" title={new Date(m.at).toLocaleTimeString()}>
          ✓ {m.name}
        </span>
      ))}
    </div>
  );
}

// One helper under a tool call: header, progress, milestones and the
// child's live timeline (its text and tool parts).
// onAnswer answers an approval the run's child waits for (from the
// parent's connection: the agent_tool_approval frame).
export type OnAnswerRun = (run: Run, part: ToolPart, approved: boolean) => void;

export function HelperPanel({ run, onDrillIn, onAnswer }: { run: Run; onDrillIn: (run: Run) => void; onAnswer?: OnAnswerRun }) {
  const onApprove: OnApprove | undefined = onAnswer && run.status === "running" ? (part, approved) => onAnswer(run, part, approved) : undefined;
  const [open, setOpen] = useState(true);
  return (
    <section
      className={`helper helper-${run.status}`}
      data-testid="helper-panel"
      data-run-id={run.runId}
      data-agent-type={run.agentType}
      data-status={run.status}
      data-order={run.order}
    >
      <header className="helper-head">
        <button type="button" className="helper-toggle" onClick={() => setOpen((v) => !v)} aria-expanded={open}>
          <span className="caret">{open ? "▾" : "▸"}</span>
          <Avatar run={run} />
          <span className="helper-name">{runLabel(run)}</span>
          <span className="helper-input" data-testid="helper-input">
            {previewInput(run.inputPreview)}
          </span>
        </button>
        <StatusBadge status={run.status} />
        {DRILLABLE.has(run.agentType) && (
          <button type="button" className="btn btn-small" data-testid="drill-in" onClick={() => onDrillIn(run)} title="Open this helper's own chat">
            Open chat ↗
          </button>
        )}
      </header>
      <ProgressBar run={run} />
      <Milestones run={run} />
      {open && run.parts.length > 0 && <Timeline parts={run.parts} onApprove={onApprove} />}
      {run.error && <div className="error-text">{run.error}</div>}
    </section>
  );
}

// Unbound runs (detached, background): progress, milestones, summary,
// and the buttons to drill in or cancel.
export function BackgroundRuns({
  runs,
  cancelling,
  onCancel,
  onDrillIn,
}: {
  runs: Run[];
  cancelling: ReadonlySet<string>;
  onCancel: (run: Run) => void;
  onDrillIn: (run: Run) => void;
}) {
  const active = runs.filter((r) => r.status === "running").length;
  return (
    <aside className="side-panel" data-testid="background-panel">
      <div className="side-head">
        <h2>Background runs</h2>
        <Badge tone={active > 0 ? "live" : "neutral"}>{active > 0 ? `${active} running` : `${runs.length}`}</Badge>
      </div>
      {runs.length === 0 ? (
        <p className="muted small side-empty">
          Detached helpers appear here. Ask for research “in the background” (or say “don't wait”): the assistant answers at
          once, the helper keeps working, and its result arrives later in the chat.
        </p>
      ) : (
        <div className="bg-list">
          {runs.map((run) => (
            <div key={run.runId} className={`bg-run helper-${run.status}`} data-testid="background-run" data-run-id={run.runId} data-status={run.status}>
              <div className="bg-run-head">
                <Avatar run={run} />
                <span className="helper-name">{runLabel(run)}</span>
                <StatusBadge status={run.status} cancelling={cancelling.has(run.runId)} />
              </div>
              <div className="bg-run-input">{previewInput(run.inputPreview) || "Background task"}</div>
              <ProgressBar run={run} />
              <Milestones run={run} />
              {run.summary && <div className="bg-run-summary">{run.summary}</div>}
              {run.error && <div className="error-text">{run.error}</div>}
              <div className="bg-run-actions">
                {DRILLABLE.has(run.agentType) && (
                  <button type="button" className="btn btn-small" data-testid="drill-in" onClick={() => onDrillIn(run)}>
                    Open chat ↗
                  </button>
                )}
                <button
                  type="button"
                  className="btn btn-small btn-danger"
                  data-testid="cancel-run"
                  disabled={isTerminal(run.status) || cancelling.has(run.runId)}
                  onClick={() => onCancel(run)}
                >
                  Cancel
                </button>
              </div>
            </div>
          ))}
        </div>
      )}
    </aside>
  );
}
