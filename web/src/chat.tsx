// Chat transcript rendering: messages, tool calls with their inline helper
// panels, background notices, and the composer.
import { useState, type FormEvent } from "react";
import type { UIMessage } from "ai";
import { HelperPanel, type OnAnswerRun, type Run } from "./helpers";
import {
  ApprovalButtons,
  Badge,
  formatOutput,
  isToolPart,
  Markdown,
  previewInput,
  toolBadge,
  toolNameOf,
  toolStateOf,
  type OnApprove,
  type ToolPart,
} from "./parts";

// metadata.source of the messages a background run adds to the chat
// (examples/agents-as-tools NotifySource).
const BACKGROUND_SOURCE = "agents-as-tools-background";

function metadataOf(m: UIMessage): Record<string, unknown> {
  const md = (m as { metadata?: unknown }).metadata;
  return md && typeof md === "object" ? (md as Record<string, unknown>) : {};
}

export type RunsByToolCall = Record<string, Run[]>;

// Answers a chat's waiting tool calls: its own approvals, and those of its
// helpers' runs.
export type Answers = { onApprove?: OnApprove; onAnswerRun?: OnAnswerRun };

function ToolCard({ part, runs, onDrillIn, answers }: { part: ToolPart; runs: Run[]; onDrillIn?: (run: Run) => void; answers?: Answers }) {
  const name = toolNameOf(part);
  const state = toolStateOf(part);
  const input = "input" in part ? part.input : undefined;
  const output = "output" in part ? part.output : undefined;
  const errorText = "errorText" in part ? part.errorText : undefined;
  const sorted = [...runs].sort((a, b) => a.order - b.order);
  return (
    <div className="tool" data-testid="tool-call" data-tool-name={name} data-tool-call-id={part.toolCallId} data-state={state}>
      <div className="tool-head">
        <span className="tool-icon" aria-hidden="true">
          ƒ
        </span>
        <span className="tool-name">{name}</span>
        <span className="tool-input">{previewInput(input)}</span>
        {toolBadge(state)}
      </div>
      {sorted.length > 0 && (
        <div className={`helpers ${sorted.length > 1 ? "helpers-many" : ""}`}>
          {sorted.map((run) => (
            <HelperPanel key={run.runId} run={run} onDrillIn={onDrillIn ?? (() => {})} onAnswer={answers?.onAnswerRun} />
          ))}
        </div>
      )}
      {state === "done" && output !== undefined && (
        <details className="tool-output">
          <summary>Tool result</summary>
          <pre>{formatOutput(output)}</pre>
        </details>
      )}
      {state === "error" && <div className="error-text">{errorText ?? (part.state === "output-denied" ? "Denied." : "The tool failed.")}</div>}
      <ApprovalButtons part={part} onApprove={answers?.onApprove} />
    </div>
  );
}

export function MessageView({
  message,
  runsByToolCall,
  onDrillIn,
  answers,
}: {
  message: UIMessage;
  runsByToolCall?: RunsByToolCall;
  onDrillIn?: (run: Run) => void;
  answers?: Answers;
}) {
  const md = metadataOf(message);
  const isEvent = md.source === BACKGROUND_SOURCE;
  const role = message.role;
  const content = message.parts.map((part, i) => {
    if (part.type === "text") return <Markdown key={i} text={part.text} />;
    if (part.type === "reasoning") {
      return (
        <div key={i} className="reasoning">
          {part.text}
        </div>
      );
    }
    if (isToolPart(part)) {
      return (
        <ToolCard key={part.toolCallId || i} part={part} runs={runsByToolCall?.[part.toolCallId] ?? []} onDrillIn={onDrillIn} answers={answers} />
      );
    }
    return null;
  });
  if (isEvent) {
    const milestone = typeof md.milestone === "string" ? md.milestone : undefined;
    return (
      <div className="msg msg-event" data-testid="background-event" data-kind={milestone ? "milestone" : "completion"} data-message-id={message.id}>
        <div className="msg-event-head">
          <span className="msg-role">Agent event</span>
          {milestone ? (
            <Badge tone="info">Milestone: {milestone}</Badge>
          ) : (
            <Badge tone={md.status === "completed" ? "ok" : "warn"}>Background result{typeof md.status === "string" ? ` · ${md.status}` : ""}</Badge>
          )}
        </div>
        <div className="msg-body">{content}</div>
      </div>
    );
  }
  return (
    <div className={`msg msg-${role}`} data-testid="message" data-role={role} data-message-id={message.id}>
      <div className="msg-role">{role === "user" ? "You" : role === "assistant" ? "Assistant" : role}</div>
      <div className="msg-body">{content}</div>
    </div>
  );
}

export function Composer({
  onSend,
  disabled,
  placeholder,
  testId,
}: {
  onSend: (text: string) => void;
  disabled?: boolean;
  placeholder: string;
  testId: string;
}) {
  const [text, setText] = useState("");
  const submit = (e: FormEvent) => {
    e.preventDefault();
    const t = text.trim();
    if (!t || disabled) return;
    onSend(t);
    setText("");
  };
  return (
    <form className="composer" onSubmit={submit} data-testid={testId}>
      <input value={text} onChange={(e) => setText(e.target.value)} placeholder={placeholder} aria-label={placeholder} />
      <button type="submit" className="btn btn-primary" disabled={disabled || text.trim() === ""}>
        Send
      </button>
    </form>
  );
}

// withoutStandIns hides the stand-ins of continuations. After an approval
// or a client tool's output, the server continues the assistant message in
// a new stream, which the tab that answered renders as a message of its
// own until the server's transcript holds the merged message; the AI SDK
// may then keep that copy. A message that directly follows an assistant
// message and whose parts that one already has is such a copy.
export function withoutStandIns(messages: UIMessage[]): UIMessage[] {
  const key = (p: UIMessage["parts"][number]) =>
    "toolCallId" in p ? `tool:${p.toolCallId}` : p.type === "text" ? `text:${p.text}` : p.type === "step-start" ? "" : `other:${JSON.stringify(p)}`;
  return messages.filter((m, i) => {
    const prev = messages[i - 1];
    if (i === 0 || m.role !== "assistant" || prev.role !== "assistant") return true;
    const have = new Set(prev.parts.map(key));
    const own = m.parts.map(key).filter((k) => k !== "");
    return own.length === 0 || !own.every((k) => have.has(k));
  });
}
