// Drives the web playground in Debian's Chromium against a cluster of
// `agentry serve --postgres` nodes, started by the Go test
// test/clusterclients (playground_test.go). The page is loaded from a node
// that does not own the chat; the Go test kills other nodes when this
// script asks it to:
//
//   node cluster.mjs <base-url of a non-owner node> <assistant name> <screenshot-dir>
//
// It prints "WAIT <step>" and reads "GO <step>" on standard input once the
// Go test did the step: "kill-other" (a node that is neither the owner nor
// the one the page talks to) and "kill-owner" (the chat's owner). Every wait
// is on a DOM condition; there are no fixed sleeps. It prints "PASS
// cluster" at the end; any failure exits non-zero after a screenshot.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { log, openBrowser, step } from "./browser.mjs";

const [base, name, shotDir] = process.argv.slice(2);
if (!base || !name || !shotDir) {
  console.error("usage: node cluster.mjs <base-url> <assistant name> <screenshot-dir>");
  process.exit(2);
}
mkdirSync(shotDir, { recursive: true });
const T = 30_000; // the longest an ordinary condition may take
// A dead owner's shards move after its lease (2 s, 5 s under -race) and a
// renewal round; the page then reconnects with PartySocket's backoff.
const FAILOVER = 90_000;

const rl = createInterface({ input: process.stdin });
const lines = rl[Symbol.asyncIterator]();
// ask tells the Go test to do a step and waits until it did.
async function ask(what) {
  log(`WAIT ${what}`);
  const { done, value } = await lines.next();
  assert.ok(!done, `standard input closed while waiting for ${what}`);
  assert.equal(value.trim(), `GO ${what}`);
}

const context = await openBrowser({ timeout: T, viewport: { width: 1280, height: 860 } });

// Every socket's close code and every connection state the page shows,
// recorded from before the bundle runs.
await context.addInitScript(() => {
  window.__closes = [];
  window.__states = [];
  const Native = window.WebSocket;
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener("close", (e) => window.__closes.push(e.code));
    }
  };
  const record = () => {
    const s = document.querySelector("[data-testid=connection]")?.dataset.state;
    if (s && window.__states[window.__states.length - 1] !== s) window.__states.push(s);
  };
  new MutationObserver(record).observe(document, { subtree: true, childList: true, attributes: true });
});

let shots = 0;
async function shot(page, label) {
  const path = join(shotDir, `cluster-${String(++shots).padStart(2, "0")}-${label}.png`);
  await page.screenshot({ path });
  log(`SCREENSHOT ${path}`);
}

async function send(page, text) {
  const composer = page.getByTestId("chat-composer");
  await composer.locator("input").fill(text);
  await composer.locator("button[type=submit]").click();
}

const research = (page) => page.locator("[data-testid=tool-call][data-tool-name=research] [data-testid=helper-panel]");
const assistantSaying = (page, text) => page.locator("[data-testid=message][data-role=assistant]").filter({ hasText: text });
const states = (page) => page.evaluate(() => window.__states);
const closes = (page) => page.evaluate(() => window.__closes);

// researchThrough asks for research on topic, has the Go test do step
// while the helper runs, and waits for the helper and the answer.
async function researchThrough(page, topic, stepName, limit) {
  const before = await research(page).count();
  await send(page, `Research ${topic}`);
  const panel = research(page).nth(before);
  await panel.and(page.locator("[data-status=running]")).waitFor();
  await ask(stepName);
  await panel.and(page.locator("[data-status=completed]")).waitFor({ timeout: limit });
  const answer = `${topic[0].toUpperCase()}${topic.slice(1)} is worth knowing well.`;
  await assistantSaying(page, answer).last().waitFor({ timeout: limit });
  return answer;
}

async function run() {
  const page = await context.newPage();
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") log(`[console ${m.type()}] ${m.text()}`);
  });
  page.on("pageerror", (e) => log(`[pageerror] ${e.stack ?? e}`));

  // ── 1. The page comes from a node that does not own the chat; its
  // socket is forwarded to the owner. Another node dies mid-answer: the
  // answer completes and the socket is not disturbed.
  step("kill another node mid-answer");
  await page.goto(`${base}/#${encodeURIComponent(name)}`);
  await page.locator("[data-testid=connection][data-state=connected]").waitFor();
  await page.getByTestId("empty").waitFor();
  const first = await researchThrough(page, "tidal power", "kill-other", T);
  {
    const seen = await states(page);
    assert.ok(!seen.includes("disconnected"), `the socket stayed up while another node died: states ${JSON.stringify(seen)}`);
    assert.deepEqual(await closes(page), [], "no socket closed");
  }
  await shot(page, "other-node-killed");

  // ── 2. The chat's owner dies mid-answer: the forwarding node closes the
  // socket with 1012, the page reconnects (to the same node, which now
  // forwards to the new owner), and the answer completes there.
  step("kill the owner mid-answer");
  const second = await researchThrough(page, "wave energy", "kill-owner", FAILOVER);
  await page.locator("[data-testid=connection][data-state=connected]").waitFor({ timeout: FAILOVER });
  {
    const seen = await states(page);
    const lost = seen.lastIndexOf("disconnected");
    assert.ok(lost > 0 && seen.slice(lost).includes("connected"), `the page lost its socket and got it back: states ${JSON.stringify(seen)}`);
    const codes = await closes(page);
    assert.ok(codes.includes(1012), `the socket was closed with 1012 (service restart): codes ${JSON.stringify(codes)}`);
  }
  await shot(page, "owner-killed");

  // ── 3. The chat goes on through the same node, and each answer is shown
  // once, before and after a reload.
  step("chat on after the failover");
  await send(page, "hello");
  await assistantSaying(page, "Hello! I hand work to helper agents").last().waitFor({ timeout: T });
  const once = async (when) => {
    assert.equal(await research(page).count(), 2, `${when}: two research panels`);
    for (const text of [first, second]) {
      assert.equal(await assistantSaying(page, text).count(), 1, `${when}: "${text}" shown once`);
    }
  };
  await once("live");
  await page.reload();
  await page.locator("[data-testid=connection][data-state=connected]").waitFor();
  await assistantSaying(page, "Hello! I hand work to helper agents").last().waitFor();
  await once("after a reload");
  await shot(page, "after-reload");
}

try {
  await run();
  log("PASS cluster");
} catch (e) {
  log(`FAIL ${e.stack ?? e}`);
  for (const p of context.pages()) {
    try {
      await shot(p, "failure");
    } catch {}
  }
  process.exitCode = 1;
} finally {
  rl.close();
  process.stdin.destroy();
  await context.close();
}
