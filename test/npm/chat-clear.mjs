// Clears the chat while a turn streams, with the real chat client (the
// useAgentChat replica of use-agent-chat.mjs) against the Go server's
// EchoChat at argv[2], room argv[3]: the cleared turn still gets its
// terminal frame, so the client's status returns to "ready", and the next
// message gets a full answer in an empty transcript. Every check is an
// assertion; exit code 0 means all passed. Run by test/e2e
// TestChatClearDuringTurn.
import assert from "node:assert/strict";
import { connect, frames, textOf, useAgentChat } from "./use-agent-chat.mjs";

const host = process.argv[2];
const room = process.argv[3] ?? "clear-e2e";
const log = (...a) => console.log(...a);
const getMessages = async () => (await fetch(`http://${host}/agents/echo-chat/${room}/get-messages`)).json();
const isResponse = (d) => d.type === "cf_agent_use_chat_response";
const isDelta = (d) => isResponse(d) && d.body && JSON.parse(d.body).type === "text-delta";

const tab = await connect(host, "EchoChat", room);
const f = frames(tab);
// A second tab only watches: the server tells it of the clear
// (cf_agent_chat_clear) at the moment it handles it, so its socket shows
// what the server sent after the clear.
const watcher = await connect(host, "EchoChat", room);
const w = frames(watcher);
const { chat, clearHistory } = useAgentChat(tab, "clear");

// A slow turn: a long answer, streamed in chunks of 8 characters.
const long = "a long message that streams slowly over very many small chunks ".repeat(6).trim();
const slow = chat.sendMessage({ text: long });
await f.until((l) => l.filter(isDelta).length >= 3, "3 text deltas of the slow turn");
const turnID = f.list.find(isResponse).id;
assert.ok(!f.list.some((d) => isResponse(d) && d.done), "the turn is still streaming");
log("streaming", turnID);

// Clear while it streams, once the chat shows what has arrived (a person
// clicks Clear on what they see).
const received = () => f.list.filter((d) => isDelta(d) && d.id === turnID).map((d) => JSON.parse(d.body).delta).join("");
await chat.whenMessages((ms) => ms.length > 0 && ms.at(-1).role === "assistant" && textOf(ms.at(-1)) === received(),
  "the chat to show the chunks received");
const shown = received();
const mark = f.list.length;
clearHistory();

// The server ends the cleared turn with its terminal frame; the transport
// closes the stream on it, and only then does the status return to ready.
let timer;
const ended = await Promise.race([
  slow.then(() => "ended"),
  new Promise((resolve) => { timer = setTimeout(() => resolve("deadline"), 10000); }),
]);
clearTimeout(timer);
const terminal = f.list.filter((d) => isResponse(d) && d.id === turnID && d.done);
assert.equal(ended, "ended", `the cleared turn's stream never ended: status ${chat.status}, ` +
  `terminal frames for ${turnID}: ${JSON.stringify(terminal)}, last frame: ${JSON.stringify(f.list.at(-1))}`);
assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
assert.equal(terminal.length, 1, "one terminal frame for the cleared turn: " + JSON.stringify(terminal));
assert.equal(terminal[0].outcome, "aborted", "the cleared turn ends aborted");
const deltas = f.list.filter((d) => isDelta(d) && d.id === turnID).map((d) => JSON.parse(d.body).delta).join("");
assert.ok(deltas.length < ("You said: " + long).length, "the cleared turn stopped streaming: " + deltas.length + " characters");
assert.deepEqual(await getMessages(), [], "nothing of the cleared turn is stored");
// Once the server has handled the clear it sends nothing of the cleared
// turn but its terminal frame. (Chunks it sent before, still on the wire
// when the tab cleared, reach the tab after its local clear: the AI SDK
// client then shows them, as it would against any server.)
await w.until((l) => l.some((d) => d.type === "cf_agent_chat_clear"), "the watcher to see the clear");
const cleared = w.list.findIndex((d) => d.type === "cf_agent_chat_clear");
const after = w.list.slice(cleared).filter((d) => isResponse(d) && d.id === turnID);
assert.ok(after.every((d) => d.done && !d.body), "the server sent content of the cleared turn after the clear: " + JSON.stringify(after));
assert.ok(after.length === 1, "the watcher got the cleared turn's terminal frame once: " + JSON.stringify(after));
assert.ok(chat.messages.every((m) => m.role === "assistant" && ("You said: " + long).startsWith(textOf(m))),
  "the tab shows something other than the cleared reply's beginning: " + JSON.stringify(chat.messages));
if (chat.messages.length > 0) log("the tab kept", JSON.stringify(textOf(chat.messages[0])), "(on the wire at the clear; shown", JSON.stringify(shown) + ")");
log("cleared turn ended:", JSON.stringify(terminal[0]), deltas.length, "characters streamed");

// The next message gets a full answer, in a transcript that starts anew.
await chat.sendMessage({ text: "after the clear" });
assert.equal(chat.status, "ready", "chat error: " + chat.error?.message);
const last = chat.messages.at(-1);
assert.equal(last.role, "assistant");
assert.equal(textOf(last), "You said: after the clear");
const stored = await getMessages();
// The transcript starts anew: the new question and its answer, after (at
// most) the beginning of the cleared reply that was on the wire at the
// clear, which the tab put back and sent with its next request.
const fresh = stored.slice(-2);
assert.deepEqual(fresh.map((m) => m.role), ["user", "assistant"], "the new turn is stored last");
assert.equal(textOf(fresh[0]), "after the clear");
assert.equal(textOf(fresh[1]), "You said: after the clear");
assert.ok(stored.length === 2 || (stored.length === 3 && stored[0].role === "assistant" &&
  ("You said: " + long).startsWith(textOf(stored[0]))), "nothing else of the cleared turn is stored: " + JSON.stringify(stored));
log("next turn ok:", textOf(last));

tab.close();
watcher.close();
log("PASS chat-clear");
process.exit(0);
