// roched over TLS, with the local CA `roche daemon start --tls` makes: the SDK verifies its
// certificate (ca, or ROCHE_CA_FILE) and refuses it in one line without the CA or with
// another one, never falling back to the CLI.

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { InvalidConfig, ProviderUnavailable, Roche, TLSFailure } from "roche-sandbox";
import { env, setup, teardown } from "./harness.js";

before(setup);
after(teardown);

interface TLSDaemon {
  address: string;
  ca: string;
  token: string;
  socket: string;
  stop(): void;
}

function freePort(): Promise<number> {
  return new Promise((res) => {
    const srv = net.createServer().listen(0, "127.0.0.1", () => {
      const p = (srv.address() as net.AddressInfo).port;
      srv.close(() => res(p));
    });
  });
}

/** A roched over TLS on a free port, started by roche daemon start --tls. */
async function startTLS(name: string, clientCA = false): Promise<TLSDaemon> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), `roche-ts-tls-${name}-`));
  const socket = join(dir, "r.sock");
  const token = randomBytes(16).toString("hex");
  writeFileSync(join(dir, "token"), token, { mode: 0o600 });
  const out = execFileSync(
    env.cli,
    ["--socket", socket, "daemon", "start", "--roched", env.roched, "--listen", `tcp://127.0.0.1:${port}`, "--tls",
      "--token-file", join(dir, "token"), ...(clientCA ? ["--client-ca", join(dir, "tls", "ca.pem")] : []),
      "--", "--providers", "docker"],
    { encoding: "utf8", timeout: 120_000 },
  );
  const m = /ROCHE_ADDRESS=(\S+) ROCHE_CA_FILE=(\S+)/.exec(out);
  const stop = () => {
    execFileSync(env.cli, ["--socket", socket, "daemon", "stop"], { encoding: "utf8", timeout: 120_000 });
    rmSync(dir, { recursive: true, force: true });
  };
  if (!m) {
    stop();
    assert.fail(`daemon start --tls printed no ROCHE_ADDRESS and ROCHE_CA_FILE: ${out}`);
  }
  return { address: m[1], ca: m[2], token, socket, stop };
}

test("roched over TLS: verified with ca or ROCHE_CA_FILE; another CA or none is refused", async () => {
  const d = await startTLS("a");
  let other: TLSDaemon | undefined;
  const saved = process.env.ROCHE_CA_FILE;
  try {
    assert.match(d.address, /^https:\/\/127\.0\.0\.1:\d+$/);
    delete process.env.ROCHE_CA_FILE;
    const r = new Roche({ transport: "daemon", address: d.address, token: d.token, ca: d.ca });
    const sb = await r.create({ image: env.image });
    try {
      assert.equal((await sb.exec(["echo", "over tls"])).stdout, "over tls\n");
      assert.match(sb.info.owner, /\/default$/);
    } finally {
      await sb.destroy();
      await r.close();
    }
    process.env.ROCHE_CA_FILE = d.ca;
    const byEnv = new Roche({ transport: "daemon", address: d.address, token: d.token });
    assert.deepEqual(await byEnv.list(), []);
    await byEnv.close();
    delete process.env.ROCHE_CA_FILE;

    other = await startTLS("b");
    for (const [what, ca] of [["another CA", other.ca], ["Node's CAs", undefined]] as const) {
      for (const transport of ["daemon", "auto"] as const) {
        const bad = new Roche({ transport, address: d.address, token: d.token, ca });
        await assert.rejects(bad.list(), (e: unknown) => {
          assert.ok(e instanceof TLSFailure && e instanceof ProviderUnavailable, `${what}, ${transport}: ${e}`);
          assert.match(e.message, /does not trust/);
          assert.match(e.message, /ROCHE_CA_FILE/);
          assert.doesNotMatch(e.message, /\n/);
          return true;
        });
        await bad.close();
      }
    }
    assert.throws(
      () => new Roche({ address: d.address.replace("https:", "http:"), token: d.token, ca: d.ca }),
      (e: unknown) => e instanceof InvalidConfig && /use https:\/\//.test(e.message),
    );
  } finally {
    if (saved === undefined) delete process.env.ROCHE_CA_FILE;
    else process.env.ROCHE_CA_FILE = saved;
    other?.stop();
    d.stop();
  }
});

/** A client certificate for tenant from the local CA of d (roche daemon client-cert). */
function clientCert(d: TLSDaemon, tenant: string, out: string): { cert: string; key: string } {
  execFileSync(env.cli, ["--socket", d.socket, "daemon", "client-cert", tenant, "--out", out], { encoding: "utf8", timeout: 60_000 });
  return { cert: join(out, `${tenant}-client.pem`), key: join(out, `${tenant}-client-key.pem`) };
}

test("roched with --client-ca: a client certificate is the tenant; none, or another CA's, is refused", async () => {
  const d = await startTLS("c", true);
  const other = await startTLS("d");
  const out = mkdtempSync(join(tmpdir(), "roche-ts-tls-client-"));
  const saved = process.env.ROCHE_CA_FILE;
  try {
    delete process.env.ROCHE_CA_FILE;
    const acme = clientCert(d, "acme", join(out, "right"));
    const wrong = clientCert(other, "acme", join(out, "wrong"));
    const r = new Roche({ transport: "daemon", address: d.address, ca: d.ca, clientCert: acme.cert, clientKey: acme.key, token: "" });
    const sb = await r.create({ image: env.image });
    try {
      assert.equal((await sb.exec(["echo", "by certificate"])).stdout, "by certificate\n");
      assert.match(sb.info.owner, /\/acme$/);
    } finally {
      await sb.destroy();
      await r.close();
    }
    for (const [what, opts] of [
      ["no client certificate", { token: d.token }],
      ["one from another CA", { clientCert: wrong.cert, clientKey: wrong.key }],
    ] as const) {
      const bad = new Roche({ transport: "daemon", address: d.address, ca: d.ca, ...opts });
      await assert.rejects(bad.list(), (e: unknown) => {
        assert.ok(e instanceof TLSFailure, `${what}: ${e}`);
        assert.match(e.message, /clientCert/);
        assert.doesNotMatch(e.message, /\n/);
        return true;
      });
      await bad.close();
    }
  } finally {
    if (saved === undefined) delete process.env.ROCHE_CA_FILE;
    else process.env.ROCHE_CA_FILE = saved;
    rmSync(out, { recursive: true, force: true });
    other.stop();
    d.stop();
  }
});
