// Takes the README's picture of the playground, docs/playground.png: a
// finished research panel, a comparison streaming and a background run
// working, all at once. Run by TestDocsScreenshot (AGENTRY_DOCS_SCREENSHOT=1)
// against a server whose helpers stream slowly.
//
//   node docs.mjs <base-url> <png-path>
import { openBrowser } from "./browser.mjs";

const [base, out] = process.argv.slice(2);
const context = await openBrowser({ timeout: 90_000, viewport: { width: 1280, height: 900 } });
try {
  const page = await context.newPage();
  await page.goto(`${base}/#demo`);
  await page.locator("[data-testid=connection][data-state=connected]").waitFor();
  const send = async (text) => {
    await page.getByTestId("chat-composer").locator("input").fill(text);
    await page.getByTestId("chat-composer").locator("button[type=submit]").click();
  };
  await send("Research quantum computing");
  await page.locator("[data-testid=message][data-role=assistant]").filter({ hasText: "worth knowing well." }).waitFor();
  await send("Research the history of TLS, don't wait");
  await page.locator("[data-testid=message][data-role=assistant]").filter({ hasText: "I started the research in the background" }).waitFor();
  await page.locator("[data-testid=background-run] [data-testid=phase-chip]").waitFor();
  await send("Compare HTTP/3 and gRPC");
  // Both sides streaming their summaries, the background run still working.
  await page.waitForFunction(() => {
    const panels = [...document.querySelectorAll("[data-testid=tool-call][data-tool-name=compare] [data-testid=helper-panel]")];
    return panels.length === 2 && panels.every((p) => (p.querySelector("[data-testid=timeline-text]")?.textContent?.length ?? 0) > 40);
  });
  await page.locator("[data-testid=messages]").evaluate((el) => (el.scrollTop = el.scrollHeight));
  await page.screenshot({ path: out });
  const bg = await page.locator("[data-testid=background-run]").getAttribute("data-status");
  console.log(`SCREENSHOT ${out} (background run ${bg})`);
} finally {
  await context.close();
}
