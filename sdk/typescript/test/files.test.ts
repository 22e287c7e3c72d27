// sandbox.files against real sandboxes, through roched and through the roche CLI: every call,
// the refusals that keep it to the sandbox user's view, streaming in bounded memory, watches.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  FilesystemEventType,
  FileType,
  InvalidConfig,
  PermissionDenied,
  ResourceExhausted,
  Roche,
  SandboxNotFound,
  type FilesystemEvent,
  type Sandbox,
  type WatchHandle,
} from "roche-sandbox";
import { setup, sleep, teardown, TRANSPORTS } from "./harness.js";

before(setup);
after(teardown);

async function waitFor(h: WatchHandle, name: string, type: FilesystemEventType, seen: FilesystemEvent[]): Promise<void> {
  const deadline = Date.now() + 20_000;
  while (Date.now() < deadline) {
    seen.push(...h.getNewEvents());
    if (seen.some((e) => e.name === name && e.type === type)) return;
    await sleep(50);
  }
  assert.fail(`no ${type} event for ${JSON.stringify(name)}; seen ${JSON.stringify(seen.slice(-8))}`);
}

for (const transport of TRANSPORTS) {
  describe(`sandbox.files through the ${transport}`, () => {
    let roche: Roche;
    let sb: Sandbox;
    before(async () => {
      roche = new Roche({ transport });
      sb = await roche.create({ writable: true });
    });
    after(async () => {
      await sb.destroy();
      await roche.close();
    });

    test("every call", async () => {
      const f = sb.files;
      const info = await f.write("/tmp/a/b/hello.txt", "héllo\n", { mode: 0o640 });
      assert.deepEqual([info.name, info.type, info.path, info.size, info.mode], ["hello.txt", FileType.FILE, "/tmp/a/b/hello.txt", 7, 0o640]);
      assert.equal(await f.read("/tmp/a/b/hello.txt"), "héllo\n");
      assert.deepEqual(Buffer.from(await f.read("/tmp/a/b/hello.txt", { format: "bytes" })), Buffer.from("héllo\n"));
      assert.equal(await (await f.read("/tmp/a/b/hello.txt", { format: "blob" })).text(), "héllo\n");
      const chunks: Uint8Array[] = [];
      for await (const c of await f.read("/tmp/a/b/hello.txt", { format: "stream" })) chunks.push(c);
      assert.equal(Buffer.concat(chunks).toString(), "héllo\n");
      const st = await f.getInfo("/tmp/a/b/hello.txt");
      assert.deepEqual([st.type, st.mode, st.permissions], [FileType.FILE, 0o640, "-rw-r-----"]);
      const uid = (await sb.exec(["id", "-u"])).stdout.trim();
      assert.equal(String(st.uid), uid, "a file written through the API is the sandbox user's");
      assert.ok(st.modifiedTime instanceof Date);
      assert.deepEqual((await f.list("/tmp/a")).map((e) => [e.path, e.type]), [["/tmp/a/b", FileType.DIR]]);
      assert.deepEqual((await f.list("/tmp/a", { depth: 3 })).map((e) => e.path), ["/tmp/a/b", "/tmp/a/b/hello.txt"]);
      assert.equal(await f.exists("/tmp/a/b/hello.txt"), true);
      assert.equal(await f.exists("/tmp/a/nothing"), false);
      assert.equal(await f.makeDir("/tmp/d/e"), true);
      assert.equal(await f.makeDir("/tmp/d/e"), false);
      const moved = await f.rename("/tmp/a/b/hello.txt", "/tmp/d/e/moved.txt");
      assert.deepEqual([moved.path, moved.type, moved.size], ["/tmp/d/e/moved.txt", FileType.FILE, 7]);
      await f.remove("/tmp/d");
      assert.equal(await f.exists("/tmp/d"), false);
      await assert.rejects(f.getInfo("/tmp/nothing"), SandboxNotFound);
      // A Blob, a ReadableStream and an async iterable, streamed.
      await f.write("/tmp/blob", new Blob([Buffer.alloc(300_000, 1)]));
      assert.equal((await f.getInfo("/tmp/blob")).size, 300_000);
      await f.write("/tmp/stream", new ReadableStream({ start(c) { c.enqueue(Buffer.from("ab")); c.enqueue(Buffer.from("cd")); c.close(); } }));
      assert.equal(await f.read("/tmp/stream"), "abcd");
      await f.write("/tmp/iter", (async function* () { for (let i = 0; i < 5; i++) yield Buffer.from(String(i)); })());
      assert.equal(await f.read("/tmp/iter"), "01234");
    });

    test("refusals", async () => {
      const f = sb.files;
      const r = await sb.exec(["sh", "-c", "ln -s / /tmp/root && ln -s /etc/hostname /tmp/host && mkfifo /tmp/fifo"]);
      assert.equal(r.exitCode, 0, r.stderr);
      await assert.rejects(f.read("tmp/x"), InvalidConfig);
      await assert.rejects(f.read("/tmp/../etc/hostname"), InvalidConfig);
      await assert.rejects(f.read("/tmp/root/etc/hostname"), PermissionDenied);
      await assert.rejects(f.read("/tmp/host"), PermissionDenied);
      await assert.rejects(f.write("/tmp/root/tmp/dropped", "x"), PermissionDenied);
      await assert.rejects(f.read("/tmp/fifo"), InvalidConfig);
      await assert.rejects(f.read("/dev/zero"), InvalidConfig);
      await assert.rejects(f.read("/proc/1/environ"), PermissionDenied);
      await assert.rejects(f.list("/tmp", { depth: 65 }), InvalidConfig);
      assert.equal(await f.exists("/tmp/dropped"), false);
      await assert.rejects(f.write("/tmp/over", Buffer.alloc(5000), { maxBytes: 4096 }), ResourceExhausted);
      await sleep(200);
      assert.equal(await f.exists("/tmp/over"), false, "a write over its cap left its file");
    });

    test("a large file streams in bounded memory", async () => {
      const size = 64 << 20;
      const piece = Buffer.alloc(1 << 20, 7);
      global.gc?.();
      const before = process.memoryUsage().rss;
      let peak = before;
      const sample = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 10);
      try {
        const info = await sb.files.write("/var/tmp/big", (async function* () { for (let i = 0; i < size >> 20; i++) yield piece; })());
        assert.equal(info.size, size);
        let n = 0;
        for await (const c of await sb.files.read("/var/tmp/big", { format: "stream" })) n += c.length;
        assert.equal(n, size);
      } finally {
        clearInterval(sample);
      }
      const grew = peak - before;
      assert.ok(grew < 48 << 20, `the SDK's resident memory grew ${grew >> 20} MiB moving 64 MiB: it must stream, not hold`);
    });

    test("watches", async () => {
      const f = sb.files;
      await f.makeDir("/tmp/w/sub");
      const flat = await f.watchDir("/tmp/w");
      const tree = await f.watchDir("/tmp/w", undefined, { recursive: true });
      const seen: FilesystemEvent[] = [];
      const tseen: FilesystemEvent[] = [];
      await f.write("/tmp/w/a.txt", "a");
      await waitFor(flat, "a.txt", FilesystemEventType.CREATE, seen);
      await sb.exec(["chmod", "600", "/tmp/w/a.txt"]);
      await waitFor(flat, "a.txt", FilesystemEventType.CHMOD, seen);
      await f.rename("/tmp/w/a.txt", "/tmp/w/b.txt");
      await waitFor(flat, "a.txt", FilesystemEventType.RENAME, seen);
      await waitFor(flat, "b.txt", FilesystemEventType.CREATE, seen);
      await f.remove("/tmp/w/b.txt");
      await waitFor(flat, "b.txt", FilesystemEventType.REMOVE, seen);
      await f.write("/tmp/w/sub/new/deep.txt", "d");
      await waitFor(tree, "sub/new/deep.txt", FilesystemEventType.CREATE, tseen);
      const started = Date.now();
      await flat.stop();
      assert.ok(Date.now() - started < 5000, "stop() took long");
      assert.equal(flat.running, false);
      // A callback, and the end of a watch whose directory is removed.
      const got: FilesystemEvent[] = [];
      let exited: Error | undefined | null = null;
      const cb = await f.watchDir("/tmp/w", (e) => { got.push(e); }, { onExit: (err) => { exited = err; } });
      await f.remove("/tmp/w");
      const deadline = Date.now() + 20_000;
      while (cb.running && Date.now() < deadline) await sleep(50);
      assert.equal(cb.running, false, "the watch of a removed directory did not end");
      assert.ok(got.some((e) => e.name === "" && e.type === FilesystemEventType.REMOVE), JSON.stringify(got));
      assert.equal(exited, undefined);
      await tree.stop();
      await assert.rejects(f.watchDir("/tmp/no-such-dir"), SandboxNotFound);
    });
  });
}
