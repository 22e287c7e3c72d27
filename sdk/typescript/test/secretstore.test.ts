// roched's secret store through the SDK (setSecret, listSecrets, removeSecret), over both
// transports, against the real roched and CLI: the value never on the CLI's command line,
// rotation reaching a sandbox that took the secret from the store, and a clear error for a
// name not stored.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { InvalidConfig, Roche, SandboxNotFound } from "roche-sandbox";
import { env, setup, teardown, TRANSPORTS } from "./harness.js";

before(setup);
after(teardown);

// The harness's roched is shared by every test of the process: names of their own.
const unique = (prefix: string) => `${prefix}_${randomBytes(4).toString("hex").toUpperCase()}`;

for (const transport of TRANSPORTS) {
  test(`setSecret, listSecrets, removeSecret (${transport})`, async () => {
    const roche = new Roche({ transport });
    try {
      assert.equal(await roche.transport(), transport);
      const name = unique("TS_TOKEN");
      const value = `tok-${randomBytes(8).toString("hex")}`;
      assert.deepEqual(await roche.setSecret(name, value), []); // no sandbox uses it: none rotated
      const got = (await roche.listSecrets()).find((s) => s.name === name);
      assert.ok(got, `${name} listed`);
      assert.deepEqual(got.sandboxes, []);
      assert.ok(got.updated instanceof Date && !isNaN(got.updated.getTime()), String(got.updated));
      assert.ok(!JSON.stringify(await roche.listSecrets()).includes(value));
      await roche.removeSecret(name);
      assert.ok(!(await roche.listSecrets()).some((s) => s.name === name));
      // A name not stored (here: removed): a clear error, the not-found kind.
      await assert.rejects(roche.removeSecret(name),
        (e: unknown) => e instanceof SandboxNotFound && e.message.includes(`secret ${name} is not in roched's secret store`));
      await assert.rejects(roche.setSecret(name, "two\nlines"),
        (e: unknown) => e instanceof InvalidConfig && /control character/.test(e.message) && !e.message.includes("two"));
    } finally {
      await roche.close();
    }
  });
}

test("setSecret through the CLI: the value never on its command line", async () => {
  // The CLI transport runs the program given as `cli`: here a wrapper that records every
  // command line it is given, then runs the real roche with it.
  const dir = mkdtempSync(join(tmpdir(), "roche-ts-argv-"));
  const log = join(dir, "argv.log");
  const wrapper = join(dir, "roche");
  writeFileSync(wrapper, `#!/bin/sh\nprintf "%s\\n" "$*" >> "${log}"\nexec "${env.cli}" "$@"\n`);
  chmodSync(wrapper, 0o700);
  const roche = new Roche({ transport: "cli", cli: wrapper });
  try {
    const name = unique("TS_ARGV");
    const value = `tok-argv-${randomBytes(8).toString("hex")}`;
    await roche.setSecret(name, value);
    assert.ok((await roche.listSecrets()).some((s) => s.name === name));
    await roche.removeSecret(name);
    const lines = readFileSync(log, "utf8").split("\n");
    assert.ok(lines.includes(`secret set ${name}`) && lines.includes("secret list --json"), lines.join(" | ")); // the wrapper saw the calls...
    assert.deepEqual(lines.filter((l) => l.includes(value)), []); // ...never the value
  } finally {
    await roche.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("setSecret rotates a sandbox that took the secret from the store", async () => {
  const name = unique("TS_ROTATE");
  const host = "127.0.0.16:1"; // nothing is sent there: rotation is what is checked
  const roche = new Roche({ transport: "daemon" });
  const cli = new Roche({ transport: "cli" });
  try {
    await roche.setSecret(name, "tok-v1");
    const sb = await roche.create({ networkAllowlist: [host], secrets: [{ name, hosts: [host], fromStore: true }] });
    try {
      assert.deepEqual(await roche.setSecret(name, "tok-v2"), [sb.id]);
      assert.deepEqual(await cli.setSecret(name, "tok-v3"), [sb.id]);
      assert.deepEqual((await cli.listSecrets()).find((s) => s.name === name)?.sandboxes, [sb.id]);
      // That sandbox's secret only: resolves to it, and stores nothing new.
      assert.deepEqual(await roche.setSecret(name, "tok-only-there", { sandbox: sb }), [sb.id]);
      assert.deepEqual(await cli.setSecret(name, "tok-only-there-2", { sandbox: sb.id }), [sb.id]);
    } finally {
      await sb.destroy();
    }
    await roche.removeSecret(name);
  } finally {
    await roche.close();
    await cli.close();
  }
});
