// Drives the web playground in Chromium while an MCP client's call runs
// under its instance, for the Go test TestPlaygroundShowsMCPRuns
// (mcp_test.go):
//
//   node mcp.mjs <base-url> <instance> <screenshot-dir>
//
// The run an MCP tools/call started (before the page opened) is in the
// instance's Background runs panel: replayed on connect, then live, its
// progress moving, until it completes. Every wait is on a DOM condition;
// "PASS mcp" at the end.
import { join } from "node:path";
import { log, openBrowser, step } from "./browser.mjs";

const [base, name, shotDir] = process.argv.slice(2);
if (!base || !name || !shotDir) {
  console.error("usage: node mcp.mjs <base-url> <instance> <screenshot-dir>");
  process.exit(2);
}
const context = await openBrowser({ timeout: 60_000 });
try {
  const page = await context.newPage();
  page.on("pageerror", (e) => log(`[pageerror] ${e.stack ?? e}`));
  step("the MCP run is among the background runs");
  await page.goto(`${base}/#${name}`);
  await page.locator("[data-testid=connection][data-state=connected]").waitFor();
  const run = page.locator("[data-testid=background-run]");
  await run.waitFor();
  const id = await run.getAttribute("data-run-id");
  if (!id?.startsWith("mcp-")) throw new Error(`background run ${id}: want the MCP run`);
  step("live: its progress moves, then it completes");
  await page.waitForFunction(() => Number(document.querySelector("[data-testid=background-run] [data-testid=progress]")?.dataset.pct) > 0);
  await page.screenshot({ path: join(shotDir, "mcp-run.png") });
  log(`SCREENSHOT ${join(shotDir, "mcp-run.png")}`);
  await page.locator("[data-testid=background-run][data-status=completed]").waitFor();
  log("PASS mcp");
} finally {
  await context.close();
}
