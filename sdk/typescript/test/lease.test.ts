// Leases: a sandbox the SDK creates goes within seconds of its process's end, however it ends,
// while one created with leased: false lives on; and what holds it does not keep Node running.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Roche } from "roche-sandbox";
import { running, SDK, setup, sleep, teardown, TRANSPORTS } from "./harness.js";

before(setup);
after(teardown);

const CHILD = `
import { Roche } from ${JSON.stringify(join(SDK, "dist", "src", "index.js"))};
const roche = new Roche({ transport: process.argv[2] });
const leased = await roche.create();
const kept = await roche.create({ leased: false });
console.log(JSON.stringify({ leased: leased.id, kept: kept.id }));
if (process.argv[3] === "wait") setInterval(() => {}, 1000);
`;

async function child(transport: string, mode: "wait" | "exit"): Promise<{ ids: { leased: string; kept: string }; kill: () => void; exited: Promise<number> }> {
  const dir = mkdtempSync(join(tmpdir(), "roche-lease-"));
  writeFileSync(join(dir, "child.mjs"), CHILD);
  const p = spawn(process.execPath, [join(dir, "child.mjs"), transport, mode], { stdio: ["ignore", "pipe", "inherit"] });
  const exited = new Promise<number>((r) => p.once("exit", (c) => r(c ?? -1)));
  void exited.then(() => rmSync(dir, { recursive: true, force: true }));
  const line = await new Promise<string>((resolve, reject) => {
    let buf = "";
    p.stdout.on("data", (b: Buffer) => {
      buf += b;
      if (buf.includes("\n")) resolve(buf.split("\n")[0]);
    });
    p.once("exit", () => reject(new Error(`the child exited before creating its sandboxes: ${buf}`)));
  });
  return { ids: JSON.parse(line), kill: () => p.kill("SIGKILL"), exited };
}

async function goneWithin(id: string, ms: number): Promise<number> {
  const started = Date.now();
  while (running(id)) {
    if (Date.now() - started > ms) assert.fail(`sandbox ${id.slice(0, 12)} outlived its process by more than ${ms} ms`);
    await sleep(250);
  }
  return Date.now() - started;
}

// Both transports at once: each case waits out a lease's grace.
async function bothTransports(fn: (transport: "daemon" | "cli") => Promise<void>): Promise<void> {
  await Promise.all(TRANSPORTS.map(fn));
}

test("a process killed with SIGKILL takes its leased sandbox along, not an unleased one (daemon and cli)", () =>
  bothTransports(async (transport) => {
    const c = await child(transport, "wait");
    assert.ok(running(c.ids.leased) && running(c.ids.kept));
    c.kill();
    await c.exited;
    const took = await goneWithin(c.ids.leased, 15_000);
    console.log(`# ${transport}: leased sandbox gone ${took} ms after SIGKILL`);
    await sleep(4000); // past the lease's grace: the unleased one is still there
    assert.ok(running(c.ids.kept), `${transport}: the sandbox created with leased: false went with its process`);
    const roche = new Roche({ transport });
    await (await roche.get(c.ids.kept)).destroy();
    await goneWithin(c.ids.kept, 20_000);
  }));

test("holding a sandbox does not keep Node running, and it goes at the exit (daemon and cli)", () =>
  bothTransports(async (transport) => {
    const c = await child(transport, "exit");
    const rc = await Promise.race([c.exited, sleep(10_000).then(() => "still running")]);
    if (rc === "still running") c.kill();
    assert.equal(rc, 0, `${transport}: the process did not exit by itself: a hold kept its event loop alive`);
    await goneWithin(c.ids.leased, 15_000);
    const roche = new Roche({ transport });
    await (await roche.get(c.ids.kept)).destroy();
    await goneWithin(c.ids.kept, 20_000);
  }));

test("close() lets go of the leased sandboxes", async () => {
  const roche = new Roche({ transport: "daemon" });
  const sb = await roche.create();
  await roche.close();
  await goneWithin(sb.id, 15_000);
});
