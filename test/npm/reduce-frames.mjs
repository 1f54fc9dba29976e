// Reduces recorded WebSocket frames with the replica of useAgentToolEvents
// (tool-events.mjs: the npm package's own dedupe key and reducer behind a
// message listener) and prints, as one JSON object, each file's runs:
// {file: {runId: {status, text}}}, text being the run's text parts
// concatenated. Each argument is a file of JSON lines, one line per frame
// a client received, in order, each a JSON string of the frame's data.
// Used by test/soakcrash to cross-check its Go port of the reducer.
import { readFileSync } from "node:fs";
import { useAgentToolEvents } from "./tool-events.mjs";

const out = {};
for (const file of process.argv.slice(2)) {
  const socket = new EventTarget();
  const tools = useAgentToolEvents(socket);
  for (const line of readFileSync(file, "utf8").split("\n")) {
    if (line === "") continue;
    socket.dispatchEvent(new MessageEvent("message", { data: JSON.parse(line) }));
  }
  const runs = {};
  for (const [id, r] of Object.entries(tools.state.runsById)) {
    runs[id] = { status: r.status, text: r.parts.filter((p) => p.type === "text").map((p) => p.text).join("") };
  }
  out[file] = runs;
}
console.log(JSON.stringify(out));
