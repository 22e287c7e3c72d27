// Memory snapshots through the SDK, against a real qemu microVM (the vm provider) served by
// the real roched and the roche CLI: a code context's variable survives pause({ toDisk: true })
// and roche.resume(id), and fork(2) makes two sandboxes whose state diverges from each
// other's and from their origin's. One VM, made by the CLI transport in direct mode (which
// roched also serves, the same user's), shared by both transports and every step (a boot is
// ~2.6 s under TCG); the forks are restored, not booted. docker refuses each call in one line.
// Needs QEMU and a kernel as the Go tests' testenv.QEMU does (the README's test command).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { InvalidConfig, Roche, SandboxNotFound, Unsupported, type Sandbox } from "roche-sandbox";
import { env, setup, teardown, TRANSPORTS } from "./harness.js";

before(setup);
after(teardown);

async function printed(sb: Sandbox, code: string): Promise<string> {
  const ex = await sb.runCode(code);
  if (ex.error) throw new Error(`${code} in ${sb.id} raised ${ex.error.name}: ${ex.error.value}`);
  return ex.logs.stdout.join("").trim();
}

test("pause to disk, resume and fork a qemu sandbox, through the CLI and roched", async () => {
  const cli = new Roche({ provider: "qemu", transport: "cli" });
  const daemon = new Roche({ provider: "qemu", transport: "daemon" });
  // Not leased: a sandbox paused to disk is one meant to outlive its maker.
  const sb = await cli.create({ image: env.image, leased: false });
  const forks: Sandbox[] = [];
  try {
    await printed(sb, "x = 41");

    // Forks, through the CLI: each starts from the origin's x and goes its own way.
    forks.push(...(await sb.fork(2)));
    const ids = forks.map((f) => f.id);
    assert.equal(new Set([...ids, sb.id]).size, 3, `fork(2) of ${sb.id} made ${ids}, want two new ids`);
    assert.ok(forks.every((f) => f.info.state === "running"), JSON.stringify(forks.map((f) => f.info)));
    assert.equal(await printed(forks[0], "x += 1; print(x)"), "42");
    assert.equal(await printed(forks[1], "x += 100; print(x)"), "141");
    assert.equal(await printed(forks[0], "print(x)"), "42", "the second fork's change reached the first");
    assert.equal(await printed(sb, "print(x)"), "41", "a fork's change reached its origin");

    // Pause to disk and resume, through roched.
    await (await daemon.get(sb.id)).pause({ toDisk: true });
    assert.equal((await daemon.get(sb.id)).info.state, "paused");
    const back = await daemon.resume(sb.id);
    assert.deepEqual([back.id, back.info.state], [sb.id, "running"]);
    assert.equal(await printed(back, "print(x + 1)"), "42", "after pause to disk and resume through roched");

    // And through the CLI, a fork's own state; a fork through roched.
    await forks[1].pause({ toDisk: true });
    assert.equal((await cli.get(forks[1].id)).info.state, "paused");
    assert.equal(await printed(await cli.resume(forks[1].id), "print(x + 1)"), "142");
    const [third] = await back.fork(1);
    forks.push(third);
    assert.equal(await printed(third, "print(x * 2)"), "82");

    const listed = new Set((await daemon.list()).map((s) => s.id));
    assert.ok(forks.every((f) => listed.has(f.id)), `the forks are not all listed: ${[...listed]}`);
    for (const f of forks.splice(0)) await f.destroy();
    const after = new Set((await daemon.list()).map((s) => s.id));
    assert.ok(!ids.some((id) => after.has(id)) && !after.has(third.id), `destroyed forks still listed: ${[...after]}`);
    await assert.rejects(daemon.resume(third.id), SandboxNotFound);
    for (const bad of [0, 65, 1.5]) await assert.rejects(sb.fork(bad), InvalidConfig);
  } finally {
    for (const f of forks) await f.destroy();
    await sb.destroy();
    await cli.close();
    await daemon.close();
  }
});

test("docker refuses pause to disk, resume and fork in one line (daemon and cli)", async () => {
  for (const transport of TRANSPORTS) {
    const roche = new Roche({ transport });
    const sb = await roche.create();
    try {
      for (const call of [() => sb.pause({ toDisk: true }), () => sb.fork(1), () => roche.resume(sb.id)]) {
        const err = await call().then(() => undefined, (e: unknown) => e);
        assert.ok(err instanceof Unsupported, `${transport}: ${err}`);
        assert.ok(!err.message.includes("\n") && err.message.includes("qemu"), err.message);
      }
      assert.equal((await sb.exec(["true"])).exitCode, 0, "the refused sandbox no longer runs commands");
      assert.equal((await roche.get(sb.id)).info.state, "running");
    } finally {
      await sb.destroy();
      await roche.close();
    }
  }
});
