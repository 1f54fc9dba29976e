// Drives the real npm clients against the demo's Assistant at argv[2]: a
// research request that asks to publish makes the Researcher helper call
// publish_findings, which needs approval. The approval request shows in the
// parent's agent-tool events under the run (the reducer behind
// useAgentToolEvents: the part in approval-requested, the run running and
// its progress "waiting-for-input"); it is answered once from the parent's
// connection (the agent_tool_approval frame) and once from the drill-in
// chat (useAgentChat's addToolApprovalResponse on the child's socket), and
// the reducer shows each run complete. Every check is an assertion. Run by
// test/e2e TestChildApprovals.
import assert from "node:assert/strict";
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { useAgentToolEvents } from "./tool-events.mjs";
import { useAgentChat } from "./use-agent-chat.mjs";
import { buildSubAgentPathUnchecked } from "./node_modules/agents/dist/sub-routing.js";

const host = process.argv[2];
const room = process.argv[3] ?? "child-approvals";
const log = (...a) => console.log(...a);

const parent = new AgentClient({ agent: "Assistant", name: room, host, WebSocket });
const tools = useAgentToolEvents(parent);
await parent.ready;
const tab = useAgentChat(parent, "parent");

const publishPart = (r) => r.parts.find((p) => p.type === "tool-publish_findings");
const runs = () => Object.values(tools.state.runsById);

// ask sends a research request that publishes, and returns the run once its
// publish call waits for approval.
async function ask(text, n) {
  const sending = tab.chat.sendMessage({ text });
  await tools.until(() => runs().length === n && publishPart(runs()[n - 1])?.state === "approval-requested",
    "the helper's publish call waiting for approval");
  const run = runs()[n - 1];
  assert.equal(run.status, "running", "the run waits, it did not end");
  await tools.until(() => runs()[n - 1].progress?.phase === "waiting-for-input", "the run's waiting progress");
  assert.match(runs()[n - 1].progress.message, /approval of publish_findings/);
  return { run, sending };
}

// 1. Answered from the parent's connection.
let { run, sending } = await ask("Research tides and publish the findings", 1);
const approval = publishPart(run).approval;
assert.ok(approval?.id, "the part carries its approval id");
parent.send(JSON.stringify({ type: "agent_tool_approval", runId: run.runId, toolCallId: publishPart(run).toolCallId, approved: true }));
await tools.until(() => runs()[0].status === "completed", "the run's completion");
run = runs()[0];
assert.equal(publishPart(run).state, "output-available");
assert.match(publishPart(run).output.url, /^https:\/\/wiki\.example\.com\//);
assert.match(run.summary, /I published the findings at https:\/\/wiki\.example\.com\//);
assert.notEqual(run.progress?.phase, "waiting-for-input", "no longer waiting");
await sending;
assert.equal(tab.chat.status, "ready", "parent chat error: " + tab.chat.error?.message);
log("1 parent answer ok:", run.summary);

// 2. Answered (denied) from the drill-in chat.
({ run, sending } = await ask("Research volcanoes and publish them", 2));
const subPath = buildSubAgentPathUnchecked([{ className: run.subAgent.agent, name: run.subAgent.name }]).replace(/^\//, "");
const child = new AgentClient({ agent: "Assistant", name: room, host, WebSocket, path: subPath });
await child.ready;
const drill = useAgentChat(child, "drill-in");
drill.chat.messages = await (await fetch(`http://${host}/agents/assistant/${room}/${subPath}/get-messages`)).json();
const waiting = drill.chat.messages.at(-1).parts.find((p) => p.type === "tool-publish_findings");
assert.equal(waiting?.state, "approval-requested", "the drill-in chat shows the request");
await drill.addToolApprovalResponse({ id: waiting.approval.id, approved: false });
await tools.until(() => runs()[1].status === "completed", "the second run's completion");
run = runs()[1];
assert.equal(publishPart(run).state, "output-denied");
assert.match(run.summary, /I did not publish the findings\./);
await sending;
log("2 drill-in answer ok:", run.summary);

parent.close(); child.close();
log("PASS child-approvals");
process.exit(0);
