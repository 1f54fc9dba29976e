// Drives the real npm agent-tool client code (agents@0.32.0: the reducer
// and dedupe key that useAgentToolEvents uses, AgentClient for the socket
// and the sub-agent route, WebSocketChatTransport + AbstractChat for the
// drill-in chat) against the Go server at argv[2], whose Assistant runs two
// Researchers in parallel under one tool call (examples/seed). Every check
// is an assertion; the process exits non-zero on the first failure. Run by
// test/e2e TestAgentTools.
import assert from "node:assert/strict";
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { WebSocketChatTransport } from "agents/chat/transport";
import { AbstractChat } from "ai";
import { useAgentToolEvents, agentToolEventDedupeKey } from "./tool-events.mjs";
import { buildSubAgentPathUnchecked } from "./node_modules/agents/dist/sub-routing.js";

const host = process.argv[2];
const name = process.argv[3] ?? "agent-tools-e2e";
const toolCallId = "call_compare_1";
const log = (...a) => console.log(...a);


const textOf = (parts) => parts.filter((p) => p.type === "text").map((p) => p.text).join("");
const msgText = (m) => textOf(m.parts);
const bothDone = (s) => {
  const runs = s.runsByToolCallId[toolCallId] ?? [];
  return runs.length === 2 && runs.every((r) => r.status === "completed");
};
// The fields a UI renders from a run.
const view = (r) => ({
  runId: r.runId, agentType: r.agentType, parentToolCallId: r.parentToolCallId, inputPreview: r.inputPreview,
  order: r.order, display: r.display, status: r.status, summary: r.summary, error: r.error,
  subAgent: r.subAgent, text: textOf(r.parts), parts: r.parts.map((p) => ({ type: p.type, text: p.text, state: p.state })),
});

// 1. Live: the Assistant fans out to two Researchers under one tool call.
const live = new AgentClient({ agent: "Assistant", name, host, WebSocket });
const tools = useAgentToolEvents(live);
await live.ready;
const cmp = await live.call("compare", [toolCallId, "HTTP/3", "gRPC"]);
assert.equal(cmp.toolCallId, toolCallId);
assert.deepEqual(cmp.results.map((r) => r.status), ["completed", "completed"]);
await tools.until(bothDone, "two completed runs under " + toolCallId);
const runs = tools.getRunsForToolCall(toolCallId);
assert.deepEqual(runs.map((r) => r.runId), cmp.results.map((r) => r.runId), "runs in display order");
assert.deepEqual(runs.map((r) => r.order), [0, 1]);
assert.deepEqual(runs.map((r) => textOf(r.parts)), ["Findings on HTTP/3: it is well documented.", "Findings on gRPC: it is well documented."]);
assert.deepEqual(runs.map((r) => r.summary), runs.map((r) => textOf(r.parts)), "summaries are the children's answers");
for (const r of runs) {
  assert.equal(r.status, "completed");
  assert.equal(r.agentType, "Researcher");
  assert.equal(r.parentToolCallId, toolCallId);
  assert.deepEqual(r.subAgent, { agent: "Researcher", name: r.runId });
}
assert.deepEqual(tools.state.unboundRuns, []);
// Live frames carry no replay flag; per run the sequences are 0,1,2,… once each.
for (const r of runs) {
  const seqs = tools.frames.filter((f) => f.event.runId === r.runId).map((f) => f.sequence);
  assert.deepEqual(seqs, [...seqs.keys()], "live sequences of " + r.runId);
}
log("1 live ok:", JSON.stringify(runs.map((r) => [r.runId, r.order, r.status, r.summary])));

// 2. A fresh connection rebuilds the same state from the replay alone.
const fresh = new AgentClient({ agent: "Assistant", name, host, WebSocket });
const replayed = useAgentToolEvents(fresh);
await fresh.ready;
await replayed.until(bothDone, "the replay of both runs");
assert.ok(replayed.frames.every((f) => f.replay === true), "only replay frames");
assert.deepEqual(replayed.getRunsForToolCall(toolCallId).map(view), runs.map(view));
// The replay repeated into the live client's seen set changes nothing.
const before = JSON.stringify(tools.state);
for (const f of replayed.frames) {
  const key = agentToolEventDedupeKey(f);
  assert.ok(tools.frames.some((g) => agentToolEventDedupeKey(g) === key), "replay frame " + key + " was seen live");
}
assert.equal(JSON.stringify(tools.state), before);
log("2 replay ok:", replayed.frames.length, "frames");

// 3. Drill-in: the child's own chat through the parent's route.
const run = runs[0];
const subPath = buildSubAgentPathUnchecked([{ className: run.subAgent.agent, name: run.subAgent.name }]).replace(/^\//, "");
const res = await fetch(`http://${host}/agents/assistant/${name}/${subPath}/get-messages`);
assert.equal(res.status, 200);
const transcript = await res.json();
assert.deepEqual(transcript.map((m) => m.role), ["user", "assistant"]);
assert.deepEqual(JSON.parse(msgText(transcript[0])), { query: "HTTP/3" });
assert.equal(msgText(transcript[1]), "Findings on HTTP/3: it is well documented.");

const sub = new AgentClient({ agent: "Assistant", name, host, WebSocket, path: subPath });
let connectMessages;
const gotMessages = new Promise((resolve) => sub.addEventListener("message", (e) => {
  if (typeof e.data !== "string") return;
  const d = JSON.parse(e.data);
  if (d.type === "cf_agent_chat_messages") { connectMessages = d.messages; resolve(); }
}));
await sub.ready;
assert.equal(sub.name, run.runId);
await gotMessages;
assert.deepEqual(connectMessages.map(msgText), transcript.map(msgText));
// The chat client on the child's socket: the transcript is its history, and
// resuming finds nothing streaming (the run is over).
class SimpleState {
  constructor(messages = []) { this.status = "ready"; this.error = undefined; this.messages = messages; }
  pushMessage(m) { this.messages = [...this.messages, m]; }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { const c = [...this.messages]; c[i] = m; this.messages = c; }
  snapshot(x) { return structuredClone(x); }
}
class NodeChat extends AbstractChat {
  constructor(init) { super({ ...init, state: new SimpleState(init.messages ?? []) }); }
}
const transport = new WebSocketChatTransport({ agent: sub });
sub.addEventListener("message", (e) => {
  if (typeof e.data !== "string") return;
  const d = JSON.parse(e.data);
  if (d.type === "cf_agent_stream_resuming") transport.handleStreamResuming(d);
  else if (d.type === "cf_agent_stream_resume_none") transport.handleStreamResumeNone(d);
  else if (d.type === "cf_agent_stream_pending") transport.handleStreamPending();
});
const chat = new NodeChat({ id: "drill-in", transport, messages: connectMessages });
await chat.resumeStream();
assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
assert.deepEqual(chat.messages.map((m) => [m.role, msgText(m)]), transcript.map((m) => [m.role, msgText(m)]));
log("3 drill-in ok:", JSON.stringify(chat.messages.map((m) => [m.role, msgText(m)])));

// 4. A guessed run id is not reachable and creates nothing.
const guess = await fetch(`http://${host}/agents/assistant/${name}/sub/researcher/guessed-run/get-messages`);
assert.equal(guess.status, 404);
log("4 guessed id refused");

live.close(); fresh.close(); sub.close();
log("PASS agent-tools");
process.exit(0);
