// Drives the playground (web/) in Debian's Chromium against a demo server
// (approvals_test.go): the page answers the client-side tool
// get_local_time itself, the user approves the Researcher helper's
// publish_findings inside its helper panel, and denies, then approves, the
// Assistant's delete_helper_runs in the chat.
//
//   node approvals.mjs <base-url> <screenshot-dir>
//
// Every wait is on a DOM condition; "PASS approvals" ends a good run.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { log, openBrowser, step } from "./browser.mjs";

const [base, shotDir] = process.argv.slice(2);
mkdirSync(shotDir, { recursive: true });
const T = 30_000;

const context = await openBrowser({ timeout: T, viewport: { width: 1280, height: 860 }, timezoneId: "Europe/Paris" });
const page = await context.newPage();
const errors = [];
page.on("console", (m) => {
  if (m.type() === "error") errors.push(m.text());
  if (m.type() === "error" || m.type() === "warning") log(`[console ${m.type()}] ${m.text()}`);
});
page.on("pageerror", (e) => {
  errors.push(String(e));
  log(`[pageerror] ${e.stack ?? e}`);
});

let shots = 0;
async function shot(name) {
  const path = join(shotDir, `approvals-${String(++shots).padStart(2, "0")}-${name}.png`);
  await page.screenshot({ path });
  log(`SCREENSHOT ${path}`);
}

async function send(text) {
  const composer = page.getByTestId("chat-composer");
  await composer.locator("input").fill(text);
  await composer.locator("button[type=submit]").click();
}

const assistantText = (re) => page.locator("[data-testid=message][data-role=assistant]", { hasText: re });

try {
  await page.goto(`${base}/#approvals`);
  await page.locator("[data-testid=connection][data-state=connected]").waitFor();

  step("1 get_local_time answered by the page");
  await send("what time is it?");
  await assistantText(/It is \d\d:\d\d where you are \(Europe\/Paris\)\./).waitFor();
  await page.locator("[data-testid=tool-call][data-tool-name=get_local_time][data-state=done]").waitFor();
  await shot("local-time");

  step("2 publish_findings approved inside the helper panel");
  await send("Research tides and publish the findings");
  const panel = page.locator("[data-testid=helper-panel]").last();
  const publish = panel.locator("[data-testid=timeline-tool][data-tool-name=publish_findings]");
  await publish.locator("[data-testid=approve]").waitFor();
  await panel.locator("[data-testid=phase-chip]", { hasText: "waiting-for-input" }).waitFor();
  assert.equal(await panel.getAttribute("data-status"), "running", "the helper waits, it did not end");
  await shot("helper-waits");
  await publish.locator("[data-testid=approve]").click();
  await panel.locator("xpath=self::*[@data-status='completed']").waitFor();
  await publish.locator("xpath=self::*[@data-state='done']").waitFor();
  await panel.locator("[data-testid=timeline-text]", { hasText: /I published the findings at https:\/\/wiki\.example\.com\// }).waitFor();
  await page.locator("[data-testid=typing]").waitFor({ state: "detached" });
  await shot("helper-approved");

  step("3 delete_helper_runs denied, then approved");
  await send("please delete my helper runs");
  const card = page.locator("[data-testid=tool-call][data-tool-name=delete_helper_runs]").last();
  await card.locator("[data-testid=deny]").click();
  await assistantText(/OK, I left your helper runs alone\./).waitFor();
  await page.locator("[data-testid=typing]").waitFor({ state: "detached" });
  await send("please delete my helper runs");
  const card2 = page.locator("[data-testid=tool-call][data-tool-name=delete_helper_runs]").nth(1);
  await card2.locator("[data-testid=approve]").click();
  await assistantText(/I deleted 1 helper runs\./).waitFor();
  await page.locator("[data-testid=typing]").waitFor({ state: "detached" });
  // One card per call: the continuations merged into their messages.
  assert.equal(await page.locator("[data-testid=tool-call][data-tool-name=delete_helper_runs]").count(), 2);
  assert.equal(await page.locator("[data-testid=tool-call][data-tool-name=get_local_time]").count(), 1);
  await shot("delete-approved");

  // A reload shows the same transcript from the server.
  await page.reload();
  await page.locator("[data-testid=connection][data-state=connected]").waitFor();
  await assistantText(/I deleted 1 helper runs\./).waitFor();
  assert.equal(await page.locator("[data-testid=tool-call][data-tool-name=delete_helper_runs]").count(), 2);
  assert.deepEqual(errors, [], "no console errors");
  log("PASS approvals");
} catch (err) {
  await shot("failure").catch(() => {});
  console.error(err);
  process.exitCode = 1;
} finally {
  await context.close();
}
