// Secrets and learn mode through roched, on real sandboxes.

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { Roche, RocheError } from "roche-sandbox";
import { setup, teardown } from "./harness.js";

before(setup);
after(teardown);

const send = `import os, sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + os.environ.get('API_TOKEN', '')})
try: print(urllib.request.urlopen(req, timeout=10).status)
except urllib.error.HTTPError as e: print(e.code, e.read().decode())`;

test("secrets cross as a placeholder; egressLearn opens nothing and suggests what was needed", async () => {
  const srv = createServer((_, res) => res.end("ok"));
  await new Promise<void>((r) => srv.listen(0, "127.0.0.16", r));
  const addr = `127.0.0.16:${(srv.address() as AddressInfo).port}`;
  const roche = new Roche({ transport: "daemon" });
  const value = "tok-ts-7f3a9c2e41";
  try {
    const sb = await roche.create({ networkAllowlist: [addr], secrets: [{ name: "API_TOKEN", hosts: [addr], value, header: "Authorization" }] });
    try {
      const env = (await sb.exec(["sh", "-c", "echo $API_TOKEN"])).stdout;
      assert.ok(env.startsWith("roche-secret-") && !env.includes(value), env);
      // Plain HTTP: the proxy cannot put the value in, so it refuses the placeholder.
      const r = (await sb.exec(["python3", "-c", send, `http://${addr}/`])).stdout;
      assert.ok(r.startsWith("403") && r.includes("placeholder of secret API_TOKEN"), r);
    } finally {
      await sb.destroy();
    }
    const learner = await roche.create({ egressLearn: true });
    try {
      const r = (await learner.exec(["python3", "-c", send, `http://${addr}/`])).stdout;
      assert.ok(r.startsWith("403"), r);
      assert.deepEqual(await learner.egressSuggest(), [addr]);
    } finally {
      await learner.destroy();
    }
    await assert.rejects(roche.create({ networkAllowlist: [addr], secrets: [{ name: "NOT_STORED_TS", hosts: [addr], fromStore: true }] }),
      (e: unknown) => e instanceof RocheError && /roche secret set NOT_STORED_TS/.test(e.message));
  } finally {
    await roche.close();
    srv.close();
  }
});
