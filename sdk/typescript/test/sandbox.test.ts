// The API through both transports against the real roched and CLI: exec, stdin, env, exit
// codes, timeouts, truncation, streaming, files, destroy and asyncDispose.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { InvalidConfig, PermissionDenied, ResourceExhausted, Roche, SandboxNotFound, type Sandbox } from "roche-sandbox";
import { containers, env, processesIn, running, setup, sleep, teardown, TRANSPORTS } from "./harness.js";

before(setup);
after(teardown);

// The two transports' suites run side by side (each on its own sandbox), their tests in order.
describe("the API", { concurrency: TRANSPORTS.length }, () => {
for (const transport of TRANSPORTS) {
  describe(`through ${transport}`, () => {
    let roche: Roche;
    let sb: Sandbox;
    before(async () => {
      roche = new Roche({ transport });
      sb = await roche.create({ env: { GREETING: "hello" }, workdir: "/tmp" });
      assert.equal(await roche.transport(), transport);
    });
    after(async () => {
      await sb.destroy();
      await roche.close();
    });

    test("exec: stdout, stderr, exit code, env, workdir, stdin", async () => {
      const r = await sb.exec(["sh", "-c", 'echo "$GREETING $EXTRA from $(pwd)"; echo oops >&2; exit 3'], { env: { EXTRA: "world" } });
      assert.equal(r.stdout, "hello world from /tmp\n");
      assert.equal(r.stderr, "oops\n");
      assert.equal(r.exitCode, 3);
      assert.equal(r.ok, false);
      assert.equal(r.timedOut, false);
      const ok = await sb.exec(["python3", "-c", "import sys; print(sys.stdin.read()[::-1])"], { stdin: "abc", workdir: "/" });
      assert.deepEqual([ok.stdout, ok.exitCode, ok.ok], ["cba\n", 0, true]);
      const bytes = await sb.exec(["wc", "-c"], { stdin: new Uint8Array(100_000) });
      assert.equal(bytes.stdout.trim(), "100000");
    });

    test("the secure defaults hold: no network, read-only root, not root", async () => {
      const r = await sb.exec(["sh", "-c", "cat /sys/class/net/*/operstate | wc -l; touch /planted; id -u"]);
      const [ifaces, , uid] = r.stdout.split("\n");
      assert.equal(ifaces.trim(), "1"); // lo only
      assert.match(r.stderr, /Read-only file system/);
      assert.notEqual(uid, "0");
    });

    test("a command past its timeout is killed and flagged, not an error", async () => {
      const started = Date.now();
      const r = await sb.exec(["sleep", "30"], { timeout: 1 });
      assert.equal(r.timedOut, true);
      assert.equal(r.exitCode, 137);
      assert.ok(Date.now() - started < 15_000);
    });

    test("output past 10 MiB is truncated and flagged", async () => {
      const r = await sb.exec(["python3", "-c", "import sys; sys.stdout.write('x' * (11 << 20))"]);
      assert.equal(r.truncated, true);
      assert.ok(r.stdout.length <= 10 << 20 && r.stdout.length > 9 << 20, String(r.stdout.length));
    });

    test("execStream yields output as it is produced, in order, then the result", async () => {
      const s = sb.execStream(["sh", "-c", "echo one; sleep 3; echo two >&2; sleep 0.3; echo three; exit 4"]);
      const seen: Array<[string, string, number]> = [];
      for await (const ev of s) seen.push([ev.stream, ev.text, Date.now()]);
      const ended = Date.now();
      assert.deepEqual(seen.map(([st, t]) => [st, t]), [["stdout", "one\n"], ["stderr", "two\n"], ["stdout", "three\n"]]);
      // The command sleeps 3 s after its first line: that line came well before its end.
      assert.ok(ended - seen[0][2] >= 1500, `the first line came ${ended - seen[0][2]} ms before the end`);
      assert.equal(s.result?.exitCode, 4);
      assert.equal(s.result?.stdout, "one\nthree\n");
      const waited = await sb.execStream(["sh", "-c", "echo x"]).wait();
      assert.equal(waited.stdout, "x\n");
    });

    test("leaving execStream early kills the command", async () => {
      for await (const ev of sb.execStream(["sh", "-c", "echo ready; exec sleep 77"])) {
        assert.equal(ev.text, "ready\n");
        break;
      }
      let left = processesIn(sb.id).filter((p) => p.includes("sleep 77"));
      for (let i = 0; i < 40 && left.length; i++) {
        await sleep(250);
        left = processesIn(sb.id).filter((p) => p.includes("sleep 77"));
      }
      assert.deepEqual(left, []);
    });

    test("an aborted exec stops waiting and kills the command", async () => {
      const started = Date.now();
      await assert.rejects(sb.exec(["sh", "-c", "exec sleep 78"], { signal: AbortSignal.timeout(1000) }), (e: Error) => e.name === "TimeoutError");
      assert.ok(Date.now() - started < 15_000);
      let left = processesIn(sb.id).filter((p) => p.includes("sleep 78"));
      for (let i = 0; i < 40 && left.length; i++) {
        await sleep(250);
        left = processesIn(sb.id).filter((p) => p.includes("sleep 78"));
      }
      assert.deepEqual(left, []);
    });

    test("files: write and read back, binary-safe, parents made, mode kept", async () => {
      const data = new Uint8Array(256 * 300).map((_, i) => i % 256);
      await sb.writeFile("/tmp/a/b/data.bin", data, { mode: 0o750 });
      assert.deepEqual(Buffer.from(await sb.readFile("/tmp/a/b/data.bin")), Buffer.from(data));
      const st = await sb.exec(["stat", "-c", "%a %s", "/tmp/a/b/data.bin"]);
      assert.equal(st.stdout.trim(), `750 ${data.length}`);
      await sb.writeFile("/tmp/a/b/data.bin", "replaced");
      assert.equal(Buffer.from(await sb.readFile("/tmp/a/b/data.bin")).toString(), "replaced");
      await sb.writeFile(`/tmp/${"n".repeat(150)}`, "long name");
      assert.equal((await sb.exec(["cat", `/tmp/${"n".repeat(150)}`])).stdout, "long name");
    });

    test("files: caps, directories, symlinks and the read-only root", async () => {
      await sb.writeFile("/tmp/big", new Uint8Array(5000));
      await assert.rejects(sb.readFile("/tmp/big", { maxBytes: 4096 }), ResourceExhausted);
      await assert.rejects(sb.readFile("/tmp/a"), InvalidConfig);
      await sb.exec(["ln", "-s", "/etc/passwd", "/tmp/link"]);
      await assert.rejects(sb.readFile("/tmp/link"), PermissionDenied);
      await assert.rejects(sb.writeFile("/etc/planted", "x"), PermissionDenied);
      await assert.rejects(sb.writeFile("relative.txt", "x"), /absolute path/);
      await assert.rejects(sb.readFile("/tmp/nonexistent"), SandboxNotFound);
    });

    test("destroy and asyncDispose remove the sandbox; destroy again is not an error", async () => {
      const other = await roche.create({ leased: false });
      assert.ok(running(other.id));
      await other[Symbol.asyncDispose]();
      await assert.rejects(other.exec(["true"]), SandboxNotFound);
      await other.destroy();
      for (let i = 0; i < 40 && running(other.id); i++) await sleep(250);
      assert.equal(running(other.id), false);
    });

    test("exec has a receipt; inspect says why a sandbox ended (through roched)", async () => {
      const r = await sb.exec(["python3", "-c", "b = b'x' * (100 << 20); print(len(b))"]);
      assert.ok(r.ok && r.receipt, JSON.stringify(r));
      assert.ok(r.receipt.peakMemoryBytes >= 100 << 20, `peak ${r.receipt.peakMemoryBytes}`);
      assert.ok(r.receipt.cpuTime > 0);
      assert.deepEqual([r.receipt.end, r.receipt.evidence], ["", ""]);
      const t = await sb.exec(["sleep", "30"], { timeout: 1 });
      assert.ok(t.timedOut && t.receipt, JSON.stringify(t));
      assert.equal(t.receipt.end, "command_timeout");
      assert.match(t.receipt.evidence, /timeout/);
      const other = await roche.create({ leased: false });
      assert.equal((await roche.inspect(other.id)).end, undefined);
      await other.destroy();
      if (transport === "daemon") {
        const info = await roche.inspect(other.id);
        assert.equal(info.state, "exited");
        assert.equal(info.end?.kind, "destroyed");
        assert.match(info.end?.by ?? "", /^tenant:/);
      } else {
        // Direct mode keeps no ends, and says so.
        await assert.rejects(roche.inspect(other.id), (e: Error) => e instanceof SandboxNotFound && /direct mode/.test(e.message));
      }
    });

    test("get and list find a sandbox", async () => {
      const got = await roche.get(sb.id);
      assert.equal(got.id, sb.id);
      assert.equal(got.info.image, env.image);
      assert.ok((await roche.list()).some((s) => s.id === sb.id));
      assert.ok(containers().length >= 1);
    });
  });
}
});
