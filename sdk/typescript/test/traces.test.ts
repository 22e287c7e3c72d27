// Traces: the traceparent option goes with every call to roched, whose spans, exported
// over OTLP to a receiver this test runs on 127.0.0.1, are then in the caller's trace,
// children of the caller's span (docs/traces.md). No OpenTelemetry dependency here: the
// test finds the ids' bytes in the exported protobuf and the trace id in roched's log.

import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import * as http from "node:http";
import { after, before, test } from "node:test";
import { InvalidConfig, Roche } from "roche-sandbox";
import { Daemon, env, setup, teardown } from "./harness.js";

before(setup);
after(teardown);

async function receiver(): Promise<{ url: string; bodies: Buffer[]; close(): Promise<void> }> {
  const bodies: Buffer[] = [];
  const srv = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      bodies.push(Buffer.concat(chunks));
      res.writeHead(200, { "Content-Type": "application/x-protobuf" }).end();
    });
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  const port = (srv.address() as { port: number }).port;
  return { url: `http://127.0.0.1:${port}`, bodies, close: () => new Promise((r) => srv.close(() => r())) };
}

test("a traceparent (value or function) makes roched's spans children of the caller's", async () => {
  const recv = await receiver();
  const d = await new Daemon("traced", { OTEL_EXPORTER_OTLP_ENDPOINT: recv.url }, ["--log-level", "info"]).start();
  try {
    const trace = randomBytes(16).toString("hex");
    const spanA = randomBytes(8).toString("hex");
    const spanB = randomBytes(8).toString("hex");
    const a = new Roche({ transport: "daemon", socket: d.socket, traceparent: `00-${trace}-${spanA}-01` });
    let sb = await a.create({ image: env.image });
    assert.equal((await sb.exec(["true"])).exitCode, 0);
    await sb.destroy();
    const b = new Roche({ transport: "daemon", socket: d.socket, traceparent: () => `00-${trace}-${spanB}-01` });
    sb = await b.create({ image: env.image });
    await sb.destroy();
    const log = readFileSync(d.log, "utf8");
    await d.stop(); // SIGTERM: roched sends the spans it holds
    const body = Buffer.concat(recv.bodies);
    assert.ok(body.includes(Buffer.from(trace, "hex")), "the caller's trace id is in no exported span");
    assert.ok(body.includes(Buffer.from(spanA, "hex")), "no span has the value's span as its parent");
    assert.ok(body.includes(Buffer.from(spanB, "hex")), "no span has the function's span as its parent");
    assert.ok(log.includes(`trace_id=${trace}`), "the audit log does not name the trace");
  } finally {
    await d.stop();
    await recv.close();
  }
});

test("a malformed traceparent is refused", () => {
  for (const bad of ["00-abc-def-01", `00-${"0".repeat(32)}-${"1".repeat(16)}-01`, `00-${"a".repeat(32)}-${"b".repeat(16)}-01\r\nX: 1`]) {
    assert.throws(() => new Roche({ transport: "daemon", traceparent: bad }), (e: unknown) => e instanceof InvalidConfig && /W3C traceparent/.test((e as Error).message), bad);
  }
});
