// Drives the real npm AgentClient (agents, ws as its WebSocket) against one
// node of an Agentry cluster, argv[2] (host:port), which need not own the
// agent: it calls the Fan agent argv[3]'s fanOut(n = argv[4], tag = argv[5])
// over RPC, and calls it again (the same run ids) whenever the call is cut
// by its socket's close (its owner node was killed: the node it is
// connected to closes the socket with 1012 and the client reconnects),
// until a call answers. It prints "PASS fanout <statuses>" when every run
// completed, and exits non-zero otherwise. The Go test test/clustercrash
// TestNPMFanOutThroughKill runs it.
import WebSocket from "ws";
import { AgentClient } from "agents/client";

const [host, name, nArg, tag] = process.argv.slice(2);
const n = Number(nArg);
const log = (...a) => console.log(new Date().toISOString(), ...a);

const c = new AgentClient({ agent: "fan", name, host, WebSocket });
let closes = 0;
c.addEventListener("close", (e) => { closes++; log("socket closed", e.code, e.reason); });
c.addEventListener("open", () => log("socket open"));
await c.ready;

for (let attempt = 1; ; attempt++) {
  let statuses;
  try {
    // No client-side timeout: a fan-out of 1,000 on a loaded machine may
    // take minutes; the Go test bounds the whole script.
    statuses = await c.call("fanOut", [n, tag], { timeout: 0 });
  } catch (e) {
    if (String(e?.message ?? e).includes("Connection closed")) {
      log(`call ${attempt} cut (${e.message}); calling again once the socket is open`);
      // The client refuses calls while its socket is closed after an
      // error (a node answering 503 while the shard moves): wait for the
      // reconnect rather than spin.
      if (c.readyState !== WebSocket.OPEN) await new Promise((r) => c.addEventListener("open", r, { once: true }));
      continue;
    }
    log(`call ${attempt} failed: ${e?.message ?? e}`);
    process.exit(1);
  }
  log(`call ${attempt} answered after ${closes} socket closes:`, JSON.stringify(statuses));
  if ((statuses.completed ?? 0) !== n) {
    log(`FAIL: want ${n} completed`);
    process.exit(1);
  }
  console.log("PASS fanout " + JSON.stringify({ attempts: attempt, closes, statuses }));
  c.close();
  process.exit(0);
}
