"""The synchronous half is written from the asyncio half by sdk/python/unasync.py: the
files checked in are what it makes (so an edit to a source, or by hand to a generated
file, fails here until unasync.py is run), and its rules and directives do what its
docstring says. Needs no sandbox."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import textwrap
import unittest

import harness

_spec = importlib.util.spec_from_file_location("unasync", os.path.join(harness.REPO, "sdk", "python", "unasync.py"))
assert _spec is not None and _spec.loader is not None
unasync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(unasync)


class GeneratedFilesTest(unittest.TestCase):
    def test_the_sync_files_are_what_unasync_makes(self) -> None:
        self.assertEqual(unasync.stale(), [], "the synchronous half is stale: run python3 sdk/python/unasync.py")

    def test_a_stale_file_is_found(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            pkg = shutil.copytree(unasync.PACKAGE, os.path.join(tmp, "roche_sandbox"),
                                  ignore=shutil.ignore_patterns("__pycache__", "_bin"))
            with open(os.path.join(pkg, "_sync.py"), "a", encoding="utf-8") as f:
                f.write("# a hand edit\n")
            with open(os.path.join(pkg, "_atransport.py"), "a", encoding="utf-8") as f:
                f.write("\n\ndef added() -> None:\n    pass\n")
            os.remove(os.path.join(pkg, "_pty.py"))
            self.assertEqual(sorted(unasync.stale(pkg)), ["_pty.py", "_sync.py", "_transport.py"])
            self.assertEqual(sorted(unasync.write(pkg)), ["_pty.py", "_sync.py", "_transport.py"])
            self.assertEqual(unasync.stale(pkg), [])

    def test_the_sync_files_say_they_are_generated(self) -> None:
        for source, target, _ in unasync.FILES:
            with open(os.path.join(unasync.PACKAGE, target), encoding="utf-8") as f:
                self.assertTrue(f.read().startswith(unasync.header(source)), target)


SOURCE = '''\
"""An async module."""

import asyncio  # async only

from . import _aio
from ._ahttp import AsyncHTTPClient


class AsyncThing:
    """A thing. As a context manager (``async with``) it closes."""

    # sync: @property
    async def name(self) -> str:
        return (await self._resolve()).name + str(await self.count(await self.size()))

    async def call(self, items: AsyncIterator[int]) -> AsyncGenerator[int, None]:
        async with self.lock:
            async for i in items:
                yield await self.http.unary("M", {"i": i},
                                            self.deadline)
        try:
            await _aio.in_thread(self.wait)
        except asyncio.CancelledError:  # async only
            raise
        except BaseException:
            await self.aclose()
            raise

    def close(self) -> None:  # async only
        """Only the async half has it."""

        self.task.cancel()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
'''

WANT = '''\

from . import _syncio
from ._http import HTTPClient


class Thing:
    """A thing. As a context manager (``with``) it closes."""

    @property
    def name(self) -> str:
        return self._resolve().name + str(self.count(self.size()))

    def call(self, items: Iterator[int]) -> Generator[int, None, None]:
        with self.lock:
            for i in items:
                yield self.http.unary("M", {"i": i},
                                      self.deadline)
        try:
            _syncio.in_thread(self.wait)
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()
'''


class RulesTest(unittest.TestCase):
    def test_rules_and_directives(self) -> None:
        got = unasync.generate("_athing.py", SOURCE, "A sync module.")
        self.assertEqual(got, unasync.header("_athing.py") + '"""A sync module."""\n' + WANT)

    def test_a_misused_directive_fails_to_generate(self) -> None:
        source = textwrap.dedent('''\
            """M."""
            try:
                pass
            except ValueError:  # async only
                pass
            ''')
        with self.assertRaises(SyntaxError):
            unasync.generate("_am.py", source, "M.")


if __name__ == "__main__":
    unittest.main()
