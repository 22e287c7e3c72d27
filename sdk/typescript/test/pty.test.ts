// PTY sessions (sandbox.pty) against a real sandbox through the real roched; through the
// CLI transport they are refused with the way out.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { InvalidConfig, Roche, SandboxNotFound, Unsupported, type Sandbox } from "roche-sandbox";
import { setup, sleep, teardown } from "./harness.js";

before(setup);
after(teardown);

/** Waits until text shows on the screen after position from; returns where it ends. */
async function waitFor(screen: () => string, want: string, from = 0): Promise<number> {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    const i = screen().indexOf(want, from);
    if (i >= 0) return i + want.length;
    await sleep(20);
  }
  assert.fail(`${JSON.stringify(want)} never appeared on the terminal; it shows ${JSON.stringify(screen())}`);
}

describe("sandbox.pty through roched", () => {
  let roche: Roche;
  let sb: Sandbox;
  before(async () => {
    roche = new Roche({ transport: "daemon" });
    sb = await roche.create();
  });
  after(async () => {
    await sb.destroy();
    await roche.close();
  });

  test("a shell: typing, size and resize, Ctrl-C, not root, exit status", async () => {
    let text = "";
    const decoder = new TextDecoder();
    const term = await sb.pty.create({ cols: 100, rows: 30, onData: (d) => { text += decoder.decode(d, { stream: true }); } });
    const screen = () => text;
    assert.ok(term.pid > 0);
    await term.sendInput("stty size; id -u\n");
    let at = await waitFor(screen, "30 100\r\n");
    assert.notEqual(text.slice(at).split("\r\n")[0].trim(), "0", "the terminal runs as root");
    await term.resize(120, 40);
    await term.sendInput("stty size\n");
    at = await waitFor(screen, "40 120\r\n", at);
    await term.sendInput("sleep 100\n");
    await sleep(300);
    const started = Date.now();
    await term.sendInput("\x03");
    await term.sendInput("echo after-int''errupt\n");
    await waitFor(screen, "after-interrupt\r\n", at);
    assert.ok(Date.now() - started < 10_000);
    await term.sendInput("exit 3\n");
    assert.equal((await term.wait({ timeout: 30 })).exitCode, 3);
  });

  test("a command of the caller's; kill; refusals", async () => {
    const term = await sb.pty.create({ cmd: ["python3", "-c", "import sys, time; print(sys.stdin.isatty()); time.sleep(100)"] });
    const out = () => Buffer.concat(term.output).toString();
    await waitFor(out, "True");
    await term.kill();
    assert.equal((await term.wait({ timeout: 30 })).exitCode, 137);
    await assert.rejects(sb.pty.sendInput(term.pid, "x"), SandboxNotFound);
    await assert.rejects(sb.pty.create({ cols: 0 }), InvalidConfig);
  });
});

describe("sandbox.pty through the CLI", () => {
  test("is refused with the way out", async () => {
    const roche = new Roche({ transport: "cli" });
    const sb = await roche.create();
    try {
      await assert.rejects(sb.pty.create(), (e: unknown) => e instanceof Unsupported && /roche shell/.test(String(e)));
    } finally {
      await sb.destroy();
      await roche.close();
    }
  });
});
