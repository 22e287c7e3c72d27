// OpenAI Agents SDK (JavaScript): the seeds' execute_python as a function tool.
//
//   roche-sandbox is not on the npm registry yet: build it from a clone of Roche
//   (cd sdk/typescript && npm ci && npm run build), then in your project:
//   npm install /path/to/roche/sdk/typescript @openai/agents zod && export OPENAI_API_KEY=...
//   npx tsc && node dist/examples/openai_agents_tool.js

import { Roche } from "roche-sandbox";

export const roche = new Roche();

/** Execute Python code in a secure sandbox. */
export async function executePython(code: string): Promise<string> {
  await using sandbox = await roche.create();
  const result = await sandbox.exec(["python3", "-c", code]);
  if (result.exitCode !== 0) return `Error:\n${result.stderr}`;
  return result.stdout;
}

/** Imports a package only when the example runs, so the tool above needs none of it. */
async function need(pkg: string, install: string): Promise<any> {
  try {
    return await import(pkg);
  } catch {
    throw new Error(`this example needs the OpenAI Agents SDK: npm install ${install}`);
  }
}

export async function main(): Promise<void> {
  const { Agent, run, tool } = await need("@openai/agents", "@openai/agents zod");
  const { z } = await need("zod", "@openai/agents zod");
  const agent = new Agent({
    name: "Coder",
    instructions: "You can run Python code using execute_python.",
    tools: [
      tool({
        name: "execute_python",
        description: "Execute Python code in a secure sandbox.",
        parameters: z.object({ code: z.string() }),
        execute: ({ code }: { code: string }) => executePython(code),
      }),
    ],
  });
  const result = await run(agent, "What is the 30th Fibonacci number? Compute it with Python.");
  console.log(result.finalOutput);
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
