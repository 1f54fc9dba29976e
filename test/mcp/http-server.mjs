// http-server.mjs: a streamable HTTP MCP server built with the official
// TypeScript SDK, for the Go tests of mcpclient. It listens on 127.0.0.1
// (an ephemeral port), prints "READY <url>" and serves until killed.
//
// Tools: greet (text), report (structuredContent), slow (progress
// notifications, then waits until cancelled or the server dies), and
// add_tool (registers "added", so the server sends
// notifications/tools/list_changed).
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

const token = process.env.MCP_TOKEN || '';

function newServer() {
  const server = new McpServer({ name: 'ts-test', version: '1.0.0' });
  server.registerTool('greet', {
    description: 'Greets someone.',
    inputSchema: { name: z.string().describe('Who to greet') },
  }, async ({ name }) => ({ content: [{ type: 'text', text: `Hello, ${name}!` }] }));
  server.registerTool('report', {
    description: 'A structured report.',
    inputSchema: {},
    outputSchema: { ok: z.boolean(), count: z.number() },
  }, async () => ({ content: [{ type: 'text', text: '{"ok":true,"count":3}' }], structuredContent: { ok: true, count: 3 } }));
  server.registerTool('slow', {
    description: 'Reports progress, then waits until cancelled.',
    inputSchema: { steps: z.number() },
  }, async ({ steps }, extra) => {
    const progressToken = extra._meta?.progressToken;
    for (let i = 1; i <= steps; i++) {
      if (progressToken !== undefined) {
        await extra.sendNotification({ method: 'notifications/progress', params: { progressToken, progress: i, total: steps, message: `step ${i}` } });
      }
    }
    await new Promise((resolve) => extra.signal.addEventListener('abort', resolve));
    return { content: [{ type: 'text', text: 'cancelled' }] };
  });
  server.registerTool('add_tool', {
    description: 'Adds the tool "added".',
    inputSchema: {},
  }, async () => {
    server.registerTool('added', { description: 'Added at run time.', inputSchema: {} },
      async () => ({ content: [{ type: 'text', text: 'added works' }] }));
    return { content: [{ type: 'text', text: 'tool added' }] };
  });
  return server;
}

const sessions = new Map(); // session id -> transport

const httpServer = http.createServer(async (req, res) => {
  if (token && req.headers.authorization !== `Bearer ${token}`) {
    res.writeHead(401).end('unauthorized');
    return;
  }
  const id = req.headers['mcp-session-id'];
  let transport = id && sessions.get(id);
  if (!transport) {
    if (req.method !== 'POST' || id) {
      res.writeHead(404).end('session not found');
      return;
    }
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (sid) => sessions.set(sid, transport),
    });
    transport.onclose = () => sessions.delete(transport.sessionId);
    await newServer().connect(transport);
  }
  await transport.handleRequest(req, res);
});

httpServer.listen(0, '127.0.0.1', () => {
  console.log(`READY http://127.0.0.1:${httpServer.address().port}/mcp`);
});
