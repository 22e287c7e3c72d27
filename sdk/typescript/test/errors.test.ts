// Each typed error, for its real case, with Roche's own message, through roched and the CLI.

import assert from "node:assert/strict";
import { chmodSync, mkdtempSync, rmSync, unlinkSync, writeFileSync } from "node:fs";
import { randomBytes } from "node:crypto";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  ImageNotFound,
  InUse,
  InvalidConfig,
  PermissionDenied,
  ProviderUnavailable,
  ResourceExhausted,
  Roche,
  RocheError,
  SandboxNotFound,
  SandboxTimeout,
  Unsupported,
} from "roche-sandbox";
import { Daemon, env, setup, teardown, TRANSPORTS } from "./harness.js";

before(setup);
after(teardown);

/** Asserts that p rejects with cls, its message containing text. */
async function rejects(p: Promise<unknown>, cls: new (...a: never[]) => RocheError, text: string, reason?: string): Promise<RocheError> {
  let got: unknown;
  try {
    await p;
  } catch (e) {
    got = e;
  }
  assert.ok(got instanceof cls, `expected ${cls.name}, got ${got instanceof Error ? `${got.constructor.name}: ${got.message}` : got}`);
  const e = got as RocheError;
  assert.ok(e.message.includes(text), `${JSON.stringify(e.message)} lacks ${JSON.stringify(text)}`);
  assert.ok(e instanceof RocheError);
  if (reason) assert.equal(e.reason, reason);
  return e;
}

/** A socket that answers /healthz like roched, then never answers a call: a daemon stuck
 * behind a hung Docker engine. */
function hungDaemon(): { socket: string; close: () => void } {
  const dir = mkdtempSync(join(tmpdir(), "roche-hung-"));
  const socket = join(dir, "hung.sock");
  const conns: net.Socket[] = [];
  const server = net.createServer((c) => {
    conns.push(c);
    c.once("data", (b) => {
      if (b.toString().startsWith("GET /healthz")) {
        const body = '{"status":"ok","providers":["docker"]}';
        c.end(`HTTP/1.1 200 OK\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
      }
    });
  }).listen(socket);
  return { socket, close: () => { for (const c of conns) c.destroy(); server.close(); rmSync(dir, { recursive: true, force: true }); } };
}

for (const transport of TRANSPORTS) {
  describe(`errors through ${transport}`, () => {
    const roche = () => new Roche({ transport });

    test("SandboxNotFound", async () => {
      const r = roche();
      await rejects(r.get("0123456789ab"), SandboxNotFound, "no sandbox 0123456789ab", "not_found");
      const sb = await r.create();
      await sb.destroy();
      await rejects(sb.exec(["true"]), SandboxNotFound, sb.id.slice(0, 12));
      await rejects(sb.writeFile("/tmp/x", "x"), SandboxNotFound, sb.id.slice(0, 12));
      await r.close();
    });

    test("InvalidConfig", async () => {
      const r = roche();
      await rejects(r.create({ memory: "lots" }), InvalidConfig, '"lots" is not a size', "invalid_config");
      await rejects(r.create({ cpus: 0 }), InvalidConfig, "cpus");
      await rejects(r.create({ mounts: ["nocolon"] }), InvalidConfig, "mount");
      const sb = await r.create();
      try {
        await rejects(sb.exec([]), InvalidConfig, "empty command");
        await rejects(sb.exec("echo hi" as unknown as string[]), InvalidConfig, "as an array");
      } finally {
        await sb.destroy();
      }
    });

    test("ImageNotFound, also an InvalidConfig", async () => {
      const e = await rejects(roche().create({ image: "roche/no-such-image:nope" }), ImageNotFound, "roche/no-such-image:nope", "image_not_found");
      assert.ok(e instanceof InvalidConfig);
    });

    test("PermissionDenied: a write to the read-only root", async () => {
      const sb = await roche().create();
      try {
        await rejects(sb.writeFile("/etc/planted", "x"), PermissionDenied, "read-only", "permission_denied");
      } finally {
        await sb.destroy();
      }
    });

    test("Unsupported: the wasm provider has no network", async () => {
      await rejects(new Roche({ provider: "wasm", transport }).create({ image: "python:3.12-slim", network: true }), Unsupported, "no network", "unsupported");
    });

    test("InUse: removing a workspace a live sandbox has mounted", async () => {
      const r = roche();
      const name = `ts-inuse-${process.pid}-${transport}`;
      const sb = await r.create({ workspace: name });
      try {
        await rejects(r.deleteWorkspace(name), InUse, name, "in_use");
      } finally {
        await sb.destroy();
        for (let i = 0; ; i++) {
          try {
            await r.deleteWorkspace(name);
            break;
          } catch (e) {
            if (!(e instanceof InUse) || i > 40) throw e;
            await new Promise((res) => setTimeout(res, 250));
          }
        }
      }
    });

    test("ProviderUnavailable: the Docker engine is down", async () => {
      const noDocker = { DOCKER_HOST: "unix:///nonexistent/docker.sock" };
      if (transport === "daemon") {
        const down = await new Daemon("nodocker", noDocker).start();
        try {
          await rejects(new Roche({ transport, socket: down.socket }).create(), ProviderUnavailable, "Docker engine is not reachable", "unavailable");
        } finally {
          await down.stop();
        }
      } else {
        process.env.DOCKER_HOST = noDocker.DOCKER_HOST;
        try {
          await rejects(roche().create(), ProviderUnavailable, "Docker engine is not reachable", "unavailable");
        } finally {
          delete process.env.DOCKER_HOST;
        }
      }
    });

    test("ProviderUnavailable: nothing answers", async () => {
      if (transport === "daemon") {
        await rejects(new Roche({ transport, socket: env.deadSocket }).create(), ProviderUnavailable, "roched is not answering");
      } else {
        await rejects(new Roche({ socket: env.deadSocket, cli: "/nonexistent/roche" }).create(), ProviderUnavailable, "cannot run the roche CLI");
        const path = process.env.PATH, cli = process.env.ROCHE_CLI;
        process.env.PATH = "/nonexistent";
        delete process.env.ROCHE_CLI;
        try {
          await rejects(new Roche({ socket: env.deadSocket }).create(), ProviderUnavailable, "no roche CLI was found");
        } finally {
          process.env.PATH = path;
          process.env.ROCHE_CLI = cli;
        }
      }
    });

    test("SandboxTimeout: Roche hangs, and the SDK does not", async () => {
      let r: Roche;
      let cleanup: () => void;
      if (transport === "daemon") {
        const hung = hungDaemon();
        cleanup = hung.close;
        r = new Roche({ transport, socket: hung.socket, requestTimeout: 1 });
      } else {
        const dir = mkdtempSync(join(tmpdir(), "roche-hung-cli-"));
        writeFileSync(join(dir, "roche"), "#!/bin/sh\nexec sleep 60\n");
        chmodSync(join(dir, "roche"), 0o700);
        cleanup = () => rmSync(dir, { recursive: true, force: true });
        r = new Roche({ transport, cli: join(dir, "roche"), requestTimeout: 1 });
      }
      try {
        const started = Date.now();
        await rejects(r.create(), SandboxTimeout, "did not answer within 1 s", "timeout");
        await rejects(r.create({ leased: false }), SandboxTimeout, "did not answer within 1 s");
        assert.ok(Date.now() - started < 10_000);
      } finally {
        cleanup();
      }
    });
  });
}

test("ResourceExhausted: roched's --max-sandboxes", async () => {
  const small = await new Daemon("small", {}, ["--max-sandboxes", "1"]).start();
  const r = new Roche({ transport: "daemon", socket: small.socket });
  try {
    const sb = await r.create();
    try {
      await rejects(r.create(), ResourceExhausted, "max", "exhausted");
    } finally {
      await sb.destroy();
    }
  } finally {
    await r.close();
    await small.stop();
  }
});

test("ResourceExhausted from roched's pool says when to retry", async () => {
  // A create takes the pool's one sandbox or finds it making the next, which takes longer
  // than 1 ms: within a few creates in a row, one is refused, with the pool's hint.
  const pooled = await new Daemon("pooled", {}, ["--pool", `docker/${env.image}?min=1&max=1&queue=1&wait=0.001`]).start();
  const r = new Roche({ transport: "daemon", socket: pooled.socket });
  const made: { destroy(): Promise<void> }[] = [];
  try {
    let refused: RocheError | undefined;
    for (let i = 0; i < 5 && !refused; i++) {
      try {
        made.push(await r.create());
      } catch (e) {
        refused = e as RocheError;
      }
    }
    assert.ok(refused instanceof ResourceExhausted, `no create was refused in five tries: ${refused}`);
    assert.ok(refused.message.includes("retry in"), refused.message);
    assert.ok(refused.retryAfter !== undefined && refused.retryAfter > 0 && refused.retryAfter < 11, `retryAfter ${refused.retryAfter}`);
    assert.equal(refused.reason, "exhausted");
  } finally {
    for (const sb of made) await sb.destroy();
    await r.close();
    await pooled.stop();
  }
});

test("roched on TCP: the token is sent, and a wrong one is refused", async () => {
  const port = await new Promise<number>((res) => {
    const srv = net.createServer().listen(0, "127.0.0.1", () => {
      const p = (srv.address() as net.AddressInfo).port;
      srv.close(() => res(p));
    });
  });
  const dir = mkdtempSync(join(tmpdir(), "roche-token-"));
  writeFileSync(join(dir, "token"), randomBytes(16).toString("hex"), { mode: 0o600 });
  const tcp = await new Daemon("tcp", {}, ["--listen", `tcp://127.0.0.1:${port}`, "--token-file", join(dir, "token")]).start();
  try {
    const r = new Roche({ transport: "daemon", address: `http://127.0.0.1:${port}`, tokenFile: join(dir, "token") });
    const sb = await r.create();
    try {
      assert.equal((await sb.exec(["echo", "over tcp"])).stdout, "over tcp\n");
    } finally {
      await sb.destroy();
      await r.close();
    }
    const wrong = new Roche({ transport: "daemon", address: `http://127.0.0.1:${port}`, token: "wrong" });
    await rejects(wrong.list(), RocheError, "ROCHE_TOKEN", "unauthenticated");
  } finally {
    await tcp.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a token file open to others is refused", () => {
  const dir = mkdtempSync(join(tmpdir(), "roche-token-"));
  try {
    writeFileSync(join(dir, "token"), "secret");
    chmodSync(join(dir, "token"), 0o644);
    assert.throws(() => new Roche({ address: "http://127.0.0.1:7878", tokenFile: join(dir, "token") }), /chmod 600/);
    unlinkSync(join(dir, "token"));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
