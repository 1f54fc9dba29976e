// Drives the web playground (web/) in Debian's Chromium with playwright-core,
// against two demo servers started by the Go test in this folder
// (playground_test.go): a fast one for most steps and a slow one, whose
// background run is still working when the test cancels it.
//
//   node playground.mjs <fast-base-url> <slow-base-url> <screenshot-dir>
//
// Every wait is on a DOM condition (locators, waitForFunction); there are
// no fixed sleeps. It prints "SCREENSHOT <path>" for each screenshot and
// "PASS playground" at the end; any failure exits non-zero after a
// screenshot of the page.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { log, openBrowser, step } from "./browser.mjs";

const [fastBase, slowBase, shotDir] = process.argv.slice(2);
if (!fastBase || !slowBase || !shotDir) {
  console.error("usage: node playground.mjs <fast-base-url> <slow-base-url> <screenshot-dir>");
  process.exit(2);
}
mkdirSync(shotDir, { recursive: true });
const T = 30_000; // the longest any single condition may take

const context = await openBrowser({ timeout: T, viewport: { width: 1280, height: 860 } });

const pages = [];
async function openPage(base, name) {
  const page = await context.newPage();
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") log(`[console ${m.type()}] ${m.text()}`);
  });
  page.on("pageerror", (e) => log(`[pageerror] ${e.stack ?? e}`));
  pages.push(page);
  await page.goto(`${base}/#${encodeURIComponent(name)}`);
  await connected(page);
  return page;
}

async function connected(page) {
  await page.locator('[data-testid=connection][data-state=connected]').waitFor();
}

let shots = 0;
async function shot(page, name) {
  const path = join(shotDir, `${String(++shots).padStart(2, "0")}-${name}.png`);
  await page.screenshot({ path });
  log(`SCREENSHOT ${path}`);
}

async function send(page, text) {
  // The button is enabled once there is text and no turn of this tab is
  // in flight; click() waits for that.
  const composer = page.getByTestId("chat-composer");
  await composer.locator("input").fill(text);
  await composer.locator("button[type=submit]").click();
}

// Records, from the DOM alone, every status each helper panel or
// background run shows and the successive lengths of its timeline text:
// the evidence that a run was seen live and streamed, whatever its speed.
async function watch(page) {
  await page.evaluate(() => {
    const seen = { statuses: {}, lengths: {}, pcts: {}, phases: {} };
    window.__seen = seen;
    const add = (map, id, v) => {
      const a = (map[id] ??= []);
      if (a[a.length - 1] !== v) a.push(v);
    };
    const record = () => {
      for (const el of document.querySelectorAll("[data-testid=helper-panel],[data-testid=background-run]")) {
        const id = el.dataset.runId;
        add(seen.statuses, id, el.dataset.status);
        add(seen.lengths, id, el.querySelector("[data-testid=timeline]")?.textContent?.length ?? 0);
        const pct = el.querySelector("[data-testid=progress]")?.dataset.pct;
        if (pct) add(seen.pcts, id, Number(pct));
        const phase = el.querySelector("[data-testid=phase-chip]")?.textContent;
        if (phase) add(seen.phases, id, phase);
      }
    };
    new MutationObserver(record).observe(document.body, { subtree: true, childList: true, attributes: true, characterData: true });
    record();
  });
}
const seen = (page) => page.evaluate(() => window.__seen);

// The scroller is at its bottom: the newest message is in view.
async function atNewest(page) {
  await page.waitForFunction(() => {
    const el = document.querySelector("[data-testid=messages]");
    const last = [...el.querySelectorAll("[data-testid=message],[data-testid=background-event]")].pop();
    if (!last) return false;
    const box = el.getBoundingClientRect();
    const r = last.getBoundingClientRect();
    return el.scrollHeight - el.scrollTop - el.clientHeight < 4 && r.bottom <= box.bottom + 1 && r.bottom > box.top;
  });
}

// No two of the page's main boxes overlap, and nothing is wider than the
// viewport.
async function assertNoOverlap(page) {
  const report = await page.evaluate(() => {
    const problems = [];
    const overlap = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
    const name = (e) => e.dataset.testid ?? e.className;
    // Siblings that must not overlap: the top bar's parts, the parts of its
    // info, and the page's regions.
    const groups = [".topbar > *", ".topbar-info > *", "[data-testid=background-panel], [data-testid=messages], [data-testid=chat-composer]"];
    const boxes = {};
    for (const sel of groups) {
      const els = [...document.querySelectorAll(sel)].filter((e) => e.getClientRects().length > 0);
      for (let i = 0; i < els.length; i++) {
        const a = els[i].getBoundingClientRect();
        boxes[name(els[i])] = a;
        for (let j = i + 1; j < els.length; j++) {
          if (overlap(a, els[j].getBoundingClientRect())) problems.push(`${name(els[i])} overlaps ${name(els[j])}`);
        }
      }
    }
    const w = document.documentElement.clientWidth;
    for (const e of document.querySelectorAll("body *")) {
      const r = e.getBoundingClientRect();
      if (r.width > 0 && r.right > w + 1 && !e.closest("pre, .tl-tool-output, .tool-output")) {
        problems.push(`${e.tagName.toLowerCase()}.${e.className} ends at ${Math.round(r.right)} px of ${w}`);
        break;
      }
    }
    if (document.documentElement.scrollWidth > w) problems.push(`the page scrolls sideways (${document.documentElement.scrollWidth} px)`);
    const panel = boxes["background-panel"];
    const composer = boxes["chat-composer"];
    if (!panel || !composer) problems.push("the background panel or the composer is not shown");
    else if (panel.top > composer.top) problems.push("the background panel is below the composer");
    if (composer && composer.bottom > window.innerHeight + 1) problems.push("the composer is off screen");
    return problems;
  });
  assert.deepEqual(report, [], `layout at ${page.viewportSize().width} px: ${report.join("; ")}`);
}

const helperPanels = (page, toolName) =>
  page.locator(`[data-testid=tool-call][data-tool-name=${toolName}] [data-testid=helper-panel]`);

async function run() {
  const user = `browser-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;

  // ── 1. A fresh user asks for research; the helper streams and completes.
  step("research");
  const page = await openPage(fastBase, user);
  await page.getByTestId("empty").waitFor();
  // The bundle is served gzip-compressed to the browser.
  {
    const encodings = await page.evaluate(async () => {
      const urls = [...document.querySelectorAll("script[src], link[rel=stylesheet]")].map((e) => e.src || e.href);
      return Promise.all(urls.map(async (u) => (await fetch(u, { cache: "no-store" })).headers.get("content-encoding")));
    });
    assert.ok(encodings.length >= 2 && encodings.every((e) => e === "gzip"), `asset encodings ${JSON.stringify(encodings)}`);
  }
  await watch(page);
  await send(page, "Research quantum computing");
  const research = helperPanels(page, "research");
  await research.first().waitFor();
  const done = research.and(page.locator("[data-status=completed]"));
  await done.waitFor();
  const runId = await research.getAttribute("data-run-id");
  assert.ok(runId, "the research panel has a run id");
  await assert.doesNotReject(
    research.getByTestId("timeline-text").filter({ hasText: "Quantum computing is worth knowing well" }).waitFor(),
  );
  await research.getByTestId("milestone-chip").filter({ hasText: "sources-gathered" }).waitFor();
  assert.equal(await research.getByTestId("progress").getAttribute("data-pct"), "100");
  assert.equal(await research.locator("[data-testid=timeline-tool][data-tool-name=web_search][data-state=done]").count(), 1);
  // The assistant answers from the helper's result.
  await page.locator("[data-testid=message][data-role=assistant]").filter({ hasText: "Quantum computing is worth knowing well." }).last().waitFor();
  {
    const s = await seen(page);
    assert.deepEqual(s.statuses[runId], ["running", "completed"], "the panel was seen running, then completed");
    const lengths = s.lengths[runId];
    assert.ok(lengths.length >= 3, `the timeline grew in steps (streamed), saw lengths ${JSON.stringify(lengths)}`);
    for (let i = 1; i < lengths.length; i++) assert.ok(lengths[i] >= lengths[i - 1], `the timeline only grew: ${JSON.stringify(lengths)}`);
    // Every phase of the search reached the page, "reading" included.
    for (const phase of ["searching", "reading", "synthesizing"]) {
      assert.ok(s.phases[runId]?.includes(phase), `phase ${phase} was shown: ${JSON.stringify(s.phases[runId])}`);
    }
  }
  const researchText = await research.getByTestId("timeline").textContent();
  await shot(page, "research-completed");

  // ── 2. After a refresh the panel comes back from the server's replay.
  step("refresh");
  await page.reload();
  await connected(page);
  await done.waitFor();
  assert.equal(await research.count(), 1);
  assert.equal(await research.getAttribute("data-run-id"), runId);
  await research.getByTestId("milestone-chip").filter({ hasText: "sources-gathered" }).waitFor();
  await page.waitForFunction(
    ([id, text]) => document.querySelector(`[data-testid=helper-panel][data-run-id="${id}"] [data-testid=timeline]`)?.textContent === text,
    [runId, researchText],
  );
  await atNewest(page);
  await shot(page, "research-after-refresh");

  // ── 2b. The answer shows its token usage, the helper's included; a file
  //        attached in the composer is sent with the message and shown in it.
  step("usage and attachment");
  {
    const usage = page.locator("[data-testid=message][data-role=assistant]").last().getByTestId("usage");
    await usage.waitFor();
    const own = Number(await usage.getAttribute("data-tokens"));
    const tree = Number(await usage.getAttribute("data-tree-tokens"));
    assert.ok(own > 0 && tree > own, `the answer shows its own tokens and the tree's, with the helper's: ${own}, ${tree}`);
  }
  await page.getByTestId("chat-composer-file").setInputFiles({ name: "notes.txt", mimeType: "text/plain", buffer: Buffer.from("Notes to read.") });
  await page.getByTestId("attachments").filter({ hasText: "notes.txt" }).waitFor();
  await send(page, "hello, what can you do?");
  await page.locator("[data-testid=message][data-role=user]").last().getByTestId("file-part").filter({ hasText: "notes.txt" }).waitFor();
  await page.locator("[data-testid=message][data-role=assistant]").last().filter({ hasText: "I hand work to helper agents" }).waitFor();
  assert.equal(await page.getByTestId("attachments").count(), 0, "the composer is empty after sending");

  // ── 3. A comparison: two helpers under one tool call, in order.
  step("compare");
  await watch(page);
  await send(page, "Compare HTTP/3 and gRPC");
  const compare = helperPanels(page, "compare");
  await page.waitForFunction(() => document.querySelectorAll("[data-testid=tool-call][data-tool-name=compare] [data-testid=helper-panel]").length === 2);
  await compare.and(page.locator("[data-status=completed]")).nth(1).waitFor();
  assert.deepEqual(await compare.evaluateAll((els) => els.map((e) => e.dataset.order)), ["0", "1"]);
  assert.deepEqual(
    await compare.getByTestId("helper-input").allTextContents(),
    ["HTTP/3", "gRPC"],
    "the panels follow the tool's order, not the order the runs finished",
  );
  await compare.nth(0).getByTestId("timeline-text").filter({ hasText: "HTTP/3 is worth knowing well" }).waitFor();
  await compare.nth(1).getByTestId("timeline-text").filter({ hasText: "GRPC is worth knowing well" }).waitFor();
  await page.locator("[data-testid=message][data-role=assistant]").filter({ hasText: "Side A:" }).waitFor();
  await shot(page, "compare");

  // ── 3b. A plan: the assistant's answer is the Planner's whole plan, its
  //        numbered steps included.
  step("plan");
  await send(page, "Plan adding rate limiting to the billing service");
  await helperPanels(page, "plan").and(page.locator("[data-status=completed]")).waitFor();
  // The answer's own text (the Planner's timeline in the panel above it has
  // the plan too).
  const plan = page.locator("[data-testid=message][data-role=assistant]").last().locator(":scope > .msg-body > .md").last();
  await plan.filter({ hasText: "Does this need a migration?" }).waitFor();
  assert.deepEqual(
    await plan.locator("ol li").allTextContents(),
    ["Write a failing test for the new behaviour.", "Change src/adding.go.", "Update the callers and run the tests."],
    "the plan's steps are all in the answer",
  );
  for (const heading of ["Overview", "Affected files", "Step-by-step", "Open questions"]) {
    await plan.locator(".md-h").filter({ hasText: heading }).waitFor();
  }
  // After a refresh, with every panel replayed, the page opens at the
  // newest message (the plan's end).
  await page.reload();
  await connected(page);
  await helperPanels(page, "plan").and(page.locator("[data-status=completed]")).waitFor();
  await page.waitForFunction(() => document.querySelectorAll("[data-testid=helper-panel][data-status=completed]").length === 4);
  await atNewest(page);
  await shot(page, "plan-after-refresh");

  // ── 4. Drill-in: the helper's own chat, which takes a follow-up.
  step("drill-in");
  await research.getByTestId("drill-in").click();
  const drawer = page.getByTestId("drill-in-panel");
  await drawer.waitFor();
  assert.equal(await drawer.getAttribute("data-run-id"), runId);
  const childMessages = drawer.getByTestId("drill-in-messages");
  await childMessages.locator("[data-testid=message][data-role=assistant]").filter({ hasText: "worth knowing well" }).waitFor();
  // The helper's chat starts with the query as a person types it, not the
  // tool input's JSON.
  assert.equal(
    (await childMessages.locator("[data-testid=message][data-role=user]").first().locator(".msg-body").textContent()).trim(),
    "quantum computing",
  );
  await drawer.getByTestId("drill-in-composer").locator("input").fill("What about costs?");
  await drawer.getByTestId("drill-in-composer").locator("button[type=submit]").click();
  await childMessages.locator("[data-testid=message][data-role=user]").filter({ hasText: "What about costs?" }).waitFor();
  await childMessages
    .locator("[data-testid=message][data-role=assistant]")
    .filter({ hasText: 'About "What about costs?": based on my earlier research on quantum computing' })
    .waitFor();
  await shot(page, "drill-in");
  await drawer.getByTestId("close-drill-in").click();
  await drawer.waitFor({ state: "detached" });
  // The follow-up went to the helper, not to the assistant's chat.
  assert.equal(await page.locator("[data-testid=messages]").getByText("What about costs?").count(), 0);

  // ── 5. Background research: progress in the background panel, then a
  //       follow-up message in the chat.
  step("background");
  await watch(page);
  await send(page, "Research the history of TLS, don't wait");
  const bg = page.getByTestId("background-run");
  await bg.first().waitFor();
  const bgId = await bg.first().getAttribute("data-run-id");
  await bg.and(page.locator("[data-status=completed]")).waitFor();
  await bg.getByTestId("milestone-chip").filter({ hasText: "sources-gathered" }).waitFor();
  await bg.getByText("the history of TLS").first().waitFor();
  // The chat hears about it: the completion notice, then the assistant's answer.
  await page.locator("[data-testid=background-event][data-kind=completion]").waitFor();
  await page
    .locator("[data-testid=message][data-role=assistant]")
    .filter({ hasText: 'Your background research on "the history of TLS" is done.' })
    .waitFor();
  {
    const s = await seen(page);
    assert.equal(s.statuses[bgId]?.[0], "running", `the background run was seen running: ${JSON.stringify(s.statuses[bgId])}`);
    assert.ok(s.pcts[bgId]?.includes(100), `the background run's progress was shown: ${JSON.stringify(s.pcts[bgId])}`);
  }
  // The foreground tool call that started it has no panel of its own.
  assert.equal(await helperPanels(page, "research_background").count(), 0);
  // Internal ids are for programs: none shows in the page's text.
  {
    const text = await page.locator("body").innerText();
    assert.ok(!/agent-tool:|call_\d+_\d+/.test(text), `an internal id shows in the page: ${text.match(/.{0,40}(agent-tool:|call_\d+_\d+).{0,40}/)?.[0]}`);
  }
  await shot(page, "background-completed");

  // ── 5b. The background helper opens from its panel: its own chat, which
  //        starts with the query.
  step("background drill-in");
  await bg.getByTestId("drill-in").click();
  await drawer.waitFor();
  assert.equal(await drawer.getAttribute("data-run-id"), bgId);
  assert.equal(await drawer.getAttribute("data-agent-type"), "Researcher");
  await childMessages.locator("[data-testid=message][data-role=assistant]").filter({ hasText: "worth knowing well" }).waitFor();
  assert.equal(
    (await childMessages.locator("[data-testid=message][data-role=user]").first().locator(".msg-body").textContent()).trim(),
    "the history of TLS",
  );
  await shot(page, "background-drill-in");
  await drawer.getByTestId("close-drill-in").click();
  await drawer.waitFor({ state: "detached" });

  // ── 5c. A phone-sized screen (390 px): the background panel sits above
  //        the conversation, nothing overlaps, the page opens at the newest
  //        message.
  step("390 px");
  await page.setViewportSize({ width: 390, height: 844 });
  await page.reload();
  await connected(page);
  await bg.and(page.locator("[data-status=completed]")).waitFor();
  await page.waitForFunction(() => document.querySelectorAll("[data-testid=helper-panel][data-status=completed]").length === 4);
  await atNewest(page);
  await assertNoOverlap(page);
  await shot(page, "narrow");
  await bg.getByTestId("drill-in").click();
  await drawer.waitFor();
  await childMessages.locator("[data-testid=message][data-role=assistant]").filter({ hasText: "worth knowing well" }).waitFor();
  await shot(page, "narrow-drill-in");
  await drawer.getByTestId("close-drill-in").click();
  await drawer.waitFor({ state: "detached" });
  await page.setViewportSize({ width: 1280, height: 860 });

  // ── 6. Cancel: on the slow server the background run is still working
  //       when the button is pressed.
  step("cancel");
  const slow = await openPage(slowBase, `${user}-cancel`);
  await watch(slow);
  await send(slow, "Research the history of DNS in the background");
  const slowRun = slow.getByTestId("background-run");
  await slowRun.and(slow.locator("[data-status=running]")).waitFor();
  // Wait for real progress (a phase chip and a fraction) before cancelling.
  await slowRun.getByTestId("phase-chip").waitFor();
  await slow.waitForFunction(() => Number(document.querySelector("[data-testid=background-run] [data-testid=progress]")?.dataset.pct) > 0);
  // The bar shows the fraction its label shows, at once (no transition
  // that lags it).
  {
    const bar = await slowRun.locator(".progress-fill").evaluate((e) => ({ width: e.style.width, transition: getComputedStyle(e).transitionDuration }));
    const pct = await slowRun.getByTestId("progress").getAttribute("data-pct");
    assert.deepEqual(bar, { width: `${pct}%`, transition: "0s" });
  }
  await shot(slow, "background-running");
  await slowRun.getByTestId("cancel-run").click();
  await slowRun.and(slow.locator("[data-status=aborted]")).waitFor();
  await slowRun.getByTestId("run-status").filter({ hasText: "Cancelled" }).waitFor();
  assert.equal(await slowRun.getByTestId("cancel-run").isDisabled(), true);
  {
    const s = await seen(slow);
    const id = await slowRun.getAttribute("data-run-id");
    assert.ok(!s.statuses[id].includes("completed"), `the cancelled run never completed: ${JSON.stringify(s.statuses[id])}`);
  }
  // The assistant hears that it was cancelled, and says so.
  await slow
    .locator("[data-testid=message][data-role=assistant]")
    .filter({ hasText: 'The background research on "the history of DNS" was cancelled' })
    .waitFor();
  // The cancellation survives a refresh (replayed from the server).
  await slow.reload();
  await connected(slow);
  await slowRun.and(slow.locator("[data-status=aborted]")).waitFor();
  await shot(slow, "background-cancelled");

  // ── 7. Clear removes every panel, here and after a refresh.
  step("clear");
  await page.getByTestId("clear").click();
  await page.getByTestId("empty").waitFor();
  await page.waitForFunction(
    () => document.querySelectorAll("[data-testid=helper-panel],[data-testid=background-run],[data-testid=message],[data-testid=tool-call]").length === 0,
  );
  await page.reload();
  await connected(page);
  await page.getByTestId("empty").waitFor();
  assert.equal(await page.locator("[data-testid=helper-panel],[data-testid=background-run]").count(), 0);
  await shot(page, "cleared");
}

try {
  await run();
  log("PASS playground");
} catch (err) {
  log(`FAIL ${err?.stack ?? err}`);
  for (const [i, p] of pages.entries()) {
    const path = join(shotDir, `failure-${i}.png`);
    try {
      await p.screenshot({ path });
      log(`SCREENSHOT ${path}`);
    } catch {
      // the page is gone
    }
  }
  process.exitCode = 1;
} finally {
  await context.close();
}
