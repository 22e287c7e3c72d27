"""Code contexts (run_code) against real sandboxes, through the daemon and through the
CLI, sync and async: state kept between cells, output streamed as printed, exceptions,
interrupts at a timeout, several contexts, and rich results (PNG charts, DataFrames)."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import unittest
from typing import Any

import harness

from roche_sandbox import (
    AsyncRoche,
    Context,
    Execution,
    ExecutionError,
    InvalidConfig,
    OutputMessage,
    Result,
    Roche,
    RocheError,
    SandboxNotFound,
)
from roche_sandbox import _cli, _wire
from roche_sandbox.types import CodeCallbacks

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

CHART = """
import matplotlib.pyplot as plt
plt.figure(figsize=(4, 3), dpi=50)
plt.plot([1, 3, 2])
plt.show()
"""


def png_size(b64: str) -> tuple[int, int]:
    """A PNG's width and height, from its IHDR chunk; fails on anything else."""
    raw = base64.b64decode(b64)
    assert raw[:8] == PNG_MAGIC, raw[:16]
    assert raw[12:16] == b"IHDR", raw[:32]
    width, height = struct.unpack(">II", raw[16:24])
    return width, height


class CodeWire(unittest.TestCase):
    """How both transports' messages become an Execution, without a sandbox."""

    def test_code_cli_events_and_late_results(self) -> None:
        p = _cli.CodeEventParser()
        euro = "€".encode()
        lines = [
            {"stream": "stdout", "data": base64.b64encode(b"a" + euro[:1]).decode()},
            {"stream": "stdout", "data": base64.b64encode(euro[1:] + b"\n").decode()},
            {"result": {"png": "iVBORw0KGgo=", "text": "<Figure>"}},
            {"execution": {"results": [{"png": "iVBORw0KGgo=", "text": "<Figure>"},
                                       {"text": "42", "json": "{\"k\": [1]}", "is_main_result": True}],
                           "logs": {"stdout": ["a€\n"], "stderr": []}, "execution_count": 3,
                           "context": "c1", "timed_out": True, "duration_ns": 1500000000,
                           "error": {"name": "KeyboardInterrupt", "value": "", "traceback": "tb"}}},
        ]
        data = b"".join(json.dumps(m).encode() + b"\n" for m in lines)
        items = p.feed(data[:7]) + p.feed(data[7:])
        p.finish(b"", 124)
        self.assertEqual([i.line for i in items if isinstance(i, OutputMessage)], ["a", "€\n"])
        ex = items[-1]
        self.assertIsInstance(ex, Execution)
        self.assertEqual((ex.text, ex.execution_count, ex.context, ex.timed_out, ex.duration),
                         ("42", 3, "c1", True, 1.5))
        self.assertEqual(ex.results[1].json, {"k": [1]})
        self.assertEqual(ex.results[0].formats(), ["text", "png"])
        got: list[object] = []
        cb = CodeCallbacks(None, None, got.append, got.append)
        for item in items:
            for h, arg in cb.calls(item):
                h(arg)
        self.assertEqual(got, [ex.results[0], ex.results[1], ex.error])

    def test_code_daemon_events(self) -> None:
        asm = _wire.CodeAssembler()
        msgs = [
            {"heartbeat": {}},
            {"output": {"stream": "OUTPUT_STREAM_STDERR", "data": base64.b64encode(b"warn\n").decode()}},
            {"result": {"text": "1", "isMainResult": True}},
            {"execution": {"executionCount": 2, "contextId": "c", "duration": "0.25s", "restarted": True}},
        ]
        items = [i for i in (_wire.code_event(m, asm) for m in msgs) if i is not None]
        ex = items[-1]
        self.assertEqual((ex.text, ex.logs.stderr, ex.execution_count, ex.restarted, ex.duration),
                         ("1", ["warn\n"], 2, True, 0.25))
        self.assertTrue(items[0].error)

    def test_code_cli_error(self) -> None:
        p = _cli.CodeEventParser()
        with self.assertRaises(SandboxNotFound):
            p.finish(b"roche: not found: no sandbox abc\n", 125)


class CodeThroughDaemon(harness.SandboxTestCase):
    transport = "daemon"
    roche: Roche

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.roche = Roche(transport=cls.transport)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.roche.close()
        super().tearDownClass()

    def test_code_state_streaming_and_errors(self) -> None:
        sb = self.enter(self.roche.create(image=harness.image()))
        first = sb.run_code("x = 41")
        self.assertIsInstance(first, Execution)
        self.assertIsNone(first.text)
        ex = sb.run_code("x + 1")
        self.assertEqual(ex.text, "42")
        self.assertEqual(ex.execution_count, first.execution_count + 1)
        self.assertTrue(ex.results[0].is_main_result)
        self.assertEqual(ex.results[0].formats(), ["text"])

        # Output reaches the callbacks as it is printed, long before the cell ends.
        seen: list[tuple[float, OutputMessage]] = []
        started = time.monotonic()
        ex = sb.run_code("import sys, time\nprint('a', flush=True)\nprint('e', file=sys.stderr, flush=True)\n"
                         "time.sleep(1.5)\nprint('b')",
                         on_stdout=lambda m: seen.append((time.monotonic() - started, m)),
                         on_stderr=lambda m: seen.append((time.monotonic() - started, m)))
        took = time.monotonic() - started
        self.assertEqual("".join(ex.logs.stdout), "a\nb\n")
        self.assertEqual("".join(ex.logs.stderr), "e\n")
        self.assertEqual("".join(m.line for _, m in seen if not m.error), "a\nb\n")
        self.assertEqual([m.line for _, m in seen if m.error], ["e\n"])
        first_at = next(t for t, m in seen if m.line.startswith("a"))
        self.assertLess(first_at, took - 1.0, f"'a' arrived at {first_at:.2f}s of {took:.2f}s: not streamed")

        errors: list[ExecutionError] = []
        ex = sb.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
        self.assertIsNotNone(ex.error)
        assert ex.error is not None
        self.assertEqual((ex.error.name, ex.error.value), ("ZeroDivisionError", "division by zero"))
        self.assertIn("return 1 / 0", ex.error.traceback)
        self.assertIn("ZeroDivisionError", ex.error.traceback)
        self.assertEqual(errors, [ex.error])
        self.assertIsNone(ex.text)
        # The failed cell left the context as it was.
        self.assertEqual(sb.run_code("x").text, "41")

    def test_code_timeout_interrupts_and_keeps_variables(self) -> None:
        sb = self.enter(self.roche.create(image=harness.image()))
        sb.run_code("kept = 'yes'")
        started = time.monotonic()
        ex = sb.run_code("while True:\n    pass", timeout=2)
        self.assertLess(time.monotonic() - started, 30)
        self.assertTrue(ex.timed_out)
        assert ex.error is not None
        self.assertEqual(ex.error.name, "KeyboardInterrupt")
        self.assertEqual(sb.run_code("kept").text, "'yes'")

    def test_code_contexts_list_restart_remove(self) -> None:
        sb = self.enter(self.roche.create(image=harness.image()))
        sb.run_code("where = 'default'")
        ctx = sb.create_code_context(cwd="/tmp")
        self.assertIsInstance(ctx, Context)
        self.assertEqual(ctx.language, "python")
        self.assertTrue(ctx.id)
        self.assertEqual(sb.run_code("import os; where = os.getcwd(); where", context=ctx).text, "'/tmp'")
        self.assertEqual(sb.run_code("where").text, "'default'")
        listed = {c.id: c for c in sb.list_code_contexts()}
        self.assertIn(ctx.id, listed)
        self.assertEqual(sum(c.default for c in listed.values()), 1)
        self.assertFalse(listed[ctx.id].default)

        sb.restart_code_context(ctx)
        ex = sb.run_code("where", context=ctx.id)
        assert ex.error is not None
        self.assertEqual(ex.error.name, "NameError")

        sb.remove_code_context(ctx.id)
        self.assertNotIn(ctx.id, [c.id for c in sb.list_code_contexts()])
        with self.assertRaises(RocheError):
            sb.run_code("1", context=ctx)
        with self.assertRaises(InvalidConfig):
            sb.run_code("1", language="cobol")

    def test_code_context_fork(self) -> None:
        sb = self.enter(self.roche.create(image=harness.image()))
        ctx = sb.create_code_context()
        sb.run_code("x = 1", context=ctx)
        forked = sb.fork_code_context(ctx)
        self.assertIsInstance(forked, Context)
        self.assertNotEqual(forked.id, ctx.id)
        self.assertIn(forked.id, [c.id for c in sb.list_code_contexts()])
        # The same variables, then each goes on apart.
        self.assertEqual(sb.run_code("x", context=forked).text, "1")
        sb.run_code("x = 2", context=forked)
        self.assertEqual(sb.run_code("x", context=ctx).text, "1")
        self.assertEqual(sb.run_code("x", context=forked).text, "2")
        with self.assertRaises(RocheError):
            sb.fork_code_context("no-such-context")

    def test_code_rich_results(self) -> None:
        sb = self.enter(self.roche.create(image=harness.image()))
        streamed: list[Result] = []
        ex = sb.run_code(CHART, on_result=streamed.append)
        self.assertIsNone(ex.error, ex.error and ex.error.traceback)
        pngs = [r for r in ex.results if r.png]
        self.assertEqual(len(pngs), 1, ex.results)
        self.assertEqual(png_size(pngs[0].png or ""), (200, 150))
        self.assertIn("png", pngs[0].formats())
        self.assertEqual(streamed, ex.results)

        ex = sb.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})")
        self.assertIsNone(ex.error, ex.error and ex.error.traceback)
        main = ex.results[-1]
        self.assertTrue(main.is_main_result)
        self.assertIn("<table", main.html or "")
        self.assertIn("html", main.formats())
        self.assertIn("a  b", ex.text or "")


class CodeThroughCLI(CodeThroughDaemon):
    transport = "cli"


class AsyncCodeThroughDaemon(harness.SandboxTestCase):
    transport = "daemon"

    def test_async_code(self) -> None:
        async def main() -> None:
            roche = AsyncRoche(transport=self.transport)
            self.assertEqual(await roche.transport(), self.transport)
            async with (await roche.create(image=harness.image())) as sb:
                await sb.run_code("x = 41")
                ex = await sb.run_code("x + 1")
                self.assertEqual(ex.text, "42")

                got: list[Any] = []

                async def on_stdout(m: OutputMessage) -> None:
                    await asyncio.sleep(0)
                    got.append(m.line)

                ex = await sb.run_code("print('hi')\n1 / 0", on_stdout=on_stdout, on_error=got.append)
                assert ex.error is not None
                self.assertEqual(ex.error.name, "ZeroDivisionError")
                self.assertEqual(got, ["hi\n", ex.error])

                ex = await sb.run_code("while True:\n    pass", timeout=2)
                self.assertTrue(ex.timed_out)
                self.assertEqual((await sb.run_code("x")).text, "41")

                ctx = await sb.create_code_context()
                await sb.run_code("x = 'other'", context=ctx)
                self.assertEqual((await sb.run_code("x", context=ctx)).text, "'other'")
                self.assertIn(ctx.id, [c.id for c in await sb.list_code_contexts()])
                await sb.restart_code_context(ctx)
                await sb.remove_code_context(ctx)
                self.assertNotIn(ctx.id, [c.id for c in await sb.list_code_contexts()])

                ex = await sb.run_code(CHART)
                self.assertEqual(png_size(next(r.png for r in ex.results if r.png) or ""), (200, 150))
            roche.close()

        asyncio.run(main())


class AsyncCodeThroughCLI(AsyncCodeThroughDaemon):
    transport = "cli"


if __name__ == "__main__":
    unittest.main()
