// Connect replay, dial -> last agent-tool-event frame, measured exactly as
// bench.mjs's replay phase does (npm AgentClient over ws, the same handler
// per frame), against several servers in interleaved rounds.
// Usage: node replay-floor.mjs <parent> <label>=<host:port> ... (ROUNDS, REPS from the environment)
import WS from "ws";
import { AgentClient } from "agents/client";

const [parent, ...targets] = process.argv.slice(2);
const ROUNDS = Number(process.env.ROUNDS ?? 3), REPS = Number(process.env.REPS ?? 10);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.ceil(s.length / 2) - 1]; };

async function replayOnce(host, expected) {
  let frames = 0, bytes = 0, tLast = 0;
  let done;
  const finished = new Promise((r) => (done = r));
  let quiet;
  const t0 = performance.now();
  const c = new AgentClient({ agent: "assistant", name: parent, host, WebSocket: WS });
  c.addEventListener("message", (e) => {
    if (typeof e.data !== "string") return;
    if (!e.data.startsWith('{"type":"agent-tool-event"')) return;
    const now = performance.now() - t0;
    const m = JSON.parse(e.data);
    frames++; bytes += Buffer.byteLength(e.data);
    if (m.replay !== true) throw new Error("a frame without replay:true");
    tLast = now;
    if (expected != null && frames === expected) done();
    clearTimeout(quiet); quiet = setTimeout(done, 3000);
  });
  quiet = setTimeout(done, 10000);
  await finished;
  clearTimeout(quiet);
  c.close();
  return { frames, bytes, lastFrameMs: tLast };
}

const all = Object.fromEntries(targets.map((t) => [t.split("=")[0], []]));
const expected = {};
for (const t of targets) { // warm-up: establishes the frame count by quiet period
  const [label, host] = t.split("=");
  const w = await replayOnce(host, null);
  expected[label] = w.frames;
  console.log(`${label} ${host}: ${w.frames} frames, ${w.bytes} bytes`);
  await sleep(300);
}
for (let r = 1; r <= ROUNDS; r++) {
  for (const t of targets) {
    const [label, host] = t.split("=");
    const xs = [];
    for (let i = 0; i < REPS; i++) {
      const s = await replayOnce(host, expected[label]);
      if (s.frames !== expected[label]) throw new Error(`${label}: ${s.frames} frames, expected ${expected[label]}`);
      xs.push(s.lastFrameMs);
      await sleep(300);
    }
    all[label].push(...xs);
    console.log(`round ${r} ${label}: median ${median(xs).toFixed(1)} ms (min ${Math.min(...xs).toFixed(1)}, max ${Math.max(...xs).toFixed(1)})`);
  }
}
for (const [label, xs] of Object.entries(all)) console.log(`all ${label}: median ${median(xs).toFixed(1)} ms over ${xs.length} replays`);
