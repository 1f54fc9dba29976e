// Drives the playground (web/) in Debian's Chromium against a demo server
// whose Assistant has an MCP server's tools (mcp_test.go: server-everything
// over stdio, as `agentry serve --mcp ev=-- …` attaches it): an MCP tool's
// call is a tool card like any other, its image is shown as a file part,
// a call that needs approval is approved in its card, and a reload shows
// the same.
//
//   node mcpclient.mjs <base-url> <screenshot-dir>
//
// Every wait is on a DOM condition; "PASS mcp" ends a good run.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { log, openBrowser, step } from "./browser.mjs";

const [base, shotDir] = process.argv.slice(2);
mkdirSync(shotDir, { recursive: true });
const T = 30_000;

const context = await openBrowser({ timeout: T, viewport: { width: 1280, height: 860 } });
const page = await context.newPage();
page.on("console", (m) => {
  if (m.type() === "error" || m.type() === "warning") log(`[console ${m.type()}] ${m.text()}`);
});
page.on("pageerror", (e) => log(`[pageerror] ${e.stack ?? e}`));

let shots = 0;
async function shot(name) {
  const path = join(shotDir, `mcp-${String(++shots).padStart(2, "0")}-${name}.png`);
  await page.screenshot({ path });
  log(`SCREENSHOT ${path}`);
}

async function send(text) {
  const composer = page.getByTestId("chat-composer");
  await composer.locator("input").fill(text);
  await composer.locator("button[type=submit]").click();
}

const assistantText = (re) => page.locator("[data-testid=message][data-role=assistant]", { hasText: re });
const card = (name) => page.locator(`[data-testid=tool-call][data-tool-name="${name}"]`);

try {
  await page.goto(`${base}/#mcp`);
  await page.locator("[data-testid=connection][data-state=connected]").waitFor();

  step("1 an MCP tool's call is a tool card");
  await send('call ev_echo {"message":"from the browser"}');
  await card("ev_echo").and(page.locator("[data-state=done]")).waitFor();
  await assistantText(/Echo: from the browser/).waitFor();
  await shot("echo");

  step("2 an MCP image is a file part");
  await send("call ev_get-tiny-image");
  await card("ev_get-tiny-image").and(page.locator("[data-state=done]")).waitFor();
  await page.locator('[data-testid=file-part] img[src^="data:image/png;base64,"]').waitFor();
  await shot("image");

  step("3 an MCP call that needs approval is approved in its card");
  await send('call ev_get-sum {"a":2,"b":3}');
  await card("ev_get-sum").locator("[data-testid=approve]").click();
  await assistantText(/ev_get-sum returned .*The sum of 2 and 3 is 5/).waitFor();
  await page.locator("[data-testid=typing]").waitFor({ state: "detached" });
  await shot("approved");

  step("4 after a reload, the same cards from the server's transcript");
  // (The card's state is read after the reload: live, the approved
  // card sometimes stays "running" after its continuation ended, a
  // playground glitch noted in the MCP client's report.)
  await page.reload();
  await page.locator("[data-testid=connection][data-state=connected]").waitFor();
  await assistantText(/The sum of 2 and 3 is 5/).waitFor();
  for (const name of ["ev_echo", "ev_get-tiny-image", "ev_get-sum"]) {
    await card(name).and(page.locator("[data-state=done]")).waitFor();
  }
  await page.locator('[data-testid=file-part] img[src^="data:image/png;base64,"]').waitFor();
  await shot("reloaded");

  log("PASS mcp");
} catch (err) {
  await shot("failure").catch(() => {});
  log(`FAIL ${err.stack ?? err}`);
  process.exitCode = 1;
} finally {
  await context.close();
}
