// Rendering of AI SDK message parts: the chat's own messages and the
// helpers' timelines use the same part vocabulary, so they share this code.
import { Fragment, type ReactNode } from "react";
import type { UIMessage } from "ai";

export type Part = UIMessage["parts"][number];
export type ToolPart = Extract<Part, { toolCallId: string }>;

export function isToolPart(part: Part): part is ToolPart {
  return part.type === "dynamic-tool" || part.type.startsWith("tool-");
}

export function toolNameOf(part: ToolPart): string {
  if (part.type === "dynamic-tool") return (part as { toolName: string }).toolName;
  return part.type.slice("tool-".length);
}

export type ToolState = "running" | "approval" | "done" | "error";

export function toolStateOf(part: ToolPart): ToolState {
  switch (part.state) {
    case "approval-requested":
      return "approval";
    case "output-available":
      return "done";
    case "output-error":
    case "output-denied":
      return "error";
    default:
      return "running";
  }
}

// A short, readable view of a tool's or helper's input: the value itself
// when the input has one string field ({query: "…"}), else compact JSON.
export function previewInput(input: unknown): string {
  if (input === undefined || input === null) return "";
  if (typeof input === "string") {
    // Helpers' input previews arrive as JSON text.
    if (/^\s*[{[]/.test(input)) {
      try {
        return previewInput(JSON.parse(input));
      } catch {
        return input;
      }
    }
    return input;
  }
  if (typeof input === "object" && !Array.isArray(input)) {
    const values = Object.values(input as Record<string, unknown>);
    if (values.length === 1 && typeof values[0] === "string") return values[0];
    if (values.every((v) => typeof v === "string")) {
      return Object.entries(input as Record<string, string>)
        .map(([k, v]) => `${k}: ${v}`)
        .join(" · ");
    }
  }
  return JSON.stringify(input);
}

export function textOf(parts: readonly Part[]): string {
  return parts
    .filter((p): p is Extract<Part, { type: "text" }> => p.type === "text")
    .map((p) => p.text)
    .join("");
}

// Inline markup: `code` and **bold**.
function inline(text: string): ReactNode[] {
  const out: ReactNode[] = [];
  const re = /(`[^`]+`|\*\*[^*]+\*\*)/g;
  let last = 0;
  let m: RegExpExecArray | null;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) out.push(text.slice(last, m.index));
    const tok = m[0];
    out.push(
      tok.startsWith("`") ? <code key={m.index}>{tok.slice(1, -1)}</code> : <strong key={m.index}>{tok.slice(2, -2)}</strong>,
    );
    last = m.index + tok.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

type Block =
  | { kind: "h"; level: number; text: string }
  | { kind: "ul" | "ol"; items: string[] }
  | { kind: "p"; text: string };

// A small Markdown subset (headings, lists, paragraphs), enough for the
// helpers' plans and summaries. It builds React elements, never HTML.
export function Markdown({ text }: { text: string }) {
  const blocks: Block[] = [];
  for (const raw of text.split("\n")) {
    const line = raw.trimEnd();
    const prev = blocks[blocks.length - 1];
    let m: RegExpMatchArray | null;
    if (line.trim() === "") {
      blocks.push({ kind: "p", text: "" });
    } else if ((m = line.match(/^(#{1,4})\s+(.*)$/))) {
      blocks.push({ kind: "h", level: m[1].length, text: m[2] });
    } else if ((m = line.match(/^\s*[-*]\s+(.*)$/))) {
      if (prev?.kind === "ul") prev.items.push(m[1]);
      else blocks.push({ kind: "ul", items: [m[1]] });
    } else if ((m = line.match(/^\s*\d+[.)]\s+(.*)$/))) {
      if (prev?.kind === "ol") prev.items.push(m[1]);
      else blocks.push({ kind: "ol", items: [m[1]] });
    } else if (prev?.kind === "p" && prev.text !== "") {
      prev.text += " " + line.trim();
    } else {
      blocks.push({ kind: "p", text: line.trim() });
    }
  }
  return (
    <div className="md">
      {blocks.map((b, i) => {
        switch (b.kind) {
          case "h":
            return (
              <div key={i} className={`md-h md-h${b.level}`}>
                {inline(b.text)}
              </div>
            );
          case "ul":
          case "ol": {
            const List = b.kind;
            return (
              <List key={i}>
                {b.items.map((it, j) => (
                  <li key={j}>{inline(it)}</li>
                ))}
              </List>
            );
          }
          default:
            return b.text === "" ? <Fragment key={i} /> : <p key={i}>{inline(b.text)}</p>;
        }
      })}
    </div>
  );
}

export function Badge({ tone = "neutral", children, testId }: { tone?: string; children: ReactNode; testId?: string }) {
  return (
    <span className={`badge badge-${tone}`} data-testid={testId}>
      {children}
    </span>
  );
}

export function toolBadge(state: ToolState) {
  switch (state) {
    case "done":
      return <Badge tone="ok">Done</Badge>;
    case "error":
      return <Badge tone="bad">Error</Badge>;
    case "approval":
      return <Badge tone="warn">Needs approval</Badge>;
    default:
      return <Badge tone="live">Running</Badge>;
  }
}

// onApprove answers a tool call's approval request (approved or denied).
export type OnApprove = (part: ToolPart, approved: boolean) => void;

// The approve and deny buttons of a tool call waiting for approval.
export function ApprovalButtons({ part, onApprove }: { part: ToolPart; onApprove?: OnApprove }) {
  if (part.state !== "approval-requested" || !onApprove) return null;
  return (
    <div className="approval" data-testid="approval">
      <span className="muted small">This action needs your approval.</span>
      <button type="button" className="btn btn-small btn-primary" data-testid="approve" onClick={() => onApprove(part, true)}>
        Approve
      </button>
      <button type="button" className="btn btn-small btn-danger" data-testid="deny" onClick={() => onApprove(part, false)}>
        Deny
      </button>
    </div>
  );
}

function formatOutput(output: unknown): string {
  if (typeof output === "string") return output;
  return JSON.stringify(output, null, 2);
}

// A tool call inside a helper's timeline: one compact row, its result
// folded away.
export function CompactToolPart({ part, onApprove }: { part: ToolPart; onApprove?: OnApprove }) {
  const state = toolStateOf(part);
  const input = "input" in part ? part.input : undefined;
  const output = "output" in part ? part.output : undefined;
  const errorText = "errorText" in part ? part.errorText : undefined;
  return (
    <div className="tl-tool" data-testid="timeline-tool" data-tool-name={toolNameOf(part)} data-state={state}>
      <div className="tl-tool-head">
        <span className="tl-tool-name">{toolNameOf(part)}</span>
        <span className="tl-tool-input">{previewInput(input)}</span>
        {toolBadge(state)}
      </div>
      {state === "done" && output !== undefined && (
        <details className="tl-tool-output">
          <summary>result</summary>
          <pre>{formatOutput(output)}</pre>
        </details>
      )}
      {state === "error" && <div className="error-text">{errorText ?? (part.state === "output-denied" ? "Denied." : "The tool failed.")}</div>}
      <ApprovalButtons part={part} onApprove={onApprove} />
    </div>
  );
}

// The parts of a helper's message: text, reasoning and tool calls; the
// rest (step markers, data parts) has no visible form.
export function Timeline({ parts, onApprove }: { parts: readonly Part[]; onApprove?: OnApprove }) {
  return (
    <div className="timeline" data-testid="timeline">
      {parts.map((part, i) => {
        if (part.type === "text") {
          return (
            <div key={i} className="tl-text" data-testid="timeline-text">
              <Markdown text={part.text} />
            </div>
          );
        }
        if (part.type === "reasoning") {
          return (
            <div key={i} className="tl-reasoning">
              {part.text}
            </div>
          );
        }
        if (isToolPart(part)) return <CompactToolPart key={part.toolCallId || i} part={part} onApprove={onApprove} />;
        return null;
      })}
    </div>
  );
}

export { formatOutput };
