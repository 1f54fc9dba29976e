// The parts of useAgentChat (agents/chat/react, which @cloudflare/ai-chat
// re-exports) that the chat scripts need, without React: the AI SDK's
// AbstractChat (which useChat wraps) on the hook's WebSocketChatTransport,
// the resume handshake, and the transcript sync — cf_agent_chat_messages
// replaces the messages, except that the assistant message the tab is
// streaming is kept at the end until its turn's terminal frame and then put
// back after the message it answers (the hook's
// preserveProtectedStreamingAssistant and restoreProtectedStreamingAssistant),
// and clearHistory empties the messages and sends cf_agent_chat_clear.
import { AgentClient } from "agents/client";
import { WebSocketChatTransport } from "agents/chat/transport";
import { AbstractChat } from "ai";
import WebSocket from "ws";

class SimpleState {
  constructor(messages = []) {
    this._status = "ready"; this.error = undefined; this._messages = messages; this.listeners = [];
  }
  get messages() { return this._messages; }
  set messages(m) { this._messages = m; this.notify(); }
  // A status change is a change the waiters see too.
  get status() { return this._status; }
  set status(s) { this._status = s; this.notify(); }
  notify() { for (const l of this.listeners.splice(0)) if (!l()) this.listeners.push(l); }
  pushMessage(m) { this.messages = [...this.messages, m]; }
  popMessage() { this.messages = this.messages.slice(0, -1); }
  replaceMessage(i, m) { const c = [...this.messages]; c[i] = m; this.messages = c; }
  snapshot(x) { return structuredClone(x); }
}

export class NodeChat extends AbstractChat {
  constructor(init) {
    const state = new SimpleState(init.messages ?? []);
    super({ ...init, state });
    this.simpleState = state;
  }

  // whenMessages resolves once pred(messages) holds, checked now and after
  // every change the chat makes to its messages (as a React render would
  // see them).
  whenMessages(pred, what, limit = 15000) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("timed out waiting for " + what)), limit);
      const check = () => { if (pred(this.messages)) { clearTimeout(timer); resolve(); return true; } return false; };
      if (!check()) this.simpleState.listeners.push(check);
    });
  }
}

// The part of useAgentChat that feeds the transport's resume handshake.
export function wireResume(agent, transport) {
  agent.addEventListener("message", (e) => {
    if (typeof e.data !== "string") return;
    const d = JSON.parse(e.data);
    if (d.type === "cf_agent_stream_resuming") transport.handleStreamResuming(d);
    else if (d.type === "cf_agent_stream_resume_none") transport.handleStreamResumeNone(d);
    else if (d.type === "cf_agent_stream_pending") transport.handleStreamPending();
  });
}

// Records every JSON frame a socket receives; until(pred) waits for the
// list to satisfy pred.
export function frames(agent, limit = 15000) {
  const list = [];
  const waiters = [];
  agent.addEventListener("message", (e) => {
    if (typeof e.data !== "string") return;
    const d = JSON.parse(e.data);
    list.push(d);
    for (const w of waiters.splice(0)) if (!w()) waiters.push(w);
  });
  return {
    list,
    until(pred, what) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("timed out waiting for " + what)), limit);
        const check = () => { if (pred(list)) { clearTimeout(timer); resolve(); return true; } return false; };
        if (!check()) waiters.push(check);
      });
    },
  };
}

// useAgentChat({ agent }) for one tab: agent is a ready AgentClient. It
// returns { chat, transport, clearHistory }. Call it before the tab's first
// request, so that its listener sees each frame before the transport's, as
// the hook's does.
export function useAgentChat(agent, id, options = {}) {
  const local = new Set(); // the hook's localRequestIdsRef
  const transport = new WebSocketChatTransport({ agent, activeRequestIds: local });
  const chat = new NodeChat({ id, transport, ...options });
  let protection = null; // { assistantId, anchorMessageId }
  const preserve = (messages, current) => {
    if (!protection) return [...messages];
    const i = messages.findIndex((m) => m.id === protection.assistantId);
    if (i >= 0 && messages.slice(i + 1).some((m) => m.role === "assistant")) {
      protection = null;
      return [...messages];
    }
    const kept = current.find((m) => m.id === protection.assistantId) ?? messages.find((m) => m.id === protection.assistantId);
    if (!kept) return [...messages];
    return [...messages.filter((m) => m.id !== protection.assistantId), kept];
  };
  const restore = (assistantId) => {
    if (!protection || (assistantId !== undefined && protection.assistantId !== assistantId)) return;
    const p = protection;
    protection = null;
    const result = [...chat.messages];
    const from = result.findIndex((m) => m.id === p.assistantId);
    if (from < 0) return;
    const [msg] = result.splice(from, 1);
    if (p.anchorMessageId === null) result.unshift(msg);
    else {
      const anchor = result.findIndex((m) => m.id === p.anchorMessageId);
      result.splice(anchor >= 0 ? anchor + 1 : from, 0, msg);
    }
    chat.messages = result;
  };
  const responseIds = new Map(); // request id -> assistant message id
  agent.addEventListener("message", (e) => {
    if (typeof e.data !== "string") return;
    const d = JSON.parse(e.data);
    switch (d.type) {
      case "cf_agent_chat_clear":
        protection = null;
        chat.messages = [];
        break;
      case "cf_agent_chat_messages":
        chat.messages = preserve(d.messages, chat.messages);
        break;
      case "cf_agent_message_updated": {
        // The hook replaces the message with the same id (else the one
        // holding one of its tool calls); it never appends.
        const ids = new Set(d.message.parts.filter((p) => p.toolCallId).map((p) => p.toolCallId));
        let i = chat.messages.findIndex((m) => m.id === d.message.id);
        if (i < 0) i = chat.messages.findIndex((m) => m.parts.some((p) => p.toolCallId && ids.has(p.toolCallId)));
        if (i >= 0) chat.messages = chat.messages.map((m, j) => (j === i ? d.message : m));
        break;
      }
      case "cf_agent_use_chat_response": {
        if (!local.has(d.id)) break;
        if (d.body?.trim()) {
          let ch;
          try { ch = JSON.parse(d.body); } catch { ch = null; }
          if (ch?.type === "start" && typeof ch.messageId === "string" && !d.continuation) {
            responseIds.set(d.id, ch.messageId);
            if (protection?.assistantId !== ch.messageId) {
              const i = chat.messages.findIndex((m) => m.id === ch.messageId);
              protection = {
                assistantId: ch.messageId,
                anchorMessageId: i >= 0 ? chat.messages[i - 1]?.id ?? null : chat.messages.at(-1)?.id ?? null,
              };
            }
          }
        }
        if (d.done || d.error) {
          restore(responseIds.get(d.id));
          responseIds.delete(d.id);
          local.delete(d.id);
        }
        break;
      }
    }
  });
  wireResume(agent, transport);
  // startToolContinuation: the hook arms the transport for the server's
  // continuation and resumes the stream.
  const continuation = async () => {
    transport.expectToolContinuation();
    await chat.resumeStream();
  };
  return {
    chat,
    transport,
    // useAgentChat's addToolApprovalResponse: cf_agent_tool_approval to the
    // server (autoContinue), the AI SDK's local update, the continuation.
    async addToolApprovalResponse({ id, approved }) {
      let toolCallId;
      for (const m of chat.messages) for (const p of m.parts) if (p.approval?.id === id) toolCallId = p.toolCallId;
      agent.send(JSON.stringify({ type: "cf_agent_tool_approval", toolCallId, approved, autoContinue: true }));
      await chat.addToolApprovalResponse({ id, approved });
      await continuation();
    },
    // The addToolOutput that useAgentChat's onToolCall gets: cf_agent_tool_result
    // to the server (autoContinue), the AI SDK's local update, the continuation.
    async addToolOutput({ toolCallId, tool, output }) {
      agent.send(JSON.stringify({ type: "cf_agent_tool_result", toolCallId, toolName: tool, output, autoContinue: true }));
      await chat.addToolOutput({ tool, toolCallId, output });
      await continuation();
    },
    // useAgentChat's clearHistory.
    clearHistory() {
      protection = null;
      chat.messages = [];
      agent.send(JSON.stringify({ type: "cf_agent_chat_clear" }));
    },
  };
}

// connect opens a ready AgentClient to an agent of the server at host.
export async function connect(host, agentClass, name) {
  const c = new AgentClient({ agent: agentClass, name, host, WebSocket });
  await c.ready;
  return c;
}

export const textOf = (m) => m.parts.filter((p) => p.type === "text").map((p) => p.text).join("");
