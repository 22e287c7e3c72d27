// The quick start: `await using` destroys the sandbox at the end of the block, even on an
// exception (TypeScript 5.2+ compiles it; Node 20 runs the result).
//
//   roche-sandbox is not on the npm registry yet: build it from a clone of Roche
//   (cd sdk/typescript && npm ci && npm run build), then in your project:
//   npm install /path/to/roche/sdk/typescript && npx tsc && node dist/examples/quickstart.js

import { Roche } from "roche-sandbox";

export async function main(): Promise<void> {
  const roche = new Roche(); // provider "docker"; "wasm", "qemu", "firecracker"
  await using sandbox = await roche.create({ image: process.env.ROCHE_IMAGE ?? "python:3.12-slim" });
  const result = await sandbox.exec(["python3", "-c", "print('hello')"]);
  console.log(result.stdout.trim(), result.exitCode, sandbox.id.slice(0, 12));
  for await (const ev of sandbox.execStream(["sh", "-c", "echo out; echo err >&2"])) {
    console.log(`${ev.stream}: ${ev.text.trim()}`);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) await main();
