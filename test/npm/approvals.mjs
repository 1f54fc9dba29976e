// Drives the real chat clients (agents/chat/transport and the AI SDK's
// AbstractChat, with useAgentChat's tool answers) against the demo's
// Assistant at argv[2]: tool approval (approve and deny) and a client-side
// tool answered with addToolOutput. With argv[4] set, only one step of a
// restart test runs:
//   ask-approval / answer-approval   an approval asked before a restart and
//                                    answered after it;
//   ask-time / answer-time           the same for get_local_time's output.
// Every check is an assertion; exit code 0 means all passed. Run by
// test/e2e TestApprovals and test/approvalcrash.
import assert from "node:assert/strict";
import { connect, useAgentChat, textOf } from "./use-agent-chat.mjs";

const host = process.argv[2];
const room = process.argv[3] ?? "approvals";
const phase = process.argv[4] ?? "all";
const log = (...a) => console.log(...a);

const stored = async () => (await fetch(`http://${host}/agents/assistant/${room}/get-messages`)).json();
const toolPart = (m, name) => m.parts.find((p) => p.type === "tool-" + name);
const lastAssistant = (chat) => chat.messages.filter((m) => m.role === "assistant").at(-1);

async function tab() {
  const agent = await connect(host, "Assistant", room);
  const history = await (await fetch(`http://${host}/agents/assistant/${room}/get-messages`)).json();
  const t = useAgentChat(agent, "approvals-" + Math.random());
  t.chat.messages = history;
  return { agent, ...t };
}

// askDelete sends the delete request and returns the approval-requested part.
async function askDelete(t) {
  await t.chat.sendMessage({ text: "please delete my helper runs" });
  assert.equal(t.chat.status, "ready", "chat error: " + t.chat.error?.message);
  const part = toolPart(lastAssistant(t.chat), "delete_helper_runs");
  assert.ok(part, "a delete_helper_runs part: " + JSON.stringify(lastAssistant(t.chat).parts));
  assert.equal(part.state, "approval-requested");
  assert.ok(part.approval?.id, "the part carries its approval id");
  return part;
}

async function approve(t, part, approved) {
  const msgID = lastAssistant(t.chat).id;
  await t.addToolApprovalResponse({ id: part.approval.id, approved });
  const want = approved ? "output-available" : "output-denied";
  // The continuation continues the message: the transcript the server
  // sends at its end holds one message with the call and the answer (the
  // tab that resumed the continuation may show its stream as a message of
  // its own until then).
  await t.chat.whenMessages((ms) => {
    const m = ms.find((x) => x.id === msgID);
    return m && toolPart(m, "delete_helper_runs")?.state === want && m.parts.at(-1).type === "text" && m.parts.at(-1).state === "done";
  }, "the continuation's answer after " + (approved ? "approval" : "denial"));
  await t.chat.whenMessages(() => t.chat.status === "ready", "the continuation's end");
  const m = t.chat.messages.find((x) => x.id === msgID);
  const server = (await stored()).find((x) => x.id === msgID);
  assert.deepEqual(server.parts.filter((p) => p.type === "tool-delete_helper_runs").length, 1, "one tool part on the server");
  assert.equal(textOf(server), textOf(m));
  return m;
}

async function askTime(t) {
  await t.chat.sendMessage({ text: "what time is it?" });
  assert.equal(t.chat.status, "ready", "chat error: " + t.chat.error?.message);
  const part = toolPart(lastAssistant(t.chat), "get_local_time");
  assert.ok(part, "a get_local_time part: " + JSON.stringify(lastAssistant(t.chat).parts));
  assert.equal(part.state, "input-available", "the client tool waits for the client");
  return part;
}

// answerTime is what a page's onToolCall does: addToolOutput with the time.
async function answerTime(t, part) {
  const msgID = lastAssistant(t.chat).id;
  await t.addToolOutput({ toolCallId: part.toolCallId, tool: "get_local_time", output: { time: "10:42", timeZone: "Europe/Paris" } });
  await t.chat.whenMessages((ms) => {
    const m = ms.find((x) => x.id === msgID);
    return m && /It is 10:42 where you are \(Europe\/Paris\)\./.test(textOf(m)) && m.parts.at(-1).state === "done";
  }, "the answer from the client tool's output");
  await t.chat.whenMessages(() => t.chat.status === "ready", "the continuation's end");
  const m = t.chat.messages.find((x) => x.id === msgID);
  assert.equal(toolPart(m, "get_local_time").state, "output-available");
  assert.deepEqual(toolPart(m, "get_local_time").output, { time: "10:42", timeZone: "Europe/Paris" });
}

const t = await tab();

switch (phase) {
  case "all": {
    // A helper run to delete.
    await t.chat.sendMessage({ text: "Research tides" });
    assert.equal(t.chat.status, "ready", "chat error: " + t.chat.error?.message);
    let runs = await t.agent.call("listHelperRuns", []);
    assert.equal(runs.length, 1, "one helper run");

    // 1. Deny: the tool does not run; the model reads the denial.
    let part = await askDelete(t);
    let m = await approve(t, part, false);
    assert.equal(toolPart(m, "delete_helper_runs").approval.approved, false);
    assert.match(textOf(m), /OK, I left your helper runs alone\./);
    runs = await t.agent.call("listHelperRuns", []);
    assert.equal(runs.length, 1, "a denied delete deleted nothing");
    log("1 deny ok:", textOf(m));

    // 2. Approve: the tool runs once; the model reports its result.
    part = await askDelete(t);
    m = await approve(t, part, true);
    assert.deepEqual(toolPart(m, "delete_helper_runs").output, { deleted: 1 });
    assert.match(textOf(m), /I deleted 1 helper runs\./);
    runs = await t.agent.call("listHelperRuns", []);
    assert.equal(runs.length, 0, "the approved delete ran");
    log("2 approve ok:", textOf(m));

    // 3. A client tool answered with addToolOutput.
    part = await askTime(t);
    await answerTime(t, part);
    log("3 client tool ok:", textOf(lastAssistant(t.chat)));

    // The server's transcript: each answer continued its message.
    const server = await stored();
    const parts = server.flatMap((x) => x.parts).filter((p) => p.type?.startsWith("tool-")).map((p) => p.type + ":" + p.state);
    assert.deepEqual(parts, ["tool-research:output-available", "tool-delete_helper_runs:output-denied",
      "tool-delete_helper_runs:output-available", "tool-get_local_time:output-available"]);
    break;
  }
  case "sdk-auto": {
    // The AI SDK's own flow, without useAgentChat's frames: the chat sends
    // the answered transcript again (sendAutomaticallyWhen), and the server
    // continues the message from it.
    const { lastAssistantMessageIsCompleteWithApprovalResponses, lastAssistantMessageIsCompleteWithToolCalls } = await import("ai");
    const auto = useAgentChat(t.agent, "sdk-auto", {
      sendAutomaticallyWhen: (o) => lastAssistantMessageIsCompleteWithApprovalResponses(o) || lastAssistantMessageIsCompleteWithToolCalls(o),
    });
    auto.chat.messages = await stored();
    await auto.chat.sendMessage({ text: "please delete my helper runs" });
    const part = toolPart(lastAssistant(auto.chat), "delete_helper_runs");
    assert.equal(part?.state, "approval-requested");
    const msgID = lastAssistant(auto.chat).id;
    await auto.chat.addToolApprovalResponse({ id: part.approval.id, approved: true });
    await auto.chat.whenMessages((ms) => /I deleted 0 helper runs\./.test(textOf(ms.find((m) => m.id === msgID) ?? { parts: [] })), "the automatic continuation");
    await auto.chat.whenMessages(() => auto.chat.status === "ready", "its end");
    const server = (await stored()).find((m) => m.id === msgID);
    assert.equal(toolPart(server, "delete_helper_runs").state, "output-available");
    assert.match(textOf(server), /I deleted 0 helper runs\./);
    break;
  }
  case "ask-approval":
    await askDelete(t);
    break;
  case "answer-approval": {
    const part = toolPart(lastAssistant(t.chat), "delete_helper_runs");
    assert.equal(part?.state, "approval-requested", "still waiting after the restart");
    const m = await approve(t, part, true);
    assert.match(textOf(m), /I deleted 0 helper runs\./);
    break;
  }
  case "ask-time":
    await askTime(t);
    break;
  case "answer-time": {
    const part = toolPart(lastAssistant(t.chat), "get_local_time");
    assert.equal(part?.state, "input-available", "still waiting after the restart");
    await answerTime(t, part);
    break;
  }
  default:
    throw new Error("unknown phase " + phase);
}
t.agent.close();
log("PASS approvals " + phase);
process.exit(0);
