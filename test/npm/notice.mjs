// A notice appended while a reply streams never shows above the reply.
// With the real chat client (the useAgentChat replica of
// use-agent-chat.mjs) on one tab and a second tab that only listens,
// against the Go server's NoticeChat at argv[2], room argv[3]: a turn
// streams the first half of its reply, the notice callable appends a
// notice (as an agent tool's milestone notice does), the finish callable
// lets the reply end. Every cf_agent_chat_messages either tab receives
// during the turn that lists the notice must list the streaming reply
// before it, and at the end both tabs and the stored transcript read user,
// reply, notice. Run by test/e2e TestNoticeDuringTurnAfterReply.
import assert from "node:assert/strict";
import { connect, frames, textOf, useAgentChat } from "./use-agent-chat.mjs";

const host = process.argv[2];
const room = process.argv[3] ?? "notice-e2e";
const log = (...a) => console.log(...a);
const NOTICE = "notice-1";
const REPLY = "Working on it: the research is done.";
const getMessages = async () => (await fetch(`http://${host}/agents/notice-chat/${room}/get-messages`)).json();
const isResponse = (d) => d.type === "cf_agent_use_chat_response";
const chunkOf = (d) => (isResponse(d) && d.body ? JSON.parse(d.body) : null);
const ids = (msgs) => msgs.map((m) => m.id);

const tab1 = await connect(host, "NoticeChat", room);
const f1 = frames(tab1);
const { chat } = useAgentChat(tab1, "notice");
const tab2 = await connect(host, "NoticeChat", room);
const f2 = frames(tab2);

// The reply starts streaming.
const turn = chat.sendMessage({ text: "research solar panels" });
await f1.until((l) => l.some((d) => chunkOf(d)?.type === "text-delta"), "the reply's first text delta");
const turnID = f1.list.find(isResponse).id;
const replyID = f1.list.map(chunkOf).find((c) => c?.type === "start").messageId;
const userID = chat.messages[0].id;
log("streaming", turnID, "reply", replyID);

// The notice arrives during the turn. Its broadcast, if any, reaches tab1
// before the call's result does.
assert.equal(await tab1.call("notice", []), 1, "the notice was added");
assert.ok(!f1.list.some((d) => isResponse(d) && d.done), "the reply is still streaming");
assert.equal(await tab1.call("finish", []), true);
await turn;
assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
const isDone = (d) => isResponse(d) && d.id === turnID && d.done;
await f2.until((l) => l.some(isDone), "the turn's terminal frame on tab2");
assert.equal(f1.list.find(isDone).outcome, "completed");

// The transcripts each tab was sent during the turn, up to its terminal
// frame.
const during = (f) => {
  const from = f.list.findIndex((d) => isResponse(d) && d.id === turnID);
  const to = f.list.findIndex(isDone);
  return f.list.slice(from, to).filter((d) => d.type === "cf_agent_chat_messages").map((d) => d.messages);
};
const lists = { tab1: during(f1), tab2: during(f2) };
for (const [tab, ls] of Object.entries(lists)) log(tab, "transcripts during the turn:", JSON.stringify(ls.map(ids)));
const lastList = (f) => f.list.filter((d) => d.type === "cf_agent_chat_messages").at(-1)?.messages ?? [];
const stored = await getMessages();
log("final: tab1", JSON.stringify(ids(chat.messages)), "tab2", JSON.stringify(ids(lastList(f2))), "stored", JSON.stringify(ids(stored)));

for (const [tab, ls] of Object.entries(lists)) {
  for (const msgs of ls) {
    const n = msgs.findIndex((m) => m.id === NOTICE);
    if (n < 0) continue;
    const r = msgs.findIndex((m) => m.id === replyID);
    assert.ok(r >= 0 && r < n, `${tab} was sent a transcript during the turn with the notice but not the streaming reply before it: ${JSON.stringify(ids(msgs))}`);
  }
}

// At the end: user, reply, notice everywhere, each once.
const want = [userID, replyID, NOTICE];
assert.deepEqual(ids(chat.messages), want, "tab1's messages");
assert.deepEqual(ids(lastList(f2)), want, "tab2's last transcript");
assert.deepEqual(ids(stored), want, "the stored transcript");
for (const msgs of [chat.messages, lastList(f2), stored]) {
  assert.deepEqual(msgs.map((m) => m.role), ["user", "assistant", "assistant"]);
  assert.equal(textOf(msgs[1]), REPLY, "the reply is whole");
  assert.match(textOf(msgs[2]), /reached milestone "sources-gathered"/);
}
log("order ok: user, reply, notice");

tab1.close(); tab2.close();
log("PASS notice");
process.exit(0);
