// Drives the real npm agent-tool reducer (agents@0.32.0: applyAgentToolEvent
// and the dedupe key useAgentToolEvents uses, over AgentClient's socket)
// against the Go server at argv[2], whose ProgParent runs one background
// (detached) ProgWorker. The script decides every step through the
// parent's callables (start, step), so nothing depends on timing. Every
// check is an assertion; the process exits non-zero on the first failure.
// Run by test/e2e TestDetachedProgress.
import assert from "node:assert/strict";
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { useAgentToolEvents } from "./tool-events.mjs";

const host = process.argv[2];
const name = process.argv[3] ?? "progress-e2e";
const log = (...a) => console.log(...a);


const connect = async () => {
  const c = new AgentClient({ agent: "ProgParent", name, host, WebSocket });
  const tools = useAgentToolEvents(c);
  await c.ready;
  return { c, tools };
};
const runOf = (s, id) => s.runsById[id];
const progressIs = (id, want) => (s) => {
  const p = runOf(s, id)?.progress;
  return p !== undefined && Object.entries(want).every(([k, v]) => p[k] === v);
};
const milestoneNames = (r) => (r?.milestones ?? []).map((m) => `${m.sequence}:${m.name}`);

// 1. Live.
const { c: live, tools } = await connect();
const runId = await live.call("start", []);
assert.equal(runId, "bg-1");
await tools.until((s) => runOf(s, runId)?.status === "running", "the run running");
assert.equal(runOf(tools.state, runId).agentType, "ProgWorker");
assert.deepEqual(tools.state.unboundRuns.map((r) => r.runId), [runId]);

const step = (kind, args = {}) => live.call("step", [kind, args]);
await step("progress", { fraction: 0.25, phase: "search", message: "Searching" });
await tools.until(progressIs(runId, { fraction: 0.25, phase: "search", message: "Searching" }), "progress 0.25");
// The second signal may fall in the 200 ms window: it still arrives (the
// trailing send), and the dedupe must not drop it.
await step("progress", { fraction: 0.5, phase: "read", message: "Reading" });
await tools.until(progressIs(runId, { fraction: 0.5, phase: "read", message: "Reading" }), "progress 0.5");
await step("milestone", { name: "sources-gathered", fraction: 0.6, phase: "gathered", message: "3 sources" });
await tools.until((s) => milestoneNames(runOf(s, runId)).join() === "0:sources-gathered", "milestone 0");
assert.equal(runOf(tools.state, runId).progress.milestone, "sources-gathered");
await step("milestone", { name: "draft-ready", fraction: 0.7 });
await tools.until((s) => milestoneNames(runOf(s, runId)).join() === "0:sources-gathered,1:draft-ready", "milestone 1");
await step("progress", { fraction: 0.9, phase: "polish", message: "Polishing" });
await tools.until(progressIs(runId, { fraction: 0.9, phase: "polish", message: "Polishing" }), "progress 0.9");
const liveRun = runOf(tools.state, runId);
assert.equal(liveRun.status, "running");
assert.deepEqual(liveRun.parts.filter((p) => p.type === "data-agent-progress"), [], "progress is transient");
log("1 live ok:", JSON.stringify({ progress: liveRun.progress, milestones: liveRun.milestones }));
live.close();

// 2. A fresh connection rebuilds progress and milestones from the replay.
const { c: again, tools: replayed } = await connect();
await replayed.until(progressIs(runId, { fraction: 0.9, phase: "polish", message: "Polishing" }), "replayed progress");
await replayed.until((s) => milestoneNames(runOf(s, runId)).join() === "0:sources-gathered,1:draft-ready", "replayed milestones");
const rebuilt = runOf(replayed.state, runId);
assert.equal(rebuilt.status, "running");
assert.deepEqual(rebuilt.milestones, liveRun.milestones, "milestones (sequence, name, at) as live");
assert.ok(replayed.frames.every((f) => f.replay === true), "only replay frames so far");
assert.equal(replayed.frames.filter((f) => f.event.kind === "chunk" && f.event.body.includes("data-agent-progress")).length, 1,
  "the replay carries only the latest progress");
log("2 replay ok:", replayed.frames.length, "frames");

// 3. Live progress keeps reaching the new connection; the run completes.
await again.call("step", ["progress", { fraction: 1, phase: "done", message: "Done" }]);
await replayed.until(progressIs(runId, { fraction: 1, phase: "done", message: "Done" }), "progress 1 after the reconnect");
await again.call("step", ["finish", {}]);
await replayed.until((s) => runOf(s, runId)?.status === "completed", "completed");
assert.equal(runOf(replayed.state, runId).summary, "Report ready");
again.close();

// 4. After the end, a fresh connection still gets the last progress, the
// milestones and the terminal state.
const { c: late, tools: after } = await connect();
await after.until((s) => runOf(s, runId)?.status === "completed", "replayed completion");
const final = runOf(after.state, runId);
assert.deepEqual(milestoneNames(final), ["0:sources-gathered", "1:draft-ready"]);
assert.equal(final.progress.fraction, 1);
assert.equal(final.progress.phase, "done");
assert.equal(final.summary, "Report ready");
late.close();
log("PASS progress");
process.exit(0);
