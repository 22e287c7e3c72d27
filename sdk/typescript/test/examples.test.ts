// The examples: their tool functions against real sandboxes (the frameworks are not installed,
// so each example imports its framework only in main), and the `await using` quick start run
// as a program.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import { after, before, test } from "node:test";
import { SDK, setup, teardown } from "./harness.js";

before(setup);
after(teardown);

async function checkTool(tool: (code: string) => Promise<string>): Promise<void> {
  assert.equal(await tool("print(6 * 7)"), "42\n");
  const failed = await tool("1 / 0");
  assert.ok(failed.startsWith("Error"), failed);
  assert.match(failed, /ZeroDivisionError/);
}

test("OpenAI Agents: executePython", async () => {
  const m = await import("../examples/openai_agents_tool.js");
  await checkTool(m.executePython);
  assert.equal(await m.roche.transport(), "daemon");
  await assert.rejects(m.main(), /npm install @openai\/agents zod/);
});

test("Vercel AI SDK: runPython, with its time limit", async () => {
  const m = await import("../examples/vercel_ai_tool.js");
  await checkTool(m.runPython);
  m.setTimeoutSecs(1);
  assert.match(await m.runPython("import time; time.sleep(60)"), /longer than 1 s/);
  await assert.rejects(m.main(), /npm install ai @ai-sdk\/openai zod/);
});

test("the quick start runs as a program, and await using destroys its sandbox", async () => {
  const { stdout } = await promisify(execFile)(process.execPath, [join(SDK, "dist", "examples", "quickstart.js")], { timeout: 60_000 }).catch((e) => {
    throw new Error(`${e.message}: ${e.stdout} ${e.stderr}`);
  });
  const [hello, out, err] = stdout.trim().split("\n");
  assert.match(hello, /^hello 0 [0-9a-f]{12}$/);
  // stdout and stderr are separate pipes: the agent forwards each as it reads it, so the two
  // events may arrive in either order.
  assert.deepEqual([out, err].sort(), ["stderr: err", "stdout: out"]);
  // teardown fails the file if the sandbox (private image tag) is left
});

test("the examples say how to install roche-sandbox from a clone, not from the npm registry", async () => {
  const { readdir, readFile } = await import("node:fs/promises");
  const dir = join(SDK, "examples");
  for (const name of (await readdir(dir)).filter((n) => n.endsWith(".ts"))) {
    const text = await readFile(join(dir, name), "utf8");
    // The package is not published: `npm install roche-sandbox` would fail, or install
    // someone else's package of that name.
    assert.doesNotMatch(text, /npm install roche-sandbox/, name);
    assert.match(text, /npm install \/path\/to\/roche\/sdk\/typescript/, name);
  }
});
