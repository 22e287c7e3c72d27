// Code contexts (runCode) through both transports against the real roched and CLI: state kept
// between cells, output streamed as printed, exceptions, a timeout that interrupts the cell
// and keeps the variables, several contexts, and rich results (a PNG chart, a DataFrame).

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Execution, InvalidConfig, Result, Roche, RocheError, type ExecutionError, type OutputMessage, type Sandbox } from "roche-sandbox";
import { setup, teardown, TRANSPORTS } from "./harness.js";

before(setup);
after(teardown);

const CHART = `
import matplotlib.pyplot as plt
plt.figure(figsize=(4, 3), dpi=50)
plt.plot([1, 3, 2])
plt.show()
`;

/** A PNG's width and height from its IHDR chunk; fails on anything else. */
function pngSize(b64: string): [number, number] {
  const raw = Buffer.from(b64, "base64");
  assert.deepEqual([...raw.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  assert.equal(raw.subarray(12, 16).toString("latin1"), "IHDR");
  return [raw.readUInt32BE(16), raw.readUInt32BE(20)];
}

describe("code contexts", { concurrency: TRANSPORTS.length }, () => {
  for (const transport of TRANSPORTS) {
    describe(`through ${transport}`, { concurrency: 1 }, () => {
      let roche: Roche;
      let sb: Sandbox;
      before(async () => {
        roche = new Roche({ transport });
        sb = await roche.create();
        assert.equal(await roche.transport(), transport);
      });
      after(async () => {
        await sb.destroy();
        await roche.close();
      });

      test("runCode keeps state: x = 41, then x + 1 is 42", async () => {
        const first = await sb.runCode("x = 41");
        assert.ok(first instanceof Execution);
        assert.equal(first.text, undefined);
        const ex = await sb.runCode("x + 1");
        assert.equal(ex.text, "42");
        assert.equal(ex.executionCount, (first.executionCount ?? 0) + 1);
        assert.equal(ex.results[0].isMainResult, true);
        assert.deepEqual(ex.results[0].formats(), ["text"]);
      });

      test("output reaches onStdout and onStderr as it is printed", async () => {
        const seen: [number, OutputMessage][] = [];
        const started = Date.now();
        const ex = await sb.runCode(
          "import sys, time\nprint('a', flush=True)\nprint('e', file=sys.stderr, flush=True)\ntime.sleep(1.5)\nprint('b')",
          { onStdout: (m) => seen.push([Date.now() - started, m]), onStderr: (m) => seen.push([Date.now() - started, m]) },
        );
        const took = Date.now() - started;
        assert.equal(ex.logs.stdout.join(""), "a\nb\n");
        assert.equal(ex.logs.stderr.join(""), "e\n");
        assert.equal(seen.filter(([, m]) => !m.error).map(([, m]) => m.line).join(""), "a\nb\n");
        assert.deepEqual(seen.filter(([, m]) => m.error).map(([, m]) => m.line), ["e\n"]);
        const firstAt = seen.find(([, m]) => m.line.startsWith("a"))![0];
        assert.ok(firstAt < took - 1000, `'a' arrived at ${firstAt} ms of ${took}: not streamed`);
      });

      test("an exception is the execution's error, with its traceback", async () => {
        const errors: ExecutionError[] = [];
        const ex = await sb.runCode("def f():\n    return 1 / 0\nf()", { onError: (e) => errors.push(e) });
        assert.equal(ex.error?.name, "ZeroDivisionError");
        assert.equal(ex.error?.value, "division by zero");
        assert.match(ex.error!.traceback, /return 1 \/ 0/);
        assert.deepEqual(errors, [ex.error]);
        assert.equal((await sb.runCode("x")).text, "41");
      });

      test("a timeout interrupts the cell and the context keeps its variables", async () => {
        await sb.runCode("kept = 'yes'");
        const started = Date.now();
        const ex = await sb.runCode("while True:\n    pass", { timeoutMs: 2000 });
        assert.ok(Date.now() - started < 30_000);
        assert.equal(ex.timedOut, true);
        assert.equal(ex.error?.name, "KeyboardInterrupt");
        assert.equal((await sb.runCode("kept")).text, "'yes'");
      });

      test("contexts: create, list, restart, remove", async () => {
        const ctx = await sb.createCodeContext({ cwd: "/tmp" });
        assert.equal(ctx.language, "python");
        assert.equal((await sb.runCode("import os; x = os.getcwd(); x", { context: ctx })).text, "'/tmp'");
        assert.equal((await sb.runCode("x")).text, "41"); // the default context's x
        const listed = await sb.listCodeContexts();
        assert.ok(listed.some((c) => c.id === ctx.id && !c.default));
        assert.equal(listed.filter((c) => c.default).length, 1);
        await sb.restartCodeContext(ctx);
        assert.equal((await sb.runCode("x", { context: ctx.id })).error?.name, "NameError");
        await sb.removeCodeContext(ctx.id);
        assert.ok(!(await sb.listCodeContexts()).some((c) => c.id === ctx.id));
        await assert.rejects(sb.runCode("1", { context: ctx }), RocheError);
        await assert.rejects(sb.runCode("1", { language: "cobol" }), InvalidConfig);
      });

      test("a context forked holds the same variables, then goes on apart", async () => {
        const ctx = await sb.createCodeContext();
        await sb.runCode("y = 1", { context: ctx });
        const forked = await sb.forkCodeContext(ctx);
        assert.notEqual(forked.id, ctx.id);
        assert.ok((await sb.listCodeContexts()).some((c) => c.id === forked.id));
        assert.equal((await sb.runCode("y", { context: forked })).text, "1");
        await sb.runCode("y = 2", { context: forked });
        assert.equal((await sb.runCode("y", { context: ctx })).text, "1");
        assert.equal((await sb.runCode("y", { context: forked.id })).text, "2");
        await assert.rejects(sb.forkCodeContext("no-such-context"), RocheError);
      });

      test("a matplotlib chart is a PNG, a DataFrame HTML", async () => {
        const streamed: Result[] = [];
        const ex = await sb.runCode(CHART, { onResult: (r) => streamed.push(r) });
        assert.equal(ex.error, undefined, ex.error?.traceback);
        const pngs = ex.results.filter((r) => r.png);
        assert.equal(pngs.length, 1);
        assert.deepEqual(pngSize(pngs[0].png!), [200, 150]);
        assert.ok(pngs[0].formats().includes("png"));
        assert.deepEqual(streamed, ex.results);

        const df = await sb.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})");
        assert.equal(df.error, undefined, df.error?.traceback);
        const main = df.results[df.results.length - 1];
        assert.equal(main.isMainResult, true);
        assert.match(main.html ?? "", /<table/);
        assert.ok(main.formats().includes("html"));
      });
    });
  }
});
