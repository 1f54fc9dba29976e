// Drives the web playground in Chromium across a reload that a turn's end
// overtakes, started by the Go test TestPlaygroundReloadAsTurnEnds
// (reload_test.go), which holds the assistant's stream after its first
// sentence and the reloaded page's history until the turn has ended.
//
//   node reload.mjs <base-url> <instance-name> <screenshot-dir>
//
// The chat shows the first sentence; the page reloads; the answer's last
// sentence, streamed while the page was loading, must appear. Every wait is
// on a DOM condition; "PASS reload" at the end.
import { join } from "node:path";
import { log, openBrowser, step } from "./browser.mjs";

const [base, name, shotDir] = process.argv.slice(2);
if (!base || !name || !shotDir) {
  console.error("usage: node reload.mjs <base-url> <instance-name> <screenshot-dir>");
  process.exit(2);
}
const context = await openBrowser();

const page = await context.newPage();
page.on("pageerror", (e) => log(`[pageerror] ${e.stack ?? e}`));
const connected = () => page.locator("[data-testid=connection][data-state=connected]").waitFor();
const assistant = (text) => page.locator("[data-testid=message][data-role=assistant]").filter({ hasText: text }).last();

async function run() {
  step("a turn streams its first sentence");
  await page.goto(`${base}/#${name}`);
  await connected();
  await page.getByTestId("empty").waitFor();
  const composer = page.getByTestId("chat-composer");
  await composer.locator("input").fill("What is the answer?");
  await composer.locator("button[type=submit]").click();
  await assistant("Working on it.").waitFor();

  step("reload; the turn ends while the page loads its history");
  await page.reload();
  await connected();
  await page.locator("[data-testid=messages]").getByText("What is the answer?").waitFor();
  await assistant("The final answer is 42.").waitFor();
}

try {
  await run();
  log("PASS reload");
} catch (err) {
  log(`FAIL ${err?.stack ?? err}`);
  const path = join(shotDir, "reload-failure.png");
  try {
    await page.screenshot({ path });
    log(`SCREENSHOT ${path}`);
  } catch {
    // the page is gone
  }
  process.exitCode = 1;
} finally {
  await context.close();
}
