"""Traces: a traceparent given to Roche (or AsyncRoche) goes with every call to roched,
whose spans, exported over OTLP to a receiver this test runs on 127.0.0.1, are then in
the caller's trace, children of the caller's span (docs/traces.md). The SDK itself has
no OpenTelemetry dependency; neither has this test, which finds the ids' bytes in the
exported protobuf and the trace id in roched's audit log."""

from __future__ import annotations

import asyncio
import http.server
import os
import secrets
import threading
import unittest

import harness

from roche_sandbox import AsyncRoche, InvalidConfig, Roche


class _Receiver(http.server.ThreadingHTTPServer):
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


class TracesTest(harness.SandboxTestCase):
    def setUp(self) -> None:
        self.receiver = _Receiver()
        threading.Thread(target=self.receiver.serve_forever, daemon=True).start()
        self.addCleanup(self.receiver.server_close)
        self.addCleanup(self.receiver.shutdown)

    def _daemon(self, traced: bool) -> harness.Daemon:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{self.receiver.server_address[1]}"} if traced else {}
        d = harness.Daemon(env=env, name="traced", args=["--log-level", "info"])
        self.addCleanup(d.stop)
        return d

    def _log(self, d: harness.Daemon) -> str:
        with open(d.log) as f:
            return f.read()

    def test_sync_and_async_calls_are_children_of_the_callers_span(self) -> None:
        d = self._daemon(traced=True)
        trace_id, span_sync, span_async = secrets.token_hex(16), secrets.token_hex(8), secrets.token_hex(8)
        with Roche(transport="daemon", socket=d.socket, traceparent=f"00-{trace_id}-{span_sync}-01").create(
                image=harness.image()) as sb:
            self.assertEqual(sb.exec(["true"]).exit_code, 0)

        async def run() -> None:
            r = AsyncRoche(transport="daemon", socket=d.socket, traceparent=f"00-{trace_id}-{span_async}-01")
            async with (await r.create(image=harness.image())) as sb:
                self.assertEqual((await sb.exec(["true"])).exit_code, 0)
        asyncio.run(run())
        log = self._log(d)
        d.stop()  # SIGTERM: roched sends the spans it holds
        body = b"".join(self.receiver.bodies)
        # (assertTrue: assertIn would print the whole export)
        self.assertTrue(bytes.fromhex(trace_id) in body, "the caller's trace id is in no exported span")
        self.assertTrue(bytes.fromhex(span_sync) in body, "no span has the sync client's span as its parent")
        self.assertTrue(bytes.fromhex(span_async) in body, "no span has the async client's span as its parent")
        self.assertIn(f"trace_id={trace_id}", log)

    def test_off_sends_nothing(self) -> None:
        d = self._daemon(traced=False)
        with Roche(transport="daemon", socket=d.socket, traceparent=f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01").create(
                image=harness.image()) as sb:
            sb.exec(["true"])
        d.stop()
        self.assertEqual(self.receiver.bodies, [])

    def test_a_bad_traceparent_is_refused(self) -> None:
        for bad in ("00-abc-def-01", "00-" + "0" * 32 + "-" + "1" * 16 + "-01",
                    f"00-{'a' * 32}-{'b' * 16}-01\r\nX-Injected: 1", "00-" + "A" * 32 + "-" + "b" * 16 + "-01"):
            with self.assertRaises(InvalidConfig, msg=bad) as cm:
                Roche(transport="daemon", socket=os.devnull, traceparent=bad)
            self.assertIn("W3C traceparent", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
