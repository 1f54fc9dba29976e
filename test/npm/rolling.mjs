// Load for a rolling restart of an Agentry cluster, with the real npm
// clients: argv[2] is the cluster's front (host:port of a load balancer
// that sends each new connection to a live node), argv[3] a comma list of
// Fan instance names, argv[4] a comma list of EchoChat rooms. For each Fan
// an AgentClient calls fanOut(n, tag) over RPC in rounds (tags r<i>x<round>,
// 8 runs each), called again with the same run ids when its socket closes
// under it (the applications' retry; the client itself reconnects). For
// each room a chat (the AI SDK's AbstractChat, which useChat wraps, on
// agents' WebSocketChatTransport, the transport useAgentChat uses) sends
// "m<round>" and expects "You said: m<round>"; a turn cut by a close is
// read back from the transcript once the socket is open again (a page
// reload's view), and sent again only if the server never got it.
//
// It runs until a line "STOP" on standard input, finishes the rounds in
// flight, checks every room's transcript (each message once, answered
// once), and prints "REPORT <json>": failed requests after the retries,
// the rounds done, the close codes seen, and per instance the longest time
// it was unavailable to its client (from a socket's close to its next
// open, or from a first 503 to the answer; the socket's includes the
// client's reconnect back-off) and, measured apart by a plain HTTP probe
// every 50 ms, the longest time a request for it was refused or waited. Exit status 0 with "PASS
// rolling" when nothing failed. The Go test test/clustercrash
// TestRollingRestart runs it.
import WebSocket from "ws";
import { createInterface } from "node:readline";
import { AgentClient } from "agents/client";
import { WebSocketChatTransport } from "agents/chat/transport";
import { NodeChat, wireResume, textOf } from "./use-agent-chat.mjs";

const [front, fansArg, roomsArg] = process.argv.slice(2);
const fans = fansArg.split(",").filter(Boolean);
const rooms = roomsArg.split(",").filter(Boolean);
const N = 8;
const log = (...a) => console.log(new Date().toISOString(), ...a);

let stopping = false;
createInterface({ input: process.stdin }).on("line", (l) => { if (l.trim() === "STOP") stopping = true; });

const report = { failed: [], fanRounds: {}, fanRuns: {}, chatRounds: {}, cutCalls: 0, resent: 0, closes: {}, unavailableMs: {} };
const fail = (what) => { report.failed.push(what); log("FAIL", what); };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// watch records an instance's socket gaps (close → open) and close codes.
function watch(key, client) {
  let downSince = null;
  report.unavailableMs[key] = 0;
  client.addEventListener("close", (e) => {
    report.closes[e.code] = (report.closes[e.code] ?? 0) + 1;
    if (downSince === null) downSince = Date.now();
    log(key, "socket closed", e.code, e.reason);
  });
  client.addEventListener("open", () => {
    if (downSince !== null) {
      const gap = Date.now() - downSince;
      report.unavailableMs[key] = Math.max(report.unavailableMs[key], gap);
      log(key, "socket open again after", gap, "ms");
      downSince = null;
    }
  });
}

// within resolves true when p settles within ms, false otherwise.
const within = (p, ms) => new Promise((resolve) => {
  const timer = setTimeout(() => resolve(false), ms);
  p.then(() => { clearTimeout(timer); resolve(true); }, () => { clearTimeout(timer); resolve(true); });
});

const opened = (c) => c.readyState === WebSocket.OPEN ? Promise.resolve() :
  new Promise((r) => c.addEventListener("open", r, { once: true }));

// getJSON GETs a path through the front, asking again after a 503 with
// Retry-After or a refused connection, as a client does; the time from
// the first refusal to the answer counts as unavailability of key.
async function getJSON(key, path) {
  let first = null;
  for (let i = 0; ; i++) {
    let res;
    try {
      res = await fetch(`http://${front}${path}`, { signal: AbortSignal.timeout(10000) });
    } catch (e) {
      // Refused, or no answer within 10 s: asked again, as a client does
      // (the wait counts as unavailability).
      if (e?.name === "TimeoutError") log(key, "GET", path, "timed out; asking again");
      res = null;
    }
    if (res && res.ok) {
      if (first !== null) report.unavailableMs[key] = Math.max(report.unavailableMs[key], Date.now() - first);
      return res.json();
    }
    if (res && !(res.status === 503 && res.headers.get("retry-after"))) throw new Error(`GET ${path}: ${res.status} ${await res.text()}`);
    if (i > 300) throw new Error(`GET ${path}: still refused`);
    first ??= Date.now();
    await sleep(100);
  }
}

async function fanLoop(i, name) {
  const key = "fan/" + name;
  const c = new AgentClient({ agent: "fan", name, host: front, WebSocket });
  watch(key, c);
  await c.ready;
  report.fanRuns[name] = 0;
  for (let round = 0; !stopping; round++) {
    const tag = `r${i}x${round}`;
    for (let attempt = 1; ; attempt++) {
      try {
        await opened(c);
        const st = await c.call("fanOut", [N, tag], { timeout: 0 });
        if ((st.completed ?? 0) !== N) fail(`${key} ${tag}: ${JSON.stringify(st)}`);
        break;
      } catch (e) {
        const msg = String(e?.message ?? e);
        if (msg.includes("Connection closed") && attempt < 20) {
          report.cutCalls++;
          log(key, tag, `call ${attempt} cut (${msg}); calling again`);
          continue;
        }
        fail(`${key} ${tag}: ${msg}`);
        break;
      }
    }
    report.fanRounds[name] = round + 1;
    report.fanRuns[name] += N;
  }
  c.close();
}

async function chatLoop(room) {
  const key = "chat/" + room;
  const c = new AgentClient({ agent: "EchoChat", name: room, host: front, WebSocket });
  watch(key, c);
  await c.ready;
  const mkChat = (messages) => {
    const transport = new WebSocketChatTransport({ agent: c });
    wireResume(c, transport);
    return new NodeChat({ id: room, transport, messages });
  };
  let chat = mkChat([]);
  const answered = (msgs, text) => {
    const u = msgs.findIndex((m) => m.role === "user" && textOf(m) === text);
    return u >= 0 && msgs.slice(u + 1).some((m) => m.role === "assistant") ? msgs[u + 1] : null;
  };
  for (let round = 0; !stopping; round++) {
    const text = `m${round}`;
    await opened(c);
    if (!(await within(chat.sendMessage({ text }), 30000))) {
      // A turn that neither ends nor is cut by a close (the socket is
      // left on a node that no longer serves the chat) is a failed
      // request; said here rather than by the test's deadline.
      fail(`${key} ${text}: the turn neither ended nor was cut within 30 s (status ${chat.status}, socket ${c.readyState})`);
      await chat.stop();
    }
    let last = chat.messages.at(-1);
    if (chat.status === "ready" && last?.role === "assistant" && textOf(last) === "You said: " + text) {
      report.chatRounds[room] = round + 1;
      continue;
    }
    // Cut: read the transcript as a reloaded page would, once the socket
    // is open again; send again only if the server never got the message.
    log(key, text, "turn cut:", chat.status, chat.error?.message ?? "");
    let got = null;
    for (let tries = 0; !got; tries++) {
      await opened(c);
      const msgs = await getJSON(key, `/agents/echo-chat/${room}/get-messages`);
      got = answered(msgs, text);
      if (got) { chat = mkChat(msgs); break; }
      if (tries === 100 && !msgs.some((m) => m.role === "user" && textOf(m) === text)) {
        report.resent++;
        log(key, text, "never reached the server; sending again");
        chat = mkChat(msgs);
        await chat.sendMessage({ text });
        tries = 0;
      }
      if (tries > 400) { fail(`${key} ${text}: no answer in the transcript`); break; }
      await sleep(100);
    }
    if (got && textOf(got) !== "You said: " + text) fail(`${key} ${text}: answered ${JSON.stringify(textOf(got))}`);
    report.chatRounds[room] = round + 1;
  }
  // Every message once, answered once, in order.
  const msgs = await getJSON(key, `/agents/echo-chat/${room}/get-messages`);
  const rounds = report.chatRounds[room] ?? 0;
  const want = [];
  for (let r = 0; r < rounds; r++) want.push("user:m" + r, "assistant:You said: m" + r);
  const have = msgs.map((m) => m.role + ":" + textOf(m));
  if (JSON.stringify(have) !== JSON.stringify(want)) fail(`${key}: transcript ${JSON.stringify(have)}, want ${JSON.stringify(want)}`);
  c.close();
}

// probe asks for an instance over plain HTTP every 50 ms through the
// front and records the longest span from the start of a request that was
// refused (503, or no answer) to the end of the next answered one, or the
// longest answered request: the time the instance was refused or waited,
// without the WebSocket client's reconnect back-off.
async function probe(key, path) {
  report.probeMs[key] = 0;
  let failedAt = null;
  while (!stopping) {
    const t0 = Date.now();
    let ok = false;
    try {
      const res = await fetch(`http://${front}${path}`, { signal: AbortSignal.timeout(10000) });
      await res.arrayBuffer();
      ok = res.ok;
      if (!ok && res.status !== 503) fail(`probe ${key}: ${res.status}`);
    } catch {}
    if (ok) {
      report.probeMs[key] = Math.max(report.probeMs[key], Date.now() - (failedAt ?? t0));
      failedAt = null;
    } else failedAt ??= t0;
    await sleep(50);
  }
}

report.probeMs = {};
await Promise.all([
  ...fans.map((f, i) => fanLoop(i, f)), ...rooms.map((r) => chatLoop(r)),
  ...fans.map((f) => probe("fan/" + f, `/agents/fan/${f}/finishes`)),
  ...rooms.map((r) => probe("chat/" + r, `/agents/echo-chat/${r}/get-messages`)),
]);
console.log("REPORT " + JSON.stringify(report));
if (report.failed.length === 0) console.log("PASS rolling");
process.exit(report.failed.length === 0 ? 0 : 1);
