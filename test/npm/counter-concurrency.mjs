// Drives 20 real npm AgentClients (agents@0.32.0, ws as their WebSocket)
// against ONE Counter of the Go server at argv[2], named argv[3]: each
// sends 10 increment(1) calls, and all 200 are in flight together. The
// runtime runs one input at a time, so no increment is lost: the count ends
// at exactly 200 and the 200 results are the distinct integers 1..200.
// Run by test/e2e TestCounterOneInputAtATime.
import assert from "node:assert/strict";
import WebSocket from "ws";
import { AgentClient } from "agents/client";

const host = process.argv[2];
const name = process.argv[3] ?? "concurrency";
const log = (...a) => console.log(...a);
const CLIENTS = 20;
const CALLS = 10;

const clients = Array.from({ length: CLIENTS }, () => new AgentClient({ agent: "Counter", name, host, WebSocket }));
await Promise.all(clients.map((c) => c.ready));
assert.equal(await clients[0].call("get", []), 0, "a fresh counter starts at 0");
log(CLIENTS, "clients ready");

// Every call is issued before any is awaited.
const calls = [];
for (const c of clients) for (let i = 0; i < CALLS; i++) calls.push(c.call("increment", [1]));
const results = await Promise.all(calls);

const final = await clients[0].call("get", []);
const sorted = [...results].sort((a, b) => a - b);
const distinct = new Set(results).size;
log("final count", final, "distinct results", distinct, "of", results.length);
assert.equal(final, CLIENTS * CALLS, `final count ${final}, want ${CLIENTS * CALLS}: increments were lost`);
assert.deepEqual(sorted, Array.from({ length: CLIENTS * CALLS }, (_, i) => i + 1),
  `the results are not the distinct integers 1..${CLIENTS * CALLS} (${distinct} distinct)`);

for (const c of clients) c.close();
log("PASS counter-concurrency");
process.exit(0);
