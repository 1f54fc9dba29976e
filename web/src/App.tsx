// The playground: a chat with the agents-as-tools Assistant on the real
// Cloudflare Agents React clients. One useAgent socket carries the chat
// (useAgentChat) and the helpers' events (useAgentToolEvents); they are
// joined in the transcript by tool call id. Drill-in opens a second
// socket to the helper itself (useAgent with sub) and runs useAgentChat on
// it, so the side panel is the helper's real chat.
import { Suspense, useCallback, useEffect, useMemo, useRef, useState, type ReactNode } from "react";
import { useAgent, useAgentToolEvents } from "agents/react";
import { useAgentChat } from "@cloudflare/ai-chat/react";
import type { FileUIPart } from "ai";
import { Composer, MessageView, withoutStandIns, type Answers } from "./chat";
import { Avatar, BackgroundRuns, DRILLABLE, runLabel, StatusBadge, type Run } from "./helpers";
import { REFUSED, socketProtocol, usePageAddress } from "./instance";
import { useStickToBottom } from "./scroll";
import { previewInput, type Part } from "./parts";

type Connection = "connecting" | "connected" | "disconnected";

const SUGGESTIONS = [
  "Research quantum computing",
  "Compare HTTP/3 and gRPC",
  "Plan adding rate limiting to the billing service",
  "Research the history of TLS, don't wait",
];

// The query every socket sends: the token a server started with
// `agentry serve --auth-token` requires. useAgentChat's history request
// (get-messages) carries the socket's query, so it needs nothing else.
type Query = { token: string } | undefined;

export function App() {
  const { name, token, setToken } = usePageAddress();
  const [refused, setRefused] = useState(false);
  const query = useMemo<Query>(() => (token ? { token } : undefined), [token]);
  const onRefused = useCallback(() => setRefused(true), []);
  if (refused) {
    return (
      <TokenPrompt
        hadToken={token !== ""}
        onSubmit={(t) => {
          setToken(t);
          setRefused(false);
        }}
      />
    );
  }
  // A new instance name or token is a new page: fresh sockets, fresh state.
  return <Playground key={`${name}\n${token}`} name={name} query={query} onRefused={onRefused} />;
}

// TokenPrompt asks for the token after the server refused the socket.
function TokenPrompt({ hadToken, onSubmit }: { hadToken: boolean; onSubmit: (token: string) => void }) {
  const [value, setValue] = useState("");
  return (
    <div className="app">
      <header className="topbar">
        <div className="brand">
          <span className="logo">◆</span> Agentry <span className="brand-sub">playground</span>
        </div>
      </header>
      <form
        className="token-prompt"
        data-testid="token-prompt"
        onSubmit={(e) => {
          e.preventDefault();
          if (value.trim() !== "") onSubmit(value.trim());
        }}
      >
        <h1>{hadToken ? "The server refused the token" : "This server requires a token"}</h1>
        <p className="muted">
          Enter the token it was started with (<code>agentry serve --auth-token</code>). It stays in this tab. A link can
          carry it too: <code>/#token=…</code>.
        </p>
        <input
          type="password"
          data-testid="token-input"
          aria-label="Token"
          autoComplete="off"
          autoFocus
          value={value}
          onChange={(e) => setValue(e.target.value)}
        />
        <button type="submit" className="btn btn-primary" data-testid="token-submit" disabled={value.trim() === ""}>
          Connect
        </button>
      </form>
    </div>
  );
}

function useMainAgent(name: string, query: Query, onRefused: () => void) {
  const [connection, setConnection] = useState<Connection>("connecting");
  const agent = useAgent({
    agent: "Assistant",
    name,
    query,
    protocol: socketProtocol,
    onOpen: () => setConnection("connected"),
    onClose: (e: CloseEvent) => {
      setConnection("disconnected");
      if (e.code === REFUSED) onRefused();
    },
  });
  return { agent, connection };
}

export type MainAgent = ReturnType<typeof useMainAgent>["agent"];

function Playground({ name, query, onRefused }: { name: string; query: Query; onRefused: () => void }) {
  const { agent, connection } = useMainAgent(name, query, onRefused);
  // Mounted with the socket, outside the Suspense boundary of the chat, so
  // the replay the server pushes on connect is never missed.
  const tools = useAgentToolEvents<Part>({ agent });
  return (
    <div className="app">
      <Suspense fallback={<Shell name={name} connection={connection} body={<p className="muted center">Loading the transcript…</p>} />}>
        <ChatPage name={name} query={query} agent={agent} connection={connection} tools={tools} />
      </Suspense>
    </div>
  );
}

function Shell({ name, connection, body, onClear, canClear }: { name: string; connection: Connection; body: ReactNode; onClear?: () => void; canClear?: boolean }) {
  return (
    <>
      <header className="topbar">
        <div className="brand">
          <span className="logo">◆</span> Agentry <span className="brand-sub">playground</span>
        </div>
        <div className="topbar-info">
          <span className="instance" title="Assistant instance: change it with the URL hash, e.g. #alice">
            <span className="instance-label">Assistant / </span>
            <strong data-testid="instance-name">{name}</strong>
          </span>
          <span className={`conn conn-${connection}`} data-testid="connection" data-state={connection}>
            <span className="dot" /> {connection}
          </span>
        </div>
        <button type="button" className="btn" data-testid="clear" onClick={onClear} disabled={!onClear || !canClear}>
          Clear
        </button>
      </header>
      {body}
    </>
  );
}

// answerClientTool is the page's onToolCall: it answers the demo's
// client-side tool get_local_time with the browser's clock and time zone.
function answerClientTool({
  toolCall,
  addToolOutput,
}: {
  toolCall: { toolCallId: string; toolName: string };
  addToolOutput: (o: { toolCallId: string; output: unknown }) => void;
}) {
  if (toolCall.toolName !== "get_local_time") return;
  const now = new Date();
  const pad = (n: number) => String(n).padStart(2, "0");
  addToolOutput({
    toolCallId: toolCall.toolCallId,
    output: {
      time: `${pad(now.getHours())}:${pad(now.getMinutes())}`,
      date: `${now.getFullYear()}-${pad(now.getMonth() + 1)}-${pad(now.getDate())}`,
      timeZone: Intl.DateTimeFormat().resolvedOptions().timeZone,
    },
  });
}

function ChatPage({
  name,
  query,
  agent,
  connection,
  tools,
}: {
  name: string;
  query: Query;
  agent: MainAgent;
  connection: Connection;
  tools: ReturnType<typeof useAgentToolEvents<Part>>;
}) {
  const { messages, sendMessage, clearHistory, status, isServerStreaming, addToolApprovalResponse } = useAgentChat({
    agent,
    onToolCall: answerClientTool,
  });
  const { runsById, runsByToolCallId, unboundRuns, resetLocalState } = tools;
  const answers = useMemo<Answers>(
    () => ({
      onApprove: (part, approved) => {
        const id = (part as { approval?: { id: string } }).approval?.id;
        if (id) addToolApprovalResponse({ id, approved });
      },
      // A helper's approval is answered through this (the parent's)
      // connection.
      onAnswerRun: (run, part, approved) =>
        agent.send(JSON.stringify({ type: "agent_tool_approval", runId: run.runId, toolCallId: part.toolCallId, approved })),
    }),
    [addToolApprovalResponse, agent],
  );

  const [drill, setDrill] = useState<string | null>(null);
  const [cancelling, setCancelling] = useState<ReadonlySet<string>>(() => new Set());
  const [notice, setNotice] = useState<string | null>(null);

  // A cleared chat (here or in another tab) drops the helper state with it:
  // a transcript that had messages and has none. A chat that never had any
  // keeps its runs (runs started over MCP or from Go have no messages).
  const hadMessages = useRef(false);
  useEffect(() => {
    if (messages.length > 0) {
      hadMessages.current = true;
      return;
    }
    if (hadMessages.current) {
      hadMessages.current = false;
      resetLocalState();
      setDrill(null);
    }
  }, [messages.length, resetLocalState]);

  const clear = useCallback(async () => {
    // Delete the helper runs first, so a reconnect in between cannot
    // replay panels the user just cleared.
    try {
      await agent.call("clearHelperRuns");
    } catch (err) {
      setNotice(`Could not clear the helper runs: ${String(err)}`);
    }
    clearHistory();
    resetLocalState();
    setDrill(null);
    setCancelling(new Set());
  }, [agent, clearHistory, resetLocalState]);

  const cancel = useCallback(
    async (run: Run) => {
      setCancelling((s) => new Set(s).add(run.runId));
      try {
        await agent.call("cancelBackground", [run.runId]);
      } catch (err) {
        setNotice(`Could not cancel the ${runLabel(run)}: ${String(err)}`);
      } finally {
        setCancelling((s) => {
          const next = new Set(s);
          next.delete(run.runId);
          return next;
        });
      }
    },
    [agent],
  );

  const background = useMemo(() => [...unboundRuns].sort((a, b) => a.order - b.order), [unboundRuns]);
  const openDrill = useCallback((run: Run) => setDrill(run.runId), []);
  const drillRun = drill ? runsById[drill] : undefined;

  // Opens at the newest message (after a refresh too, while the helpers'
  // panels replay and grow) and follows the conversation while the reader
  // stays at the bottom; sending a message jumps back there.
  const { scroller, content, stick } = useStickToBottom<HTMLDivElement>();
  const send = useCallback(
    (text: string, files: FileUIPart[] = []) => {
      stick();
      sendMessage(files.length > 0 ? { text, files } : { text });
    },
    [sendMessage, stick],
  );

  const busy = status === "submitted" || status === "streaming";

  return (
    <Shell
      name={name}
      connection={connection}
      onClear={clear}
      canClear={messages.length > 0 || background.length > 0}
      body={
        <div className="layout">
          <main className="chat">
            <div className="messages" ref={scroller} data-testid="messages">
              <div className="messages-content" ref={content}>
                {messages.length === 0 ? (
                  <Empty onPick={send} />
                ) : (
                  withoutStandIns(messages).map((m) => (
                    <MessageView key={m.id} message={m} runsByToolCall={runsByToolCallId} onDrillIn={openDrill} answers={answers} />
                  ))
                )}
                {(busy || isServerStreaming) && (
                  <div className="typing" data-testid="typing">
                    <span />
                    <span />
                    <span />
                  </div>
                )}
              </div>
            </div>
            {notice && (
              <div className="notice" role="alert" onClick={() => setNotice(null)}>
                {notice}
              </div>
            )}
            <Composer
              testId="chat-composer"
              onSend={send}
              disabled={busy || connection !== "connected"}
              placeholder="Ask the assistant: research, compare, plan, or research in the background…"
            />
          </main>
          <BackgroundRuns runs={background} cancelling={cancelling} onCancel={cancel} onDrillIn={openDrill} />
          {drillRun && <DrillIn key={drillRun.runId} name={name} query={query} run={drillRun} onClose={() => setDrill(null)} />}
        </div>
      }
    />
  );
}

function Empty({ onPick }: { onPick: (text: string) => void }) {
  return (
    <div className="empty" data-testid="empty">
      <h1>Agents as tools</h1>
      <p className="muted">
        The Assistant hands work to helper agents: a <code>Researcher</code> or a <code>Planner</code>, each with its own
        chat, tools and storage. Their work streams live under the tool call, survives a refresh, and opens as a real chat
        of its own.
      </p>
      <div className="suggestions">
        {SUGGESTIONS.map((s) => (
          <button key={s} type="button" className="suggestion" onClick={() => onPick(s)}>
            {s}
          </button>
        ))}
      </div>
    </div>
  );
}

// The helper's own chat, reached through the parent:
// /agents/assistant/{name}/sub/{kebab(agentType)}/{runId}.
function DrillIn({ name, query, run, onClose }: { name: string; query: Query; run: Run; onClose: () => void }) {
  const child = useAgent({
    agent: "Assistant",
    name,
    query,
    sub: [{ agent: run.subAgent.agent, name: run.subAgent.name }],
    protocol: socketProtocol,
  });
  useEffect(() => {
    const onKey = (e: KeyboardEvent) => e.key === "Escape" && onClose();
    window.addEventListener("keydown", onKey);
    return () => window.removeEventListener("keydown", onKey);
  }, [onClose]);
  return (
    <div className="drawer-wrap">
      <button type="button" className="drawer-backdrop" aria-label="Close the helper's chat" onClick={onClose} />
      <aside className="drawer" data-testid="drill-in-panel" data-run-id={run.runId} data-agent-type={run.agentType}>
        <header className="drawer-head">
          <Avatar run={run} />
          <div className="drawer-title">
            <div className="helper-name">{runLabel(run)}</div>
            <div className="muted small ellipsis">{previewInput(run.inputPreview)}</div>
          </div>
          <StatusBadge status={run.status} />
          <button type="button" className="btn btn-small" data-testid="close-drill-in" onClick={onClose}>
            Close
          </button>
        </header>
        <div className="drawer-note muted small">
          This is the {runLabel(run)}'s own chat. Follow-up messages go to the helper, not to the assistant.
        </div>
        {DRILLABLE.has(run.agentType) ? (
          <Suspense fallback={<p className="muted center">Loading the helper's chat…</p>}>
            <ChildChat agent={child} />
          </Suspense>
        ) : (
          <p className="error-text">No drill-in for {run.agentType}.</p>
        )}
      </aside>
    </div>
  );
}

function ChildChat({ agent }: { agent: MainAgent }) {
  const { messages, sendMessage, status, isServerStreaming, addToolApprovalResponse } = useAgentChat({ agent, onToolCall: answerClientTool });
  const answers = useMemo<Answers>(
    () => ({
      onApprove: (part, approved) => {
        const id = (part as { approval?: { id: string } }).approval?.id;
        if (id) addToolApprovalResponse({ id, approved });
      },
    }),
    [addToolApprovalResponse],
  );
  const { scroller, content, stick } = useStickToBottom<HTMLDivElement>();
  const busy = status === "submitted" || status === "streaming";
  return (
    <>
      <div className="drawer-messages" ref={scroller} data-testid="drill-in-messages">
        <div className="messages-content" ref={content}>
          {messages.length === 0 ? (
            <p className="muted center">No messages yet.</p>
          ) : (
            withoutStandIns(messages).map((m) => <MessageView key={m.id} message={m} answers={answers} />)
          )}
          {(busy || isServerStreaming) && (
            <div className="typing">
              <span />
              <span />
              <span />
            </div>
          )}
        </div>
      </div>
      <Composer
        testId="drill-in-composer"
        onSend={(text, files) => {
          stick();
          sendMessage(files.length > 0 ? { text, files } : { text });
        }}
        disabled={busy}
        placeholder="Ask this helper a follow-up…"
      />
    </>
  );
}
