// Drives the real npm clients against a Go server that requires a token
// (server.RequireToken, what `agentry serve --auth-token` installs): the
// server at argv[2], the token argv[3], the EchoChat room argv[4]. Without
// the token AgentClient is closed with 4001 and gives up (onConnectionError,
// no reconnect) and get-messages is refused; with `query: {token}` it
// connects, calls, chats, and useAgentChat's history request (the socket's
// URL, _pk removed, plus /get-messages) carries the token by itself. Every
// check is an assertion. Run by test/e2e TestAuthToken.
import assert from "node:assert/strict";
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { textOf, useAgentChat } from "./use-agent-chat.mjs";

const host = process.argv[2];
const token = process.argv[3];
const room = process.argv[4] ?? "auth-e2e";
const log = (...a) => console.log(...a);
function within(p, what, ms = 10000) {
  let timer;
  const limit = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error("timed out waiting for " + what)), ms); });
  return Promise.race([p, limit]).finally(() => clearTimeout(timer));
}

// The URL useAgentChat's default getInitialMessages fetches.
function historyURL(agent) {
  const u = new URL((agent._url || agent._pkurl).replace("ws://", "http://").replace("wss://", "https://"));
  u.searchParams.delete("_pk");
  u.pathname += "/get-messages";
  return u.toString();
}

// 1. No token, then a wrong one: closed with 4001, and the client stops.
for (const query of [undefined, { token: "wrong" }]) {
  let refusal;
  const given = new Promise((resolve) => { refusal = resolve; });
  const c = new AgentClient({ agent: "EchoChat", name: room, host, WebSocket, query, onConnectionError: (e) => refusal(e) });
  const err = await within(given, "onConnectionError");
  assert.equal(err.code, 4001, "refusal code");
  assert.equal(c.connectionError?.code, 4001);
  await assert.rejects(c.call("anything"), /Connection closed/);
  c.close();
  const res = await fetch(historyURL(c));
  assert.equal(res.status, 401, "get-messages without the token");
  log("1 refused:", JSON.stringify(query ?? null), "->", err.code, "and get-messages", res.status);
}

// 2. With the token: connected, a chat turn streams, the history request
// carries the token.
const agent = new AgentClient({ agent: "EchoChat", name: room, host, WebSocket, query: { token } });
await within(agent.ready, "ready");
assert.equal(agent.name, room);
const { chat } = useAgentChat(agent, "auth");
await chat.sendMessage({ text: "let me in" });
assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
assert.equal(textOf(chat.messages.at(-1)), "You said: let me in");
log("2 chat with the token ok");

const url = historyURL(agent);
assert.ok(new URL(url).searchParams.get("token") === token, "the history URL carries the token: " + url);
const res = await fetch(url);
assert.equal(res.status, 200, "get-messages with the socket's query");
const history = await res.json();
assert.deepEqual(history.map((m) => m.role), ["user", "assistant"]);
const bearer = await fetch(`http://${host}/agents/echo-chat/${room}/get-messages`, { headers: { Authorization: `Bearer ${token}` } });
assert.equal(bearer.status, 200, "get-messages with a Bearer header (useAgentChat's headers option)");
log("3 get-messages with the token ok:", history.length, "messages");

agent.close();
log("PASS auth");
