// Drives the real chat clients (agents/chat/transport WebSocketChatTransport,
// the transport useAgentChat uses, and the AI SDK's AbstractChat, which
// useChat wraps) against the Go server's EchoChat at argv[2]. Every check
// is an assertion; exit code 0 means all passed. Run by test/e2e TestChat.
import assert from "node:assert/strict";
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { WebSocketChatTransport } from "agents/chat/transport";
import { NodeChat, frames, textOf, wireResume } from "./use-agent-chat.mjs";

const host = process.argv[2];
const room = process.argv[3] ?? "chat-e2e";
const log = (...a) => console.log(...a);

const mk = () => new AgentClient({ agent: "EchoChat", name: room, host, WebSocket });
const getMessages = async () => (await fetch(`http://${host}/agents/echo-chat/${room}/get-messages`)).json();

// 1. A message streams text back.
const tab1 = mk();
await tab1.ready;
const f1 = frames(tab1);
const transport = new WebSocketChatTransport({ agent: tab1 });
wireResume(tab1, transport);
const chat = new NodeChat({ id: "c1", transport });
await chat.sendMessage({ text: "hello there" });
assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
let last = chat.messages.at(-1);
assert.equal(last.role, "assistant");
assert.equal(textOf(last), "You said: hello there");
const done1 = f1.list.find((d) => d.type === "cf_agent_use_chat_response" && d.done);
assert.equal(done1.outcome, "completed");
const deltas = f1.list.filter((d) => d.type === "cf_agent_use_chat_response" && d.body && JSON.parse(d.body).type === "text-delta");
assert.ok(deltas.length >= 3 && deltas.every((d) => JSON.parse(d.body).delta.length <= 8), "streamed in chunks of at most 8 characters");
log("1 text turn ok:", textOf(last));

// 2. A turn with a server tool shows the tool input and output parts.
await chat.sendMessage({ text: "please use the clock tool in Europe/Paris" });
assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
last = chat.messages.at(-1);
const tool = last.parts.find((p) => p.type === "tool-clock");
assert.ok(tool, "a tool-clock part: " + JSON.stringify(last.parts));
assert.equal(tool.state, "output-available");
assert.deepEqual(tool.input, { zone: "Europe/Paris" });
assert.equal(tool.output.zone, "Europe/Paris");
assert.match(textOf(last), /^The time in Europe\/Paris is \d\d:\d\d:\d\d/);
log("2 tool turn ok:", textOf(last));

// 3. A reload mid-stream resumes with no chunk lost or repeated.
const long = "a long message to stream slowly over many small chunks ".repeat(3).trim();
const slow = chat.sendMessage({ text: long });
const mark = f1.list.length;
await f1.until((l) => l.slice(mark).filter((d) => d.type === "cf_agent_use_chat_response" && d.body).length >= 8, "8 chunks of the slow turn");
const tab2 = mk();
const f2 = frames(tab2);
const transport2 = new WebSocketChatTransport({ agent: tab2 });
wireResume(tab2, transport2);
const history = await getMessages();
assert.equal(history.at(-1).role, "user", "the partial answer is not in the transcript yet");
const chat2 = new NodeChat({ id: "c2", transport: transport2, messages: history });
await chat2.resumeStream();
await slow;
assert.equal(chat2.status, "ready", "resumed chat error: " + chat2.error?.message);
const resumed = chat2.messages.at(-1);
assert.equal(resumed.role, "assistant");
assert.equal(textOf(resumed), "You said: " + long);
const slowID = f2.list.find((d) => d.type === "cf_agent_stream_resuming").id;
const seqs = f2.list.filter((d) => d.type === "cf_agent_use_chat_response" && d.id === slowID && d.body && !d.error).map((d) => d.seq);
assert.ok(f2.list.some((d) => d.replay && d.id === slowID && d.body), "some chunks came as replay");
assert.deepEqual(seqs, [...seqs.keys()], "every seq from 0, once, in order");
assert.equal(textOf(chat.messages.at(-1)), "You said: " + long, "the original tab finished too");
log("3 resume ok:", seqs.length, "chunks, replayed", f2.list.filter((d) => d.replay && d.body).length);

// 4. Cancel ends with outcome aborted and keeps the partial text.
const before = f1.list.length;
const p4 = chat.sendMessage({ text: long });
await f1.until((l) => l.slice(before).filter((d) => d.type === "cf_agent_use_chat_response" && d.body && JSON.parse(d.body).type === "text-delta").length >= 3, "3 text deltas");
// What useAgentChat's stop() does: cancel the server turn, then stop locally.
assert.equal(transport.cancelActiveServerTurn(), true);
chat.stop();
await p4.catch(() => {});
await f1.until((l) => l.slice(before).some((d) => d.type === "cf_agent_use_chat_response" && d.done), "the terminal frame");
const done4 = f1.list.slice(before).find((d) => d.type === "cf_agent_use_chat_response" && d.done);
assert.equal(done4.outcome, "aborted");
const afterCancel = await getMessages();
const partial = textOf(afterCancel.at(-1));
assert.equal(afterCancel.at(-1).role, "assistant");
assert.ok(partial.length > 0 && ("You said: " + long).startsWith(partial) && partial.length < ("You said: " + long).length, "partial kept: " + partial);
log("4 cancel ok, partial:", JSON.stringify(partial));

// 5. get-messages returns the transcript.
const transcript = await getMessages();
assert.deepEqual(transcript.map((m) => m.role), ["user", "assistant", "user", "assistant", "user", "assistant", "user", "assistant"]);
assert.equal(textOf(transcript[1]), "You said: hello there");
log("5 get-messages ok:", transcript.length, "messages");

// 6. Clear empties the history, here and in the other tab.
tab1.send(JSON.stringify({ type: "cf_agent_chat_clear" }));
await f2.until((l) => l.some((d) => d.type === "cf_agent_chat_clear"), "clear broadcast to the other tab");
assert.deepEqual(await getMessages(), []);
log("6 clear ok");

// 7. A malformed chat request gets a clear error frame.
tab1.send(JSON.stringify({ type: "cf_agent_use_chat_request", id: "bad1", init: { method: "POST", body: "{not json" } }));
await f1.until((l) => l.some((d) => d.id === "bad1" && d.done), "error answer to the malformed request");
const bad = f1.list.find((d) => d.id === "bad1" && d.done);
assert.equal(bad.error, true);
assert.match(bad.body, /not JSON/);
log("7 malformed request ok:", bad.body);

tab1.close(); tab2.close();
log("PASS chat");
process.exit(0);
