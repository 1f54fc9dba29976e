// What the playground's browser scripts share: Debian's Chromium through
// playwright-core, and the log lines their Go tests read ("-- step",
// "SCREENSHOT path", "PASS name").
import { chromium } from "playwright-core";

export const log = (...a) => console.log(...a);
export const step = (s) => log(`-- ${s}`);

const launchArgs = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

// openBrowser launches Chromium ($CHROMIUM, default /usr/bin/chromium) and
// returns a browser context with the given options (viewport, timezoneId,
// …), whose waits give up after timeout ms. The profile is the folder
// $CHROMIUM_USER_DATA_DIR (a fresh one the Go test made); without it,
// Playwright makes a temporary one. Closing the context ends the browser.
export async function openBrowser({ timeout = 30_000, ...options } = {}) {
  const executablePath = process.env.CHROMIUM ?? "/usr/bin/chromium";
  const userDataDir = process.env.CHROMIUM_USER_DATA_DIR;
  let context;
  if (userDataDir) {
    context = await chromium.launchPersistentContext(userDataDir, { executablePath, args: launchArgs, ...options });
  } else {
    const browser = await chromium.launch({ executablePath, args: launchArgs });
    context = await browser.newContext(options);
    context.on("close", () => browser.close());
  }
  context.setDefaultTimeout(timeout);
  return context;
}
