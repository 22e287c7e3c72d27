// Durable commands (sandbox.commands) against real sandboxes, through the real roched and
// through the CLI transport: foreground and background runs, offsets, the window's refusal,
// stdin, signals, tags, idempotency keys, and a handle that outlives a roched killed with
// SIGKILL and started again.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { CommandHandle, InvalidConfig, OutputGone, Roche, SandboxNotFound, type Sandbox } from "roche-sandbox";
import { Daemon, setup, sleep, teardown, TRANSPORTS } from "./harness.js";

before(setup);
after(teardown);

const counter = (n: number) => `i=1; while [ $i -le ${n} ]; do echo "line $i"; i=$((i+1)); sleep 0.1; done; echo bye >&2; exit 3`;
const lines = (n: number) => Array.from({ length: n }, (_, i) => `line ${i + 1}\n`).join("");

for (const transport of TRANSPORTS) {
  describe(`sandbox.commands through ${transport}`, () => {
    let roche: Roche;
    let sb: Sandbox;
    before(async () => {
      roche = new Roche({ transport });
      sb = await roche.create();
    });
    after(async () => {
      await sb.destroy();
      await roche.close();
    });

    test("foreground: a shell line, an argv, cwd and envs, a missing program, a timeout", async () => {
      const seen: string[] = [];
      let r = await sb.commands.run("echo hi; echo err >&2; exit 3", { onStdout: (t) => { seen.push(t); } });
      assert.deepEqual([r.stdout, r.stderr, r.exitCode, r.unknown, r.ok, r.error], ["hi\n", "err\n", 3, "", false, "exit status 3"]);
      assert.equal(seen.join(""), "hi\n");
      r = await sb.commands.run(["sh", "-c", 'echo "$WHO $(pwd)"'], { cwd: "/tmp", envs: { WHO: "me" } });
      assert.deepEqual([r.stdout, r.exitCode, r.ok], ["me /tmp\n", 0, true]);
      r = await sb.commands.run(["no-such-program"]);
      assert.equal(r.exitCode, 127);
      assert.match(r.stderr, /command not found/);
      r = await sb.commands.run("sleep 30", { timeoutMs: 1000 });
      assert.ok(r.timedOut, JSON.stringify(r));
    });

    test("background: a handle, iteration with offsets, the list, the end", async () => {
      const h = await sb.commands.run(counter(5), { background: true, tag: "count" });
      assert.ok(h instanceof CommandHandle && h.pid > 0);
      const listed = (await sb.commands.list()).find((c) => c.pid === h.pid);
      assert.equal(listed?.tag, "count");
      let got = "";
      let next = 0;
      for await (const ev of h) {
        if (ev.stream !== "stdout") continue;
        assert.equal(ev.offset, next, "a piece did not follow the one before");
        got += ev.text;
        next = ev.offset! + ev.data.length;
      }
      assert.equal(got, lines(5));
      assert.deepEqual([h.result?.exitCode, h.result?.stderr], [3, "bye\n"]);
      const ended = (await sb.commands.list()).find((c) => c.pid === h.pid)!;
      assert.deepEqual([ended.running, ended.exitCode, ended.stdoutBytes], [false, 3, lines(5).length]);
    });

    test("stdin, kill by tag, signals by name", async () => {
      let h = await sb.commands.run("while read l; do echo got:$l; done; echo eof", { background: true, stdin: true });
      await h.sendStdin("a\n");
      await sb.commands.sendStdin(h.pid, new TextEncoder().encode("b\n"));
      await h.closeStdin();
      assert.equal((await h.wait()).stdout, "got:a\ngot:b\neof\n");
      let out = "";
      h = await sb.commands.run("echo ready; sleep 300", { background: true, tag: "sleeper", onStdout: (t) => { out += t; } });
      for (let i = 0; i < 300 && !out.includes("ready"); i++) await sleep(50);
      assert.equal(await sb.commands.kill({ tag: "sleeper" }), true);
      const r = await h.wait({ timeoutMs: 30_000 });
      assert.deepEqual([r.signal, r.exitCode], [9, 137]);
      assert.equal(await sb.commands.kill(h.pid), false, "a second kill found the command running");
      h = await sb.commands.run("trap 'echo term; exit 4' TERM; echo set; while :; do sleep 0.1; done", { background: true });
      for await (const ev of h) if (ev.text.includes("set")) break;
      await sb.commands.signal(h.pid, "TERM");
      const again = await sb.commands.connect(h.pid);
      assert.deepEqual([(await again.wait()).exitCode, again.stdout], [4, "set\nterm\n"]);
    });

    test("connect from offsets; the window's refusal names the first offset kept", async () => {
      const h = await sb.commands.run(counter(3), { background: true });
      await h.wait();
      const r = await (await sb.commands.connect(h.pid, { stdoutOffset: "line 1\n".length })).wait();
      assert.deepEqual([r.stdout, r.stderr, r.exitCode], ["line 2\nline 3\n", "bye\n", 3]);
      const big = await sb.commands.run("head -c 5000 /dev/zero", { background: true, window: 1000 });
      for (let i = 0; i < 300 && (await sb.commands.list()).find((c) => c.pid === big.pid)?.running; i++) await sleep(50);
      await assert.rejects((await sb.commands.connect(big.pid)).wait(), (e: Error) => e instanceof OutputGone && /4000/.test(e.message));
      const info = (await sb.commands.list()).find((c) => c.pid === big.pid)!;
      assert.deepEqual([info.firstStdout, info.stdoutBytes, info.window], [4000, 5000, 1000]);
      assert.equal((await (await sb.commands.connect(big.pid, { stdoutOffset: 4000 })).wait()).stdout.length, 1000);
      await assert.rejects((await sb.commands.connect(999999)).wait(), SandboxNotFound);
      await assert.rejects(sb.commands.connect(0), InvalidConfig);
      await assert.rejects(sb.commands.run("true", { window: 2 ** 40 }), InvalidConfig);
    });

    test("one idempotency key, one run", async () => {
      const script = "echo x >> /tmp/runs; wc -l < /tmp/runs";
      const first = await sb.commands.run(script, { idempotencyKey: "once" });
      const again = await sb.commands.run(script, { idempotencyKey: "once" });
      assert.deepEqual([first.stdout, again.stdout], ["1\n", "1\n"], "a retried run started its command twice");
    });
  });
}

describe("a handle across a roched killed and started again", () => {
  test("reconnects from its offsets: every line once, the real exit code", async () => {
    const d = await new Daemon("restarted").start();
    const roche = new Roche({ transport: "daemon", socket: d.socket });
    const sb = await roche.create({ leased: false });
    let restarted: Daemon | undefined;
    try {
      let got = "";
      const h = await sb.commands.run(counter(30), { background: true, onStdout: (t) => { got += t; } });
      for (let i = 0; i < 300 && !got; i++) await sleep(20);
      assert.ok(got, "no output came");
      d.proc.kill("SIGKILL");
      await new Promise((r) => d.proc.once("exit", r));
      await sleep(500); // the command goes on meanwhile, unread
      restarted = await new Daemon("restarted", {}, [], d.dir).start();
      const r = await h.wait({ timeoutMs: 90_000 });
      assert.deepEqual([r.exitCode, got, r.stdout], [3, lines(30), lines(30)]);
    } finally {
      if (restarted) {
        await sb.destroy();
        await restarted.stop();
      } else {
        await d.stop();
      }
      await roche.close();
    }
  });
});
