// The part of useAgentToolEvents({agent}) (agents/react) the tests need,
// built on the npm package's own reducer: a message listener that ignores
// non-string data, bad JSON and other frame types, dedupes by
// agentToolEventDedupeKey in a seen set kept for the hook's lifetime, and
// reduces the rest with applyAgentToolEvent. until(pred) waits for a state.
import {
  i as createAgentToolEventState,
  n as agentToolEventDedupeKey,
  r as applyAgentToolEvent,
} from "./node_modules/agents/dist/agent-tools-CdJC-8Dc.js";

export { agentToolEventDedupeKey };

export function useAgentToolEvents(agent) {
  let state = createAgentToolEventState();
  const seen = new Set();
  const frames = [];
  let waiters = [];
  agent.addEventListener("message", (e) => {
    if (typeof e.data !== "string") return;
    let msg;
    try { msg = JSON.parse(e.data); } catch { return; }
    if (msg?.type !== "agent-tool-event") return;
    frames.push(msg);
    const key = agentToolEventDedupeKey(msg);
    if (seen.has(key)) return;
    seen.add(key);
    state = applyAgentToolEvent(state, msg);
    waiters = waiters.filter((w) => !w());
  });
  return {
    get state() { return state; },
    frames,
    getRunsForToolCall: (id) => state.runsByToolCallId[id] ?? [],
    until(pred, what) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("timed out waiting for " + what + "; state " + JSON.stringify(state))), 15000);
        const check = () => { if (pred(state)) { clearTimeout(timer); resolve(); return true; } return false; };
        if (!check()) waiters.push(check);
      });
    },
  };
}
