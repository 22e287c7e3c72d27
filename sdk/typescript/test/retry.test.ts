// The SDK's retries of calls safe to repeat (src/retry.ts), against the real roched: a create
// whose answer is lost (its connection cut as the answer comes back, as when a replica dies) is
// asked again with the same idempotency key and makes one sandbox, not two; a roched killed
// outright (SIGKILL) under an exec with an idempotency key, a list and a destroy, and another
// started on the same socket, has each of those calls succeed once it answers, the command run
// once. A call roched refused is not retried.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { ProviderUnavailable, Roche, SandboxNotFound } from "roche-sandbox";
import { Backoff, MAX_DELAY_MS } from "../src/retry.js";
import { Deadline } from "../src/deadline.js";
import { Daemon, env, setup, teardown } from "./harness.js";

before(setup);
after(teardown);

/** Relays a unix socket to roched's, and cuts the connection of the first call to method as
 * its answer comes back: roched has done the call, and the SDK never hears of it. Counts the
 * calls to method it relays; `relayOnly` never cuts. */
class CuttingProxy {
  readonly dir = mkdtempSync(join(tmpdir(), "roche-ts-proxy-"));
  readonly socket = join(this.dir, "proxy.sock");
  calls = 0;
  cut = false;
  private server: net.Server;
  private open = new Set<net.Socket>();

  constructor(target: string, method: string, relayOnly = false) {
    this.cut = relayOnly;
    const marker = Buffer.from(`/roche.v1.SandboxService/${method} `);
    this.server = net.createServer((client) => {
      const upstream = net.connect(target);
      this.open.add(client).add(upstream);
      let asked = false;
      client.on("data", (b: Buffer) => {
        if (b.includes(marker)) {
          this.calls++;
          if (!this.cut) asked = true;
        }
        upstream.write(b);
      });
      upstream.on("data", (b: Buffer) => {
        if (asked && !this.cut) {
          this.cut = true; // the answer is lost
          client.destroy();
          upstream.destroy();
          return;
        }
        client.write(b);
      });
      const end = () => {
        client.destroy();
        upstream.destroy();
        this.open.delete(client);
        this.open.delete(upstream);
      };
      client.on("close", end).on("error", end);
      upstream.on("close", end).on("error", end);
    });
    this.server.listen(this.socket);
  }

  async close(): Promise<void> {
    const closed = new Promise((r) => this.server.close(r));
    for (const s of this.open) s.destroy(); // the SDK's kept connections
    await closed;
    rmSync(this.dir, { recursive: true, force: true });
  }
}

test("a create whose answer is lost is asked again and makes one sandbox", async () => {
  const proxy = new CuttingProxy(env.daemon!.socket, "Create");
  const roche = new Roche({ transport: "daemon", socket: proxy.socket });
  const direct = new Roche({ transport: "daemon" });
  const label = { "sdk-retry-test": randomBytes(6).toString("hex") };
  try {
    const sb = await roche.create({ metadata: label });
    try {
      assert.ok(proxy.cut, "the proxy never cut a Create");
      assert.equal(proxy.calls, 2, "the SDK did not ask again after the lost answer");
      assert.deepEqual((await direct.list({ metadata: label })).map((s) => s.id), [sb.id], "a retried create made another sandbox");
      assert.equal((await sb.exec(["echo", "hi"])).stdout, "hi\n");
    } finally {
      await sb.destroy();
    }
  } finally {
    await roche.close();
    await direct.close();
    await proxy.close();
  }
});

test("a safe call roched refuses is asked once", async () => {
  const proxy = new CuttingProxy(env.daemon!.socket, "Inspect", true);
  const roche = new Roche({ transport: "daemon", socket: proxy.socket });
  try {
    await assert.rejects(roche.get("0123456789ab"), SandboxNotFound);
    assert.equal(proxy.calls, 1);
  } finally {
    await roche.close();
    await proxy.close();
  }
});

test("an exec with an idempotency key, a list and a destroy across roched killed and started again", async () => {
  const first = await new Daemon("retried").start();
  const roche = new Roche({ transport: "daemon", socket: first.socket });
  const started: Daemon[] = [];
  const sb = await roche.create({ leased: false });
  let destroyed = false;
  try {
    // The command marks its start, waits for the test's word (a file) and counts its runs.
    const script = "echo run >> /tmp/runs; touch /tmp/started; while [ ! -e /tmp/go ]; do sleep 0.05; done; wc -l < /tmp/runs";
    const exec = sb.exec(["sh", "-c", script], { timeout: 60, idempotencyKey: "once" });
    exec.catch(() => undefined); // awaited below
    const until = Date.now() + 60_000;
    while ((await sb.exec(["test", "-e", "/tmp/started"])).exitCode !== 0) assert.ok(Date.now() < until, "the command never started");
    const gone = new Promise((r) => first.proc.once("exit", r));
    first.proc.kill("SIGKILL");
    await gone;
    // A call made while nothing answers: retried until the next roched does.
    const listed = roche.list();
    started.push(await new Daemon("retried", {}, [], first.dir).start());
    assert.ok((await listed).some((s) => s.id === sb.id), "the list retried across the restart does not show the sandbox");
    await sb.writeFile("/tmp/go", "");
    const r = await exec;
    assert.deepEqual([r.exitCode, r.stdout], [0, "1\n"], "the exec retried across the restart ran its command again");
    // A destroy across another kill and restart.
    const gone2 = new Promise((r) => started[0].proc.once("exit", r));
    started[0].proc.kill("SIGKILL");
    await gone2;
    const destroy = sb.destroy();
    started.push(await new Daemon("retried", {}, [], first.dir).start());
    await destroy;
    destroyed = true;
    assert.ok(!(await roche.list()).some((s) => s.id === sb.id));
  } finally {
    if (!destroyed && started.length) await sb.destroy().catch(() => undefined);
    await roche.close();
    if (first.proc.exitCode === null && first.proc.signalCode === null) first.proc.kill("SIGKILL");
    for (const d of started.reverse()) await d.stop();
    rmSync(first.dir, { recursive: true, force: true });
  }
});

test("the retry rules: what is retried, jittered growing waits, the deadline's bound", () => {
  const lost = (kind: "refused" | "broke") => new ProviderUnavailable("roched went away", kind);
  const b = new Backoff(new Deadline(undefined));
  assert.equal(b.next(new ProviderUnavailable("roched's own answer"), true), undefined, "an answer was retried");
  assert.equal(b.next(new SandboxNotFound("no sandbox"), true), undefined);
  assert.equal(b.next(lost("refused"), false), undefined, "a roched never reached was waited for");
  const waits = Array.from({ length: 8 }, () => b.next(lost("broke"), false));
  assert.ok(waits.every((w) => w !== undefined && w <= MAX_DELAY_MS), String(waits));
  assert.ok(waits[0]! >= 50 && waits[0]! <= 100 && waits[4]! > waits[0]!, String(waits));
  assert.notEqual(b.next(lost("refused"), true), undefined);
  assert.equal(new Backoff(new Deadline(0.05)).next(lost("broke"), true), undefined, "a wait outlasting the deadline was begun");
});
