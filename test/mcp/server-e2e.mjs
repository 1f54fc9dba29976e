// server-e2e.mjs drives `agentry serve`'s /mcp endpoint with the official
// TypeScript SDK client (nothing of ours), for test/mcpserver:
//
//   node server-e2e.mjs URL live        lists the tools, calls research
//                                       with progress, cancels a second call
//   node server-e2e.mjs URL start-task  starts a research task; prints its id
//   node server-e2e.mjs URL result ID   fetches a task's result
//
// URL is the endpoint: http://host:port/mcp, or /mcp/{instance}.
//
// Each phase prints one JSON line with what it saw; the Go test asserts.
// "live" then waits for its stdin to close before it closes the client.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

const [endpoint, phase, arg] = process.argv.slice(2);
// connect opens a session; a 503 (a cluster whose instance is changing
// owners answers it with Retry-After) is asked again after the delay it
// gives, as a client should, for up to a minute.
async function connect() {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const client = new Client({ name: "agentry-e2e", version: "1.0.0" });
    try {
      await client.connect(new StreamableHTTPClientTransport(new URL(endpoint)));
      return client;
    } catch (e) {
      if (e?.code !== 503 || Date.now() > deadline) throw e;
      await new Promise((resolve) => setTimeout(resolve, 1000)); // Retry-After: 1
    }
  }
}
const client = await connect();
const out = {};

if (phase === "live") {
  const { tools } = await client.listTools();
  out.tools = tools.map((t) => t.name).sort();
  out.researchTaskSupport = tools.find((t) => t.name === "research")?.execution?.taskSupport ?? null;

  // research with a progress token: the SDK sets one when onprogress is given.
  const notes = [];
  const res = await client.callTool({ name: "research", arguments: { query: "solar panels" } }, CallToolResultSchema, {
    onprogress: (p) => notes.push(p),
    timeout: 120_000,
  });
  out.progressBeforeResult = notes.length;
  out.progressIncreasing = notes.every((n, i) => i === 0 || n.progress > notes[i - 1].progress);
  out.milestone = notes.some((n) => (n.message ?? "").includes("sources-gathered"));
  out.result = { isError: res.isError ?? false, text: res.content?.[0]?.text ?? "", structured: res.structuredContent };

  // A second call, cancelled at its first progress notification: the SDK
  // sends notifications/cancelled.
  const ac = new AbortController();
  let firstProgress;
  const progressed = new Promise((resolve) => (firstProgress = resolve));
  const second = client.callTool({ name: "research", arguments: { query: "quantum computing" } }, CallToolResultSchema, {
    signal: ac.signal,
    onprogress: () => firstProgress(),
    timeout: 120_000,
  });
  second.catch(() => {});
  await progressed;
  ac.abort("cancelled by the e2e test");
  try {
    await second;
    out.cancelled = false;
  } catch (e) {
    out.cancelled = true;
    out.cancelError = String(e?.message ?? e);
  }
} else if (phase === "start-task") {
  await client.listTools(); // the SDK learns research's taskSupport
  const stream = client.experimental.tasks.callToolStream(
    { name: "research", arguments: { query: "wind farms" } },
    CallToolResultSchema,
    { task: { ttl: 600_000 } },
  );
  for await (const m of stream) {
    if (m.type === "taskCreated") {
      out.taskId = m.task.taskId;
      out.status = m.task.status;
      break;
    }
    if (m.type === "error") throw m.error;
  }
} else if (phase === "result") {
  const task = await client.experimental.tasks.getTask(arg);
  out.statusBefore = task.status;
  const res = await client.experimental.tasks.getTaskResult(arg, CallToolResultSchema, { timeout: 120_000 });
  out.result = { isError: res.isError ?? false, text: res.content?.[0]?.text ?? "", structured: res.structuredContent };
  out.statusAfter = (await client.experimental.tasks.getTask(arg)).status;
  const { tasks } = await client.experimental.tasks.listTasks();
  out.listed = tasks.some((t) => t.taskId === arg);
} else {
  throw new Error(`unknown phase ${phase}`);
}
console.log(JSON.stringify(out));
if (phase === "live") {
  // The cancel notification goes out on its own request, which closing the
  // client would abort: the Go test closes stdin once it saw the run end.
  process.stdin.resume();
  await new Promise((resolve) => process.stdin.on("end", resolve));
}
await client.close();
