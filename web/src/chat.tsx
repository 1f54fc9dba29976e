// Chat transcript rendering: messages, tool calls with their inline helper
// panels, background notices, and the composer.
import { useRef, useState, type ChangeEvent, type FormEvent } from "react";
import type { FileUIPart, UIMessage } from "ai";
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
    if (part.type === "file") {
      return (
        <div key={i} className="file-part" data-testid="file-part">
          {part.mediaType.startsWith("image/") ? <img src={part.url} alt={part.filename ?? "image"} /> : <span className="attachment">{part.filename ?? part.mediaType}</span>}
        </div>
      );
    }
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
      {role === "assistant" && <UsageLine md={md} />}
    </div>
  );
}

// MAX_ATTACHMENT_BYTES keeps an attachment, sent as a data: URL inside the
// chat request frame, under the server's 1 MiB frame limit (base64 adds a
// third).
const MAX_ATTACHMENT_BYTES = 700 * 1024;

export function Composer({
  onSend,
  disabled,
  placeholder,
  testId,
}: {
  onSend: (text: string, files: FileUIPart[]) => void;
  disabled?: boolean;
  placeholder: string;
  testId: string;
}) {
  const [text, setText] = useState("");
  const [files, setFiles] = useState<FileUIPart[]>([]);
  const [error, setError] = useState<string | null>(null);
  const picker = useRef<HTMLInputElement>(null);
  const submit = (e: FormEvent) => {
    e.preventDefault();
    const t = text.trim();
    if (!t || disabled) return;
    onSend(t, files);
    setText("");
    setFiles([]);
  };
  const attach = (e: ChangeEvent<HTMLInputElement>) => {
    const list = Array.from(e.target.files ?? []);
    e.target.value = "";
    setError(null);
    for (const f of list) {
      if (f.size > MAX_ATTACHMENT_BYTES) {
        setError(`${f.name} is ${Math.round(f.size / 1024)} KB; attachments can be at most ${MAX_ATTACHMENT_BYTES / 1024} KB.`);
        continue;
      }
      const reader = new FileReader();
      reader.onload = () =>
        setFiles((have) => [...have, { type: "file", mediaType: f.type || "application/octet-stream", filename: f.name, url: String(reader.result) }]);
      reader.readAsDataURL(f);
    }
  };
  return (
    <>
      {/* Outside the form: the form's inputs stay the text box alone. */}
      <input
        ref={picker}
        type="file"
        accept="image/*,application/pdf,text/plain"
        multiple
        hidden
        onChange={attach}
        data-testid={`${testId}-file`}
      />
      <form className="composer" onSubmit={submit} data-testid={testId}>
      {(files.length > 0 || error) && (
        <div className="attachments" data-testid="attachments">
          {files.map((f, i) => (
            <span key={i} className="attachment">
              {f.filename}
              <button type="button" aria-label={`Remove ${f.filename}`} onClick={() => setFiles((have) => have.filter((_, j) => j !== i))}>
                ×
              </button>
            </span>
          ))}
          {error && <span className="error-text">{error}</span>}
        </div>
      )}
      <div className="composer-row">
        <button type="button" className="btn" onClick={() => picker.current?.click()} disabled={disabled} aria-label="Attach a file" title="Attach a file">
          <svg width="16" height="16" viewBox="0 0 24 24" fill="none" stroke="currentColor" strokeWidth="2" strokeLinecap="round" aria-hidden="true">
            <path d="M21 11.5l-8.6 8.6a5 5 0 0 1-7.1-7.1l8.6-8.6a3.5 3.5 0 0 1 5 5l-8.6 8.6a2 2 0 0 1-2.8-2.8l8-8" />
          </svg>
        </button>
        <input value={text} onChange={(e) => setText(e.target.value)} placeholder={placeholder} aria-label={placeholder} />
        <button type="submit" className="btn btn-primary" disabled={disabled || text.trim() === ""}>
          Send
        </button>
      </div>
      </form>
    </>
  );
}

// UsageLine shows an assistant message's token usage (its metadata, which
// the server writes): its own model calls and, when it used helpers, the
// whole delegation tree.
function UsageLine({ md }: { md: Record<string, unknown> }) {
  const total = (u: unknown) => (u && typeof u === "object" ? Number((u as { totalTokens?: number }).totalTokens ?? 0) : 0);
  const own = total(md.usage);
  const tree = total(md.treeUsage);
  if (!own && !tree) return null;
  return (
    <div className="msg-usage" data-testid="usage" data-tokens={own} data-tree-tokens={tree}>
      {own.toLocaleString()} tokens{tree > own ? ` · ${tree.toLocaleString()} with helpers` : ""}
    </div>
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
