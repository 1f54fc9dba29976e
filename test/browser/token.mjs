// Drives the web playground in Chromium against a demo server that
// requires a token (`agentry serve --auth-token`), started by the Go test
// TestPlaygroundToken (playground_test.go).
//
//   node token.mjs <base-url> <token> <screenshot-dir>
//
// 1. /#name&token=… connects, the token leaves the address bar, a chat
//    turn completes, and a reload keeps the token (this tab's storage) and
//    the transcript (get-messages carries the token).
// 2. A new tab without the token is refused and shows the prompt; a wrong
//    token is refused again; the right one connects and shows the same
//    transcript.
// Every wait is on a DOM condition; "PASS token" at the end.
import assert from "node:assert/strict";
import { join } from "node:path";
import { log, openBrowser, step } from "./browser.mjs";

const [base, token, shotDir] = process.argv.slice(2);
if (!base || !token || !shotDir) {
  console.error("usage: node token.mjs <base-url> <token> <screenshot-dir>");
  process.exit(2);
}
const context = await openBrowser();

const pages = [];
async function newPage() {
  const page = await context.newPage();
  page.on("pageerror", (e) => log(`[pageerror] ${e.stack ?? e}`));
  pages.push(page);
  return page;
}
const connected = (page) => page.locator("[data-testid=connection][data-state=connected]").waitFor();
const answer = (page) =>
  page.locator("[data-testid=message][data-role=assistant]").filter({ hasText: "Quantum computing is worth knowing well." }).last();
const question = (page) => page.locator("[data-testid=messages]").getByText("Research quantum computing");

async function run() {
  const name = `token-${Date.now().toString(36)}`;

  step("token in the fragment");
  const page = await newPage();
  await page.goto(`${base}/#${name}&token=${encodeURIComponent(token)}`);
  await connected(page);
  assert.equal(await page.evaluate(() => window.location.hash), `#${name}`, "the token is dropped from the address bar");
  assert.equal(await page.getByTestId("instance-name").textContent(), name);
  await page.getByTestId("empty").waitFor();
  const composer = page.getByTestId("chat-composer");
  await composer.locator("input").fill("Research quantum computing");
  await composer.locator("button[type=submit]").click();
  await answer(page).waitFor();

  step("reload keeps the token and the transcript");
  await page.reload();
  await connected(page);
  await question(page).waitFor();
  await answer(page).waitFor();

  step("a new tab without the token is asked for it");
  const other = await newPage();
  await other.goto(`${base}/#${name}`);
  const prompt = other.getByTestId("token-prompt");
  await prompt.waitFor();
  assert.match(await prompt.textContent(), /requires a token/);
  await other.getByTestId("token-input").fill("wrong");
  await other.getByTestId("token-submit").click();
  await prompt.filter({ hasText: "refused the token" }).waitFor();
  await other.getByTestId("token-input").fill(token);
  await other.getByTestId("token-submit").click();
  await connected(other);
  await question(other).waitFor();
  await answer(other).waitFor();
}

try {
  await run();
  log("PASS token");
} catch (err) {
  log(`FAIL ${err?.stack ?? err}`);
  for (const [i, p] of pages.entries()) {
    const path = join(shotDir, `token-failure-${i}.png`);
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
