// Labels and lifetimes through both transports against the real roched and CLI: metadata
// given at create comes back everywhere and selects sandboxes in list; setTimeout (in
// milliseconds, as E2B's) moves the sandbox's end, and the new end is what ends it.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";
import { InvalidConfig, Roche, SandboxNotFound } from "roche-sandbox";
import { setup, sleep, teardown, TRANSPORTS } from "./harness.js";

before(setup);
after(teardown);

describe("labels and lifetimes", { concurrency: TRANSPORTS.length }, () => {
  for (const transport of TRANSPORTS) {
    describe(`through ${transport}`, () => {
      let roche: Roche;
      before(() => {
        roche = new Roche({ transport });
      });
      after(async () => {
        await roche.close();
      });

      test("metadata round-trips and filters list", async () => {
        const run = randomUUID().slice(0, 8);
        const a = await roche.create({ metadata: { run, user: "alice" } });
        const b = await roche.create({ metadata: { run, user: "bob" } });
        try {
          assert.deepEqual(a.info.metadata, { run, user: "alice" });
          assert.deepEqual((await roche.get(a.id)).info.metadata, { run, user: "alice" });
          const ids = (l: { id: string }[]) => l.map((s) => s.id).sort();
          assert.deepEqual(ids(await roche.list({ metadata: { run } })), [a.id, b.id].sort());
          assert.deepEqual(ids(await roche.list({ metadata: { run, user: "bob" }, state: "running" })), [b.id]);
          assert.deepEqual(ids(await roche.list({ metadata: { run }, state: "paused" })), []);
          await assert.rejects(roche.create({ metadata: { "roche.owner": "someone-else" } }), InvalidConfig);
          await assert.rejects(roche.list({ state: "asleep" as "running" }), InvalidConfig);
        } finally {
          await a.destroy();
          await b.destroy();
        }
      });

      test("setTimeout shortens (the sandbox ends) and extends past the old end", async () => {
        const short = await roche.create({ leased: false });
        const long = await roche.create({ timeoutSecs: 4 });
        try {
          const before = Date.now();
          await short.setTimeout(3000);
          assert.ok(Math.abs(short.info.expiresAt!.getTime() - (before + 3000)) < 2000);
          await long.setTimeout(60_000);
          assert.ok(long.info.expiresAt!.getTime() > Date.now() + 50_000);
          await assert.rejects(long.setTimeout(10), InvalidConfig);
          let gone = false;
          for (const until = Date.now() + 30_000; Date.now() < until; await sleep(250)) {
            try {
              await roche.get(short.id);
            } catch (e) {
              assert.ok(e instanceof SandboxNotFound, String(e));
              gone = true;
              break;
            }
          }
          assert.ok(gone, `sandbox ${short.id} outlived its shortened lifetime by 27 s`);
          await sleep(Math.max(0, before + 4000 - Date.now()) + 4000); // past long's old end, with margin
          assert.equal((await long.exec(["echo", "alive"])).stdout, "alive\n");
        } finally {
          await short.destroy();
          await long.destroy();
        }
      });
    });
  }
});
