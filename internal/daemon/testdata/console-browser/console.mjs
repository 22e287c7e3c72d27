// The browser half of TestConsoleInABrowser (internal/daemon console_browser_test.go):
// drives roched's console in Debian's headless chromium with puppeteer-core, and prints
// what it saw as one JSON object on stdout, for the Go test to judge. Any step that does
// not happen within its time fails the run (exit 1) with the step's name on stderr.
//
// Input, from the environment: ROCHE_CONSOLE, JSON {
//   chromium, admin_url, viewer_url (login URLs of roche ui), destroy, kept (sandbox ids),
//   artifacts (a directory for screenshots, or "") }.
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import puppeteer from "puppeteer-core";

const cfg = JSON.parse(process.env.ROCHE_CONSOLE);
const STEP_MS = 60_000;
const out = {};

let step = "start";
function at(name) { step = name; }

const row = (id) => `#sandboxes tr[data-id="${id}"]`;
const text = (page, sel) => page.$eval(sel, (e) => e.textContent);

// until polls fn (which returns a value, or something falsy to go on) for STEP_MS.
async function until(what, fn) {
  at(what);
  const deadline = Date.now() + STEP_MS;
  for (;;) {
    const v = await fn().catch(() => null);
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`waiting for ${what}: not within ${STEP_MS / 1000} s`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function shot(page, name) {
  if (!cfg.artifacts) return;
  const dir = join(cfg.artifacts, "console");
  mkdirSync(dir, { recursive: true });
  await page.screenshot({ path: join(dir, name + ".png"), fullPage: true });
}

// figures reads a sandbox row's live CPU, memory and task cells.
async function figures(page, id) {
  return page.$eval(row(id), (r) => ({
    cpu: r.querySelector("td.cpu").textContent,
    memory: r.querySelector("td.memory").textContent,
    processes: r.querySelector("td.processes").textContent,
  }));
}
const live = (f) => f && f.cpu.endsWith(" %") && f.memory.includes("iB /") && /^[1-9][0-9]*$/.test(f.processes);

const userData = mkdtempSync(join(tmpdir(), "roche-console-"));
const browser = await puppeteer.launch({
  executablePath: cfg.chromium,
  headless: true,
  userDataDir: userData,
  // As root, Chromium's own sandbox will not start.
  args: ["--no-sandbox", "--disable-gpu", "--window-size=1280,1000"],
  defaultViewport: { width: 1280, height: 1000 },
});
try {
  // Signed in by roche ui's login URL: the list shows both sandboxes with live figures.
  const page = await browser.newPage();
  page.setDefaultTimeout(STEP_MS);
  at("open the admin login URL");
  await page.goto(cfg.admin_url);
  await page.waitForSelector(row(cfg.destroy));
  await page.waitForSelector(row(cfg.kept));
  out.figures = {};
  for (const id of [cfg.destroy, cfg.kept]) {
    out.figures[id] = await until("live figures of " + id, async () => {
      const f = await figures(page, id);
      return live(f) ? f : null;
    });
  }
  out.who = await text(page, "#who");
  out.location = page.url();
  out.cookies = (await browser.cookies()).map((c) => ({ name: c.name, httpOnly: c.httpOnly, sameSite: c.sameSite, secure: c.secure }));
  await shot(page, "list");

  // The terminal echoes what is typed, and the shell runs it (it computes 6*7).
  at("open the terminal");
  await page.click(row(cfg.destroy) + " button.terminal");
  await page.waitForSelector("#terminal .xterm-helper-textarea");
  await until("the shell's pid", async () => (await text(page, "#terminal-status")).startsWith("shell pid"));
  at("type into the terminal");
  await page.focus("#terminal .xterm-helper-textarea");
  await page.keyboard.type("echo typed-$((6*7))");
  await page.keyboard.press("Enter");
  out.screen = await until("the terminal's echo", async () => {
    const s = await text(page, "#terminal .xterm-rows");
    return s.includes("typed-42") ? s : null;
  });
  await shot(page, "terminal");

  // Destroy from the page (accepting its confirm): it moves to the ended, with why.
  page.on("dialog", (d) => d.accept());
  at("destroy");
  await page.click(row(cfg.destroy) + " button.destroy");
  const ended = `#ended tr[data-ended="${cfg.destroy}"]`;
  await page.waitForSelector(ended);
  out.ended = { reason: await text(page, ended + " td.reason"), detail: await text(page, ended + " td.detail") };
  await shot(page, "ended");

  // The attack: the same login URL in another browser context is refused.
  at("reuse the admin login URL");
  const other = await browser.createBrowserContext();
  const again = await other.newPage();
  await again.goto(cfg.admin_url);
  out.reuse = await until("the reused code's refusal", async () => {
    const e = await text(again, "#login-error");
    return e ? e : null;
  });
  out.reuse_app_hidden = await again.$eval("#app", (e) => e.hidden);
  await shot(again, "reused-code");
  await other.close();

  // A read-only token's login URL: no terminal or destroy on the page, and roched
  // refuses the page's own Destroy and CreatePty when it makes them anyway.
  at("open the read-only login URL");
  const ro = await browser.createBrowserContext();
  const vp = await ro.newPage();
  vp.setDefaultTimeout(STEP_MS);
  await vp.goto(cfg.viewer_url);
  await vp.waitForSelector(row(cfg.kept));
  out.viewer = {
    who: await text(vp, "#who"),
    buttons: await vp.$$eval(row(cfg.kept) + " button", (b) => b.length),
    destroy: await vp.evaluate(`call("Destroy", {ids: [${JSON.stringify(cfg.kept)}]}).then(() => "destroyed", (e) => e.code + ": " + e.message)`),
    pty: await vp.evaluate(`call("CreatePty", {sandboxId: ${JSON.stringify(cfg.kept)}}).then((r) => "pid " + r.pid, (e) => e.code + ": " + e.message)`),
  };
  await shot(vp, "read-only");
  await ro.close();
  process.stdout.write(JSON.stringify(out) + "\n");
} catch (err) {
  process.stderr.write(`step "${step}": ${err.stack || err}\n`);
  process.exitCode = 1;
} finally {
  await browser.close();
  rmSync(userData, { recursive: true, force: true });
}
