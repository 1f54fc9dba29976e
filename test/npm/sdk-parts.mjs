// Drives the real chat clients (WebSocketChatTransport and the AI SDK's
// AbstractChat, as useAgentChat does) against the Go server of test/e2e
// TestSDKParts at argv[2]:
//   1. regenerate: the last answer is replaced by a new one, on the client
//      and on the server, and the request says trigger regenerate-message;
//   2. file parts (an image, a PDF) from sendMessage({files}) reach the model
//      (the Go test checks the OpenAI and Anthropic request bodies);
//   3. a tool's data parts, transient data and preliminary output, and the
//      assistant message's metadata (createdAt, model, usage).
// Every check is an assertion; exit code 0 means all passed.
import assert from "node:assert/strict";
import { NodeChat, connect, frames, textOf, wireResume } from "./use-agent-chat.mjs";
import { WebSocketChatTransport } from "agents/chat/transport";

const host = process.argv[2];
const log = (...a) => console.log(...a);
const getMessages = async (cls, room) => (await fetch(`http://${host}/agents/${cls}/${room}/get-messages`)).json();

async function open(cls, room, init = {}) {
  const agent = await connect(host, cls, room);
  const f = frames(agent);
  const transport = new WebSocketChatTransport({ agent });
  wireResume(agent, transport);
  const chat = new NodeChat({ id: cls + room, transport, ...init });
  return { agent, f, chat };
}

// 1. regenerate.
{
  const { agent, f, chat } = await open("CountChat", "regen");
  await chat.sendMessage({ text: "hello" });
  assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
  assert.equal(textOf(chat.messages.at(-1)), "answer 1 to hello");
  const firstID = chat.messages.at(-1).id;
  const sent = [];
  const origSend = agent.send.bind(agent);
  agent.send = (data) => { sent.push(data); return origSend(data); };
  await chat.regenerate();
  assert.equal(chat.status, "ready", "regenerate error: " + chat.error?.message);
  assert.deepEqual(chat.messages.map((m) => m.role), ["user", "assistant"]);
  const again = chat.messages.at(-1);
  assert.equal(textOf(again), "answer 2 to hello", "the answer was generated again");
  assert.notEqual(again.id, firstID, "the regenerated answer is a new message");
  const req = sent.map((s) => JSON.parse(s)).find((d) => d.type === "cf_agent_use_chat_request");
  assert.equal(JSON.parse(req.init.body).trigger, "regenerate-message");
  const start = f.list.filter((d) => d.type === "cf_agent_use_chat_response" && d.id === req.id && d.body)
    .map((d) => JSON.parse(d.body)).find((c) => c.type === "start");
  assert.equal(start.messageId, again.id, "the client adopted the server's id");
  const stored = await getMessages("count-chat", "regen");
  assert.deepEqual(stored.map((m) => m.role), ["user", "assistant"], "the server replaced the old answer");
  assert.equal(stored[1].id, again.id);
  assert.equal(textOf(stored[1]), "answer 2 to hello");
  agent.close();
  log("1 regenerate ok:", textOf(again));
}

// 2. A file part reaches the model.
{
  const { agent, chat } = await open("FileChat", "files");
  const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";
  await chat.sendMessage({ text: "what is in the picture?", files: [{ type: "file", mediaType: "image/png", filename: "dot.png", url: "data:image/png;base64," + png }] });
  assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
  assert.equal(textOf(chat.messages.at(-1)), "A single dot.");
  const md = chat.messages.at(-1).metadata;
  assert.equal(md.model, "gpt-test");
  assert.deepEqual(md.usage, { inputTokens: 11, outputTokens: 3, totalTokens: 14 }, "the provider's usage");
  const stored = await getMessages("file-chat", "files");
  assert.equal(stored[0].parts.find((p) => p.type === "file").url, "data:image/png;base64," + png, "the file part is stored");
  agent.close();
  const claude = await open("ClaudeChat", "files");
  const pdf = "JVBERi0xLjQKJSVFT0YK";
  await claude.chat.sendMessage({ text: "summarize", files: [{ type: "file", mediaType: "application/pdf", filename: "doc.pdf", url: "data:application/pdf;base64," + pdf }] });
  assert.equal(claude.chat.status, "ready", "chat error: " + claude.chat.error?.message);
  assert.equal(textOf(claude.chat.messages.at(-1)), "A PDF.");
  assert.deepEqual(claude.chat.messages.at(-1).metadata.usage, { inputTokens: 25, outputTokens: 4, totalTokens: 29 });
  claude.agent.close();
  log("2 file parts ok");
}

// 3. Data parts, transient data, preliminary output and metadata.
{
  const data = [];
  const { agent, f, chat } = await open("PartsChat", "parts", { onData: (part) => data.push(part) });
  await chat.sendMessage({ text: "please report" });
  assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
  const last = chat.messages.at(-1);
  assert.deepEqual(data.map((d) => d.type + (d.transient ? "!" : "")), ["data-status", "data-ping!", "data-status"], "onData saw every data chunk");
  const dataParts = last.parts.filter((p) => p.type.startsWith("data-"));
  assert.deepEqual(dataParts, [{ type: "data-status", id: "s1", data: { n: 2 } }], "one persisted part, replaced; no transient part");
  const tool = last.parts.find((p) => p.type === "tool-report");
  assert.equal(tool.state, "output-available");
  assert.deepEqual(tool.output, { done: true });
  assert.ok(!tool.preliminary, "the final output replaced the preliminary one");
  const outputs = f.list.filter((d) => d.type === "cf_agent_use_chat_response" && d.body && !d.error)
    .map((d) => JSON.parse(d.body)).filter((c) => c.type === "tool-output-available");
  assert.deepEqual(outputs.map((c) => c.preliminary ?? false), [true, false]);
  assert.equal(typeof last.metadata.createdAt, "number");
  assert.equal(last.metadata.model, "scripted");
  assert.ok(last.metadata.usage.totalTokens > 0 && last.metadata.usage.totalTokens === last.metadata.usage.inputTokens + last.metadata.usage.outputTokens);
  assert.deepEqual(last.metadata.treeUsage, last.metadata.usage);
  assert.equal(last.metadata.finishReason, "stop");
  const stored = await getMessages("parts-chat", "parts");
  assert.deepEqual(stored.at(-1).metadata, last.metadata, "the client's metadata is the server's");
  assert.deepEqual(stored.at(-1).parts.filter((p) => p.type.startsWith("data-")), dataParts);
  agent.close();
  log("3 data parts and metadata ok:", JSON.stringify(last.metadata));
}

log("PASS sdk-parts");
process.exit(0);
