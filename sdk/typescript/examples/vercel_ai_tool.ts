// Vercel AI SDK: runPython as a tool of generateText, with a 30 s limit per run.
//
//   roche-sandbox is not on the npm registry yet: build it from a clone of Roche
//   (cd sdk/typescript && npm ci && npm run build), then in your project:
//   npm install /path/to/roche/sdk/typescript ai @ai-sdk/openai zod && export OPENAI_API_KEY=...
//   npx tsc && node dist/examples/vercel_ai_tool.js

import { Roche } from "roche-sandbox";

const roche = new Roche();
export let TIMEOUT = 30;

/** Runs Python code in a fresh sandbox and returns what a model should see. */
export async function runPython(code: string): Promise<string> {
  await using sandbox = await roche.create();
  const r = await sandbox.exec(["python3", "-c", code], { timeout: TIMEOUT });
  if (r.timedOut) return `Error: the code ran longer than ${TIMEOUT} s and was stopped`;
  if (r.exitCode !== 0) return `Error (exit ${r.exitCode}):\n${r.stderr}`;
  return r.stdout + (r.truncated ? "\n[output truncated]" : "");
}

export function setTimeoutSecs(s: number): void {
  TIMEOUT = s;
}

async function need(pkg: string): Promise<any> {
  try {
    return await import(pkg);
  } catch {
    throw new Error("this example needs the Vercel AI SDK: npm install ai @ai-sdk/openai zod");
  }
}

export async function main(): Promise<void> {
  const { generateText, tool, stepCountIs } = await need("ai");
  const { openai } = await need("@ai-sdk/openai");
  const { z } = await need("zod");
  const result = await generateText({
    model: openai("gpt-4.1-mini"),
    tools: {
      runPython: tool({
        description: "Run Python code in a secure sandbox and return its output.",
        inputSchema: z.object({ code: z.string() }),
        execute: ({ code }: { code: string }) => runPython(code),
      }),
    },
    stopWhen: stepCountIs(5),
    prompt: "What is the 30th Fibonacci number? Compute it with Python.",
  });
  console.log(result.text);
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
