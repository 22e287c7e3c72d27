// The egress decision log and live allowlist through roched, on a real sandbox with an
// allowlist (the CLI transport creates directly and cannot run a proxy).

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";
import { InvalidConfig, Roche } from "roche-sandbox";
import { setup, sleep, teardown } from "./harness.js";

before(setup);
after(teardown);

const get = "import sys, urllib.request, urllib.error\ntry: print(urllib.request.urlopen(sys.argv[1], timeout=10).status)\nexcept urllib.error.HTTPError as e: print(e.code)";

test("egressLog, egressSuggest, egressAllow and egressDeny", async () => {
  const srv = createServer((_, res) => res.end("ok"));
  await new Promise<void>((r) => srv.listen(0, "127.0.0.14", r));
  const addr = `127.0.0.14:${(srv.address() as AddressInfo).port}`;
  const roche = new Roche({ transport: "daemon" });
  const sb = await roche.create({ networkAllowlist: [addr] });
  try {
    const status = async (target: string) => (await sb.exec(["python3", "-c", get, `http://${target}/p`])).stdout.trim();
    assert.equal(await status(addr), "200");
    assert.equal(await status("127.0.0.15:1"), "403");
    let log = await sb.egressLog();
    for (let i = 0; i < 100 && !(log.length === 2 && log[0].done); i++) {
      await sleep(100);
      log = await sb.egressLog();
    }
    assert.equal(log.length, 2);
    assert.deepEqual([log[0].allowed, log[0].method, log[0].rule, log[0].path, log[0].sandbox], [true, "GET", addr, "/p", sb.id]);
    assert.ok(log[0].bytesIn > 0 && log[0].time instanceof Date);
    assert.deepEqual([log[1].allowed, log[1].rule], [false, "127.0.0.15:1"]);
    assert.deepEqual(await sb.egressSuggest(), ["127.0.0.15:1"]);
    assert.deepEqual(await sb.egressDeny(addr), []);
    assert.equal(await status(addr), "403");
    assert.deepEqual(await sb.egressAllow(addr), [addr]);
    assert.equal(await status(addr), "200");
    await assert.rejects(sb.egressDeny("nowhere.example"), InvalidConfig);
  } finally {
    await sb.destroy();
    await roche.close();
    srv.close();
  }
});
