// Drives the real npm AgentClient (agents@0.32.0, ws as its WebSocket)
// against the Go server whose host:port is argv[2]. Every check is an
// assertion; the process exits non-zero on the first failure. The Go test
// test/e2e TestAgentClient runs it.
import assert from "node:assert/strict";
import WebSocket from "ws";
import { AgentClient } from "agents/client";
import { buildSubAgentPathUnchecked } from "./node_modules/agents/dist/sub-routing.js";

const host = process.argv[2];
const name = process.argv[3] ?? "e2e";
const log = (...a) => console.log(...a);

// waitFor resolves when pred() holds, re-checking on every state update.
function stateRecorder() {
  const updates = [];
  let waiters = [];
  return {
    updates,
    onStateUpdate(state, source) {
      updates.push({ state, source });
      waiters = waiters.filter((w) => !w());
    },
    waitFor(pred, what) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("timed out waiting for " + what)), 10000);
        const check = () => {
          if (pred(updates)) { clearTimeout(timer); resolve(); return true; }
          return false;
        };
        if (!check()) waiters.push(check);
      });
    },
  };
}

const rec1 = stateRecorder();
const c1 = new AgentClient({ agent: "Counter", name, host, WebSocket, onStateUpdate: rec1.onStateUpdate });
await c1.ready;
log("c1 ready, identity", c1.agent, c1.name);
assert.equal(c1.agent, "counter");
assert.equal(c1.name, name);

// State set by the server reaches the client.
assert.equal(await c1.call("increment", [1]), 1);
await rec1.waitFor((u) => u.some((x) => x.source === "server" && x.state.count === 1), "server state {count:1}");
log("server state reached c1");

// State set by one client reaches a second one, and is persisted.
const rec2 = stateRecorder();
const c2 = new AgentClient({ agent: "Counter", name, host, WebSocket, onStateUpdate: rec2.onStateUpdate });
await c2.ready;
await rec2.waitFor((u) => u.some((x) => x.state.count === 1), "c2 initial state");
c2.setState({ count: 42 });
await rec1.waitFor((u) => u.some((x) => x.source === "server" && x.state.count === 42), "c1 sees c2's state");
assert.ok(!rec2.updates.some((x) => x.source === "server" && x.state.count === 42), "the sender is not echoed its own state");
log("client state reached the other client");

// increment returns values.
assert.equal(await c1.call("increment", [1]), 43);
assert.equal(await c2.call("increment", [2]), 45);
assert.equal(await c1.call("get", []), 45);

// countTo streams every chunk then completes.
const chunks = [];
const final = await new Promise((resolve, reject) => {
  c1.call("countTo", [5], {
    stream: { onChunk: (c) => chunks.push(c), onDone: resolve, onError: (e) => reject(new Error(e)) },
  }).catch(reject);
});
assert.deepEqual(chunks, [1, 2, 3, 4, 5]);
assert.equal(final, 5);
log("countTo streamed", chunks.join(","));

// Unknown and non-callable methods get error responses, not a hang.
await assert.rejects(c1.call("nope", [], { timeout: 5000 }), /Method nope does not exist/);
await assert.rejects(c1.call("scheduledIncrement", [1], { timeout: 5000 }), /Method scheduledIncrement is not callable/);
// Bad arguments are an error response too.
await assert.rejects(c1.call("increment", ["x"], { timeout: 5000 }), /invalid argument 0/);
log("error responses ok");

// A sub-agent through the parent's route, as useAgent's `sub` option builds it.
const okPath = buildSubAgentPathUnchecked([{ className: "Counter", name: "ok-1" }]);
const sub = new AgentClient({ agent: "Counter", name, host, WebSocket, path: okPath.replace(/^\//, "") });
await sub.ready;
assert.equal(sub.name, "ok-1");
assert.equal(await sub.call("increment", [7]), 7, "the child has its own state");
assert.equal(await c1.call("get", []), 45, "the parent's state is untouched");
log("sub-agent ok-1 reachable");

// A refused sub-agent never becomes ready: the upgrade is answered 404.
const badPath = buildSubAgentPathUnchecked([{ className: "Counter", name: "bad-1" }]);
const bad = new AgentClient({ agent: "Counter", name, host, WebSocket, path: badPath.replace(/^\//, ""), maxRetries: 0 });
let badReady = false;
bad.ready.then(() => { badReady = true; });
await new Promise((resolve) => bad.addEventListener("error", resolve, { once: true }));
assert.equal(badReady, false);
bad.close();
log("sub-agent bad-1 refused");

c1.close(); c2.close(); sub.close();
log("PASS agent-client");
process.exit(0);
