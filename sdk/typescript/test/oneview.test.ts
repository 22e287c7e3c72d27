// One view: a sandbox made with roche in direct mode, before roched runs, is the user's
// through roched too: the SDK lists it (with its own owner), gets it, runs in it, copies
// to and from it, and destroys it.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { after, before, test } from "node:test";
import { Roche, SandboxNotFound } from "roche-sandbox";
import { Daemon, env, setup, sleep, teardown } from "./harness.js";

before(setup);
after(teardown);

const roche = (...args: string[]) => execFileSync(env.cli, args, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });

test("list and get through roched reach a sandbox roche made directly before it started", async () => {
  const sid = roche("--direct", "create", "--image", env.image).trim();
  const d = await new Daemon("oneview").start();
  const r = new Roche({ transport: "daemon", socket: d.socket });
  try {
    const listed = (await r.list()).find((s) => s.id === sid);
    assert.ok(listed, `${sid} is not in roched's list`);
    assert.equal(listed.owner, process.env.ROCHE_OWNER);
    const sb = await r.get(sid);
    assert.equal((await sb.exec(["echo", "made directly"])).stdout, "made directly\n");
    await sb.writeFile("/tmp/f.txt", "through roched");
    assert.equal(new TextDecoder().decode(await sb.readFile("/tmp/f.txt")), "through roched");
    await sb.destroy();
    await assert.rejects(r.get(sid), SandboxNotFound);
    // roched removes a destroyed sandbox in the background.
    const until = Date.now() + 30_000;
    while (roche("--direct", "list", "--json").includes(sid)) {
      assert.ok(Date.now() < until, `${sid} outlived its destroy through roched`);
      await sleep(250);
    }
  } finally {
    await r.close();
    await d.stop();
    try {
      roche("--direct", "destroy", sid);
    } catch {
      // gone already, as it should be
    }
  }
});
