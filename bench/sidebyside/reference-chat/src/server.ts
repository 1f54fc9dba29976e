/**
 * Reference chat harness for bench/load (-npm-share 1) at 100 users: the
 * demo of `agentry serve` (examples/agents-as-tools) rebuilt on the
 * Cloudflare reference (agents 0.32.0, @cloudflare/think 0.23.0), with
 * a deterministic fake model that streams like the demo's scripted models
 * (examples/agents-as-tools/models.go) at `agentry serve`'s default pace:
 *
 * - Assistant (a Think chat agent, /agents/assistant/<name>): "research
 *   <topic>" is one call of the `research` agent tool (agentTool(Researcher));
 *   "compare A, B and C" one call of `compare`, which runs three Researchers
 *   under its tool call (runAgentTool with parentToolCallId, as the demo's
 *   compare does); after the tool results, a short text from them.
 * - Researcher (a Think chat child, a facet of the Assistant): calls its
 *   `web_search` tool (three progress signals, the last a milestone, and
 *   SEARCH_MS in three steps, as the demo's simulated search), then streams
 *   its summary.
 *
 * The model's events are the demo's: text in chunks of at most CHUNK
 * characters, a tool call as its start, its JSON input in chunks and the
 * whole call, and a finish; DELAY_MS between two events (none before the
 * first). No network: nothing leaves the isolate.
 */
import { routeAgentRequest } from "agents";
import { agentTool } from "agents/agent-tools";
import { Think } from "@cloudflare/think";
import { tool, type LanguageModel, type ToolSet, type UIMessage } from "ai";
import { z } from "zod";

type Env = Record<string, unknown>;

// `agentry serve`'s defaults: --delay 50ms, the search 40 times as long.
const DELAY_MS = 50;
const SEARCH_MS = 40 * DELAY_MS;
const CHUNK = 8;

type Step = { text: string } | { tool: string; input: unknown };

// ---- the demo's wording (examples/agents-as-tools/models.go) ----

const compare3Re = /compare\s+(.+?),\s*(.+?),?\s+and\s+(.+?)[.?!]*$/i;
const fillerRe =
  /^(please\s+)?(can you\s+)?(hi,?|hello,?|hey,?|research|look into|find out about|tell me about|in the background,?|plan( how to)?|make a plan (for|to))\s+/i;

function topic(s: string): string {
  s = s.trim();
  for (;;) {
    const t = s.replace(fillerRe, "").trim();
    if (t === s) break;
    s = t;
  }
  s = s.replace(/^[.?!, ]+|[.?!, ]+$/g, "");
  return [...s].length < 3 ? "the topic you asked about" : s;
}

const capitalize = (s: string) => (s ? s[0].toUpperCase() + s.slice(1) : s);

function firstSentence(s: string): string {
  s = s.trim();
  for (let i = 0; i < s.length; i++) {
    if (s[i] !== "." || (i + 1 < s.length && s[i + 1] !== " " && s[i + 1] !== "\n")) continue;
    const start = Math.max(s.lastIndexOf(" ", i - 1), s.lastIndexOf("\n", i - 1)) + 1;
    const word = s.slice(start, i);
    if (word === "" || /^[0-9]+$/.test(word) || word.length === 1 || word.includes(".")) continue;
    return s.slice(0, i + 1);
  }
  return s;
}

// ---- the fake model ----

type Prompt = Array<{ role: string; content: any }>;

function lastUserText(prompt: Prompt): string {
  for (let i = prompt.length - 1; i >= 0; i--) {
    const m = prompt[i];
    if (m.role !== "user") continue;
    return (m.content as any[]).filter((p) => p.type === "text").map((p) => p.text).join("");
  }
  return "";
}

function toolResults(prompt: Prompt): Array<{ toolName: string; value: unknown }> | null {
  const last = prompt[prompt.length - 1];
  if (!last || last.role !== "tool") return null;
  return (last.content as any[])
    .filter((p) => p.type === "tool-result")
    .map((p) => ({ toolName: p.toolName, value: p.output?.value }));
}

function assistantScript(prompt: Prompt): Step[] {
  const results = toolResults(prompt);
  if (results) {
    const parts: string[] = [];
    for (const r of results) {
      if (typeof r.value === "string") {
        if (r.value) parts.push(firstSentence(r.value));
        continue;
      }
      const cmp = r.value as Record<string, { status: string; summary?: string; error?: string }>;
      const side = (s?: { status: string; summary?: string; error?: string }) =>
        s?.status === "completed" ? firstSentence(s.summary ?? "") : `(${s?.status}: ${s?.error})`;
      if (cmp && cmp.a) {
        let text = "Side A: " + side(cmp.a) + " Side B: " + side(cmp.b);
        if (cmp.c) text += " Side C: " + side(cmp.c);
        parts.push(text);
      }
    }
    return [{ text: parts.length ? parts.join(" ") : "Done." }];
  }
  const text = lastUserText(prompt).trim();
  const m = compare3Re.exec(text);
  if (m) return [{ tool: "compare", input: { a: m[1].trim(), b: m[2].trim(), c: m[3].trim() } }];
  return [{ tool: "research", input: { query: topic(text) } }];
}

function researcherScript(prompt: Prompt): Step[] {
  let q = "";
  const first = prompt.find((m) => m.role === "user");
  if (first) q = (first.content as any[]).filter((p) => p.type === "text").map((p) => p.text).join("").trim();
  const results = toolResults(prompt);
  if (!results) return [{ tool: "web_search", input: { query: q } }];
  const found = (results[0]?.value as Array<{ title: string }>) ?? [];
  return [
    {
      text:
        `${capitalize(q)} is worth knowing well. I read ${found.length} sources (${found.map((r) => r.title).join("; ")}). ` +
        `In short: ${q} is widely used, and the main trade-offs are cost, complexity and fit for your team.`
    }
  ];
}

function chunks(s: string): string[] {
  const cps = [...s];
  const out: string[] = [];
  for (let i = 0; i < cps.length; i += CHUNK) out.push(cps.slice(i, i + CHUNK).join(""));
  return out;
}

let ids = 0;

/** A LanguageModelV4 whose replies come from script, paced like the demo's scripted model. */
function fakeModel(name: string, script: (prompt: Prompt) => Step[]): LanguageModel {
  return {
    specificationVersion: "v4",
    provider: "fake",
    modelId: name,
    supportedUrls: {},
    doGenerate() {
      throw new Error("doGenerate not implemented in fake model");
    },
    doStream(options: { prompt: Prompt; abortSignal?: AbortSignal }) {
      const steps = script(options.prompt);
      // Each inner array is one event of the demo's model: its parts go
      // out together, DELAY_MS after the previous event.
      const events: any[][] = [];
      let outChars = 0;
      for (const s of steps) {
        if ("text" in s) {
          const id = `t-${++ids}`;
          chunks(s.text).forEach((c, i) => {
            events.push(i === 0 ? [{ type: "text-start", id }, { type: "text-delta", id, delta: c }] : [{ type: "text-delta", id, delta: c }]);
          });
          events.push([{ type: "text-end", id }]);
          outChars += s.text.length;
        } else {
          const id = `call_${options.prompt.length}_${crypto.randomUUID().slice(0, 8)}`;
          const input = JSON.stringify(s.input);
          events.push([{ type: "tool-input-start", id, toolName: s.tool }]);
          for (const c of chunks(input)) events.push([{ type: "tool-input-delta", id, delta: c }]);
          events.push([{ type: "tool-input-end", id }, { type: "tool-call", toolCallId: id, toolName: s.tool, input }]);
          outChars += input.length;
        }
      }
      // text-end rides with the finish, as it has no event of its own in the demo.
      const last = events[events.length - 1];
      if (last.length === 1 && last[0].type === "text-end") events.pop();
      const ended = last[0].type === "text-end" ? [last[0]] : [];
      const toolCalls = steps.length > 0 && !("text" in steps[steps.length - 1]);
      events.push([
        ...ended,
        {
          type: "finish",
          finishReason: toolCalls ? { unified: "tool-calls", raw: "tool_calls" } : { unified: "stop", raw: "stop" },
          usage: {
            inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
            outputTokens: { total: Math.ceil(outChars / 4), text: Math.ceil(outChars / 4), reasoning: 0 }
          }
        }
      ]);
      let i = 0;
      let timer: ReturnType<typeof setTimeout> | undefined;
      const stream = new ReadableStream({
        start(controller) {
          controller.enqueue({ type: "stream-start", warnings: [] });
        },
        pull(controller) {
          return new Promise<void>((resolve) => {
            const emit = () => {
              for (const part of events[i]) controller.enqueue(part);
              i++;
              if (i === events.length) controller.close();
              resolve();
            };
            if (i === 0) emit();
            else timer = setTimeout(emit, DELAY_MS);
          });
        },
        cancel() {
          if (timer) clearTimeout(timer);
        }
      });
      return Promise.resolve({ stream });
    }
  } as unknown as LanguageModel;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Child: researches one topic with a simulated web search. */
export class Researcher extends Think<Env> {
  override getModel() {
    return fakeModel("fake-researcher", researcherScript);
  }
  override getSystemPrompt(): string {
    return "Research the user's topic with web_search and end with a concise summary.";
  }
  // The query is the first message of the child's chat, as a person would
  // have typed it (the demo's FormatAgentToolInput).
  protected override formatAgentToolInput(input: unknown): UIMessage {
    const q = (input as { query?: unknown })?.query;
    const text = typeof q === "string" ? q : typeof input === "string" ? input : JSON.stringify(input);
    return { id: crypto.randomUUID(), role: "user", parts: [{ type: "text", text }] };
  }
  override getTools(): ToolSet {
    return {
      web_search: tool({
        description: "Search the web (simulated).",
        inputSchema: z.object({ query: z.string().min(1) }),
        execute: async ({ query }) => {
          const step = SEARCH_MS / 3;
          await this.reportProgress({ fraction: 0.2, phase: "searching", message: "Searching for " + query });
          await sleep(step);
          await this.reportProgress({ fraction: 0.6, phase: "reading", message: "Reading 2 sources" });
          await sleep(step);
          await this.reportProgress({ milestone: "sources-gathered", data: { query, sources: 2 } });
          await sleep(step);
          await this.reportProgress({ fraction: 0.9, phase: "synthesizing", message: "Writing the summary" });
          const slug = query.toLowerCase().replaceAll(" ", "-");
          return [
            { title: `${query}: an overview`, url: "https://example.com/" + slug, snippet: `What ${query} is and why it matters.` },
            { title: `${query} in practice`, url: "https://example.org/" + slug, snippet: `How teams use ${query} today.` }
          ];
        }
      })
    };
  }
}

/** Parent: the chat users talk to; its helpers are Researchers. */
export class Assistant extends Think<Env> {
  // The demo's cap on helpers running at once (per Assistant instance).
  override maxConcurrentAgentTools = 4;

  override getModel() {
    return fakeModel("fake-assistant", assistantScript);
  }
  override getSystemPrompt(): string {
    return 'You are a helpful assistant with helper agents. Use "research" to research one topic and "compare" to research things side by side.';
  }
  override getTools(): ToolSet {
    return {
      research: agentTool(Researcher, {
        description: "Research one topic in depth with a Researcher helper.",
        inputSchema: z.object({ query: z.string().min(3) }),
        displayName: "Researcher",
        icon: "🔎"
      }),
      compare: tool({
        description: "Research two (or three) things side by side, one Researcher helper each.",
        inputSchema: z.object({ a: z.string(), b: z.string(), c: z.string().optional() }),
        execute: async (input, { toolCallId, abortSignal }) => {
          const sides = (["a", "b", "c"] as const).filter((k) => (input[k] ?? "").trim() !== "");
          const settled = await Promise.all(
            sides.map(async (k, i) => {
              const r = await this.runAgentTool(Researcher, {
                input: { query: input[k] },
                runId: `agent-tool:${toolCallId}:${i}`,
                parentToolCallId: toolCallId,
                displayOrder: i,
                signal: abortSignal,
                display: { name: "Researcher", icon: "🔎" }
              });
              return [k, { status: r.status, summary: r.summary, error: r.error }] as const;
            })
          );
          return Object.fromEntries(settled);
        }
      })
    };
  }
}

export default {
  async fetch(request: Request, env: Env) {
    const url = new URL(request.url);
    if (url.pathname === "/ping") return new Response("pong");
    return (await routeAgentRequest(request, env)) || new Response("Not found", { status: 404 });
  }
};
