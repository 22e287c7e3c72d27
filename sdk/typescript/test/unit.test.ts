// Logic without Roche behind it: how the CLI's errors and closing lines are read, and the
// tar the files API sends. (The same paths are exercised for real in the other files; these
// cover the CLI's JSON error object, which a CLI older than it does not print.)

import assert from "node:assert/strict";
import { test } from "node:test";
import { errorFromStderr, StreamParser } from "../src/cli.js";
import { CodeEventParser, dispatch, Execution, Result, type CodeItem } from "../src/code.js";
import { Code, ConnectError } from "@connectrpc/connect";
import { errorFromConnect, retryAfterOf } from "../src/daemon.js";
import type { Endpoint } from "../src/discovery.js";
import { ImageNotFound, InUse, ResourceExhausted, RocheError, SandboxNotFound } from "../src/errors.js";
import { fileTar, firstFile } from "../src/tar.js";

test("the CLI's JSON error object gives the typed error, its reason and message", () => {
  const e = errorFromStderr('{"error":{"reason":"not_found","message":"not found: no sandbox abc"}}\n', 125, "exec");
  assert.ok(e instanceof SandboxNotFound);
  assert.equal(e.message, "not found: no sandbox abc");
  const inUse = errorFromStderr('some warning\n{"error":{"reason":"in_use","message":"workspace w is in use"}}\n', 1, "workspace");
  assert.ok(inUse instanceof InUse);
});

test("a refusal's retry hint: RetryInfo on roched's error, retry_after_ms on the CLI's", () => {
  // google.rpc.RetryInfo{retry_delay: {seconds: 1, nanos: 500000000}}, as roched sends it.
  const info = Buffer.from("CggIARCAyrXuAQ", "base64");
  const ep: Endpoint = { socket: "s" };
  const err = new ConnectError("resource exhausted: retry in 1.5s", Code.ResourceExhausted);
  err.details.push({ type: "google.rpc.RetryInfo", value: new Uint8Array(info) });
  const e = errorFromConnect(err, ep);
  assert.ok(e instanceof ResourceExhausted);
  assert.equal(e.retryAfter, 1.5);
  assert.equal(errorFromConnect(new ConnectError("m", Code.ResourceExhausted), ep).retryAfter, undefined);
  const junk = new ConnectError("m", Code.ResourceExhausted);
  junk.details.push({ type: "google.rpc.RetryInfo", value: new Uint8Array([0x0a]) });
  assert.equal(retryAfterOf(junk), undefined);
  const cli = errorFromStderr('{"error":{"reason":"exhausted","message":"m: retry in 564ms","retry_after_ms":564}}\n', 125, "create");
  assert.ok(cli instanceof ResourceExhausted);
  assert.equal(cli.retryAfter, 0.564);
  assert.equal(errorFromStderr('{"error":{"reason":"exhausted","message":"m"}}\n', 125, "create").retryAfter, undefined);
});

test("the CLI's one-line error, for a CLI without JSON errors", () => {
  const e = errorFromStderr("roche: image not found: roche/nope (see --help)\n", 125, "create");
  assert.ok(e instanceof ImageNotFound);
  assert.equal(e.message, "image not found: roche/nope");
  const other = errorFromStderr("panic: something\n", 2, "create");
  assert.equal(other.constructor, RocheError);
  assert.match(other.message, /roche create exited with status 2: panic: something/);
});

test("a streamed exec's closing lines become flags; the command's own roche: lines stay output", () => {
  const p = new StreamParser();
  const early = p.feed("stderr", Buffer.from("warn\nroche: mine\nroche: output truncated: a stream passed 10485760 bytes\n"));
  assert.deepEqual(early.map((e) => e.text), ["warn\n"]);
  const [events, result] = p.finish(0, 1);
  assert.deepEqual(events.map((e) => e.text), ["roche: mine\n"]);
  assert.equal(result.truncated, true);
  assert.equal(result.stderr, "warn\nroche: mine\n");
  const t = new StreamParser();
  t.feed("stderr", Buffer.from("roche: the command timed out: --timeout 1s killed it after it ran 1.003s\n"));
  const [, timed] = t.finish(124, 1);
  assert.deepEqual([timed.timedOut, timed.exitCode], [true, 137]);
  const l = new StreamParser();
  l.feed("stderr", Buffer.from("roche: the command was killed when the sandbox's lifetime ended (it ran 1.7s; --timeout bounds the command alone)\n"));
  const [lifeEvents, ended] = l.finish(124, 1);
  assert.deepEqual([lifeEvents.length, ended.timedOut, ended.exitCode], [0, true, 137]);
  const f = new StreamParser();
  f.feed("stderr", Buffer.from("roche: not found: no sandbox x\n"));
  assert.throws(() => f.finish(125, 0), SandboxNotFound);
});

test("a one-file tar reads back, in pieces of any size", async () => {
  const data = Buffer.from("x".repeat(1000) + "end");
  const tar = fileTar("f.txt", data, 0o600);
  async function* pieces() {
    for (let i = 0; i < tar.length; i += 7) yield tar.subarray(i, i + 7);
  }
  assert.deepEqual(await firstFile(pieces(), "/tmp/f.txt", 1 << 20), data);
  const long = fileTar("n".repeat(180), data, 0o644);
  assert.deepEqual(await firstFile((async function* () { yield long; })(), "/tmp/long", 1 << 20), data);
});

test("roche code --json-events: split characters decode whole, results reach onResult once", async () => {
  const euro = Buffer.from("€");
  const lines = [
    { stream: "stdout", data: Buffer.concat([Buffer.from("a"), euro.subarray(0, 1)]).toString("base64") },
    { stream: "stdout", data: Buffer.concat([euro.subarray(1), Buffer.from("\n")]).toString("base64") },
    { result: { png: "iVBORw0KGgo=", text: "<Figure>" } },
    { execution: { results: [{ png: "iVBORw0KGgo=", text: "<Figure>" }, { text: "42", json: '{"k": [1]}', is_main_result: true }],
      logs: { stdout: ["a€\n"], stderr: [] }, execution_count: 3, context: "c1", timed_out: true, duration_ns: 1.5e9,
      error: { name: "KeyboardInterrupt", value: "", traceback: "tb" } } },
  ];
  const data = Buffer.from(lines.map((l) => JSON.stringify(l) + "\n").join(""));
  const p = new CodeEventParser();
  const items: CodeItem[] = [...p.feed(data.subarray(0, 7)), ...p.feed(data.subarray(7))];
  const texts = items.filter((i) => !(i instanceof Result) && !(i instanceof Execution)).map((i) => (i as { line: string }).line);
  assert.deepEqual(texts, ["a", "€\n"]);
  const ex = items[items.length - 1] as Execution;
  assert.ok(ex instanceof Execution);
  assert.deepEqual([ex.text, ex.executionCount, ex.context, ex.timedOut, ex.duration], ["42", 3, "c1", true, 1.5]);
  assert.deepEqual(ex.results[1].json, { k: [1] });
  assert.deepEqual(ex.results[0].formats(), ["text", "png"]);
  const got: unknown[] = [];
  const seen = { results: 0 };
  for (const it of items) await dispatch(it, { onResult: (r) => got.push(r), onError: (e) => got.push(e) }, seen);
  assert.deepEqual(got, [items[2], ex.results[1], ex.error]);
});
