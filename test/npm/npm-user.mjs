// One user of the load generator (bench/load -npm-share) on the real npm
// clients: AgentClient (agents/client), the useAgentChat parts of
// use-agent-chat.mjs (@cloudflare/ai-chat's WebSocketChatTransport and the
// AI SDK's AbstractChat) and the useAgentToolEvents reducer
// (tool-events.mjs), against the demo Assistant instance argv[3] of the
// server at argv[2] (host:port). For argv[4] milliseconds it repeats, with
// argv[5] ms between actions, an action drawn from the weights argv[6]
// ("research=4,fanout=2,reconnect=1"; other actions count as research),
// argv[7] seeding its choices. With argv[8] "wait" it first opens its tab,
// prints {"ready":true} and waits for a line on stdin: its argv[4]
// milliseconds count from that line (bench/load starts its window once
// every npm user is up, so the node processes' start-up is not measured):
//   research   "research <topic>", then its run's events reach completed;
//   fanout     "compare A, B and C", then its three runs' events do;
//   reconnect  a research turn whose tab is closed after its first chunk; a
//              new tab (transcript from get-messages) resumes the stream.
// It prints one JSON line per event on stdout, which bench/load reads:
//   {"turn":{"action":"…","first":ms,"end":ms,"runs":n}}
//   {"error":{"kind":"…","message":"…"}}
//   {"done":{"sent":[user message ids],"answers":[assistant message ids]}}
//   {"ready":true}   (with "wait")
// and exits 0 once the last action ended (errors are reported, not thrown).
import { AgentClient } from "agents/client";
import WebSocket from "ws";
import { useAgentChat, textOf } from "./use-agent-chat.mjs";
import { useAgentToolEvents } from "./tool-events.mjs";

const [host, name, durationArg, thinkArg, mixArg = "research=1", seedArg = "1", startArg = ""] = process.argv.slice(2);
let deadline = Date.now() + Number(durationArg);
const think = Number(thinkArg);
const limit = 120000;
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");

const weights = [];
for (const f of mixArg.split(",")) {
  const [k, v] = f.split("=");
  const w = Number(v);
  if (w > 0) weights.push([k === "fanout" || k === "reconnect" ? k : "research", w]);
}
const total = weights.reduce((a, [, w]) => a + w, 0);
// A small deterministic generator (mulberry32), so runs repeat.
let seed = Number(seedArg) >>> 0;
const random = () => {
  seed = (seed + 0x6d2b79f5) >>> 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pick = () => {
  let r = random() * total;
  for (const [k, w] of weights) {
    if (r < w) return k;
    r -= w;
  }
  return "research";
};

const getMessages = async () => {
  const res = await fetch(`http://${host}/agents/assistant/${encodeURIComponent(name)}/get-messages`);
  if (!res.ok) throw new Error("get-messages: " + res.status);
  return res.json();
};

// A tab: an AgentClient with useAgentChat and useAgentToolEvents on it,
// and a log of the chat response frames it received. The listeners are
// there before the socket opens, as the hooks' are in a page: the frames a
// server sends on connect (the agent-tool events' replay) come in the same
// read as the one that makes the client ready.
let tabs = 0;
async function openTab() {
  const agent = new AgentClient({ agent: "Assistant", name, host, WebSocket });
  const tools = useAgentToolEvents(agent);
  const responses = [];
  let onResponse = () => {};
  agent.addEventListener("message", (e) => {
    if (typeof e.data !== "string") return;
    const d = JSON.parse(e.data);
    if (d.type === "cf_agent_use_chat_response" && d.body && !d.error) {
      responses.push(d);
      onResponse(d);
    }
  });
  await agent.ready;
  const { chat } = useAgentChat(agent, "tab" + ++tabs, { messages: await getMessages() });
  return { agent, tools, chat, responses, setOnResponse: (f) => { onResponse = f; } };
}

const timeout = (p, what) => Promise.race([p, new Promise((_, rej) => setTimeout(() => rej(new Error("timed out: " + what)), limit))]);

const sent = [];
const answers = [];
let tab;
try {
  tab = await openTab();
} catch (e) {
  out({ error: { kind: "npm dial", message: String(e?.message ?? e) } });
  out({ done: { sent, answers } });
  process.exit(0);
}
if (startArg === "wait") {
  out({ ready: true });
  await new Promise((resolve) => {
    let buf = "";
    const onData = (d) => {
      buf += d;
      if (!buf.includes("\n")) return;
      process.stdin.off("data", onData);
      process.stdin.pause();
      resolve();
    };
    process.stdin.setEncoding("utf8");
    process.stdin.on("data", onData);
    process.stdin.on("end", resolve);
  });
  deadline = Date.now() + Number(durationArg);
}
let n = 0;

async function turn(action) {
  n++;
  const topic = `topic ${n} of npm user ${name}`;
  const text = action === "fanout" ? `compare alpha ${topic}, beta ${topic} and gamma ${topic}` : `research ${topic}`;
  const runs = action === "fanout" ? 3 : 1;
  const start = Date.now();
  let first = 0;
  let gotFirst;
  const firstChunk = new Promise((r) => { gotFirst = r; });
  tab.setOnResponse(() => { if (!first) { first = Date.now() - start; gotFirst(); } });
  let sending = tab.chat.sendMessage({ text });
  // A turn that ends (or is refused) before its first chunk is not resumed.
  const chunked = await timeout(Promise.race([firstChunk.then(() => true), sending.then(() => false)]), "the first chunk");
  if (action === "reconnect" && chunked) {
    const old = tab;
    tab = await openTab();
    old.agent.close();
    sending.catch(() => {});
    await timeout(tab.chat.resumeStream(), "the resumed stream");
    sending = tab.chat.whenMessages((ms) => {
      const i = ms.findIndex((m) => m.role === "user" && textOf(m) === text);
      return i >= 0 && ms[i + 1]?.role === "assistant" && tab.chat.status === "ready";
    }, "the resumed answer", limit);
  }
  await timeout(sending, "the turn");
  if (tab.chat.status !== "ready") throw Object.assign(new Error("chat status " + tab.chat.status + ": " + tab.chat.error?.message), { kind: "turn-error" });
  if (action === "reconnect" && !chunked) out({ note: "the turn ended before its first chunk: not resumed" });
  const ms = tab.chat.messages;
  const ui = ms.findIndex((m) => m.role === "user" && textOf(m) === text);
  const user = ms[ui];
  const answer = ms[ui + 1];
  if (!user || answer?.role !== "assistant") throw Object.assign(new Error("no answer to " + JSON.stringify(text)), { kind: "answer" });
  sent.push(user.id);
  answers.push(answer.id);
  const call = answer.parts.find((p) => (p.type === "tool-research" || p.type === "tool-compare") && p.toolCallId);
  if (!call) throw Object.assign(new Error("no research tool call: " + textOf(answer)), { kind: "answer" });
  await tab.tools.until((s) => {
    const rs = s.runsByToolCallId[call.toolCallId] ?? [];
    return rs.length >= runs && rs.every((r) => r.status !== "running");
  }, `${runs} runs under ${call.toolCallId}`);
  const bad = tab.tools.getRunsForToolCall(call.toolCallId).find((r) => r.status !== "completed");
  if (bad) throw Object.assign(new Error(`run ${bad.runId} ended ${bad.status}: ${bad.error}`), { kind: "run-" + bad.status });
  out({ turn: { action, first, end: Date.now() - start, runs } });
}

while (Date.now() < deadline) {
  const action = pick();
  try {
    await turn(action);
  } catch (e) {
    out({ error: { kind: "npm " + (e.kind ?? action), message: String(e?.message ?? e) } });
    // Start over on a new tab with the server's transcript.
    try { tab.agent.close(); } catch {}
    try { tab = await openTab(); } catch (e2) {
      out({ error: { kind: "npm dial", message: String(e2?.message ?? e2) } });
      break;
    }
  }
  const wait = Math.min(think, Math.max(0, deadline - Date.now()));
  if (wait > 0) await new Promise((r) => setTimeout(r, wait));
}
out({ done: { sent, answers } });
tab.agent.close();
process.exit(0);
