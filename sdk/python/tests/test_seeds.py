"""The seed documents' Python snippets, verbatim but for the image (a local one: no
registry is reachable), through the daemon and through the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import textwrap
from typing import Any, Iterator
from unittest import mock

import harness

import roche_sandbox
from roche_sandbox import _async, _sync

HELLO = '''
from roche_sandbox import Roche
with Roche().create(image="python:3.12-slim") as sandbox:
    result = sandbox.exec(["python3", "-c", "print('hello')"])
    print(result.stdout)
'''

ASYNC = '''
from roche_sandbox import AsyncRoche
async def run_code(code: str) -> str:
    roche = AsyncRoche()
    async with (await roche.create()) as sandbox:
        result = await sandbox.exec(["python3", "-c", code])
        return result.stdout
'''

PROVIDERS = '''
# Docker (default)
roche = Roche(provider="docker")
# Firecracker microVMs (stronger isolation)
roche = Roche(provider="firecracker")
# WebAssembly (lightweight, fast)
roche = Roche(provider="wasm")
'''

OVERRIDES = '''
sandbox = roche.create(
    image="python:3.12-slim",
    network=True, # enable network
    writable=True, # writable filesystem
    timeout_secs=600, # longer timeout
    memory="1g", # memory limit
    cpus=2.0, # CPU limit
)
'''

GETTING_STARTED = '''
from roche_sandbox import Roche
with Roche().create() as sandbox:
    out = sandbox.exec(["python3", "-c", "import sys; print(sys.version)"])
    print(out.stdout)
'''


def local(snippet: str) -> str:
    return textwrap.dedent(snippet).replace('"python:3.12-slim"', repr(harness.image()))


class SeedsThroughDaemon(harness.SandboxTestCase):
    transport = "daemon"

    @contextlib.contextmanager
    def transport_env(self) -> Iterator[list[str]]:
        """Points Roche() at the daemon (or at nothing, for the CLI) and records the
        transport every Roche and AsyncRoche chose."""
        chosen: list[str] = []
        socket = harness.daemon().socket if self.transport == "daemon" else harness.dead_socket()
        sync_choose, async_choose = _sync.Roche._choose, _async.AsyncRoche._choose

        def record(self_: Any) -> Any:
            t = sync_choose(self_)
            chosen.append(t.name)
            return t

        async def arecord(self_: Any) -> Any:
            t = await async_choose(self_)
            chosen.append(t.name)
            return t

        with mock.patch.dict(os.environ, {"ROCHE_SOCKET": socket}), \
                mock.patch.object(_sync.Roche, "_choose", record), \
                mock.patch.object(_async.AsyncRoche, "_choose", arecord):
            yield chosen
        self.assertTrue(chosen, "no Roche was used")
        self.assertEqual(set(chosen), {self.transport})

    def run_snippet(self, snippet: str, namespace: dict[str, Any]) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(local(snippet), "<seed>", "exec"), namespace)
        return out.getvalue()

    def test_hello(self) -> None:
        with self.transport_env():
            self.assertEqual(self.run_snippet(HELLO, {}), "hello\n\n")

    def test_async_run_code(self) -> None:
        ns: dict[str, Any] = {}
        with self.transport_env():
            self.run_snippet(ASYNC, ns)
            self.assertEqual(asyncio.run(ns["run_code"]("print(6 * 7)")), "42\n")

    def test_provider_swap(self) -> None:
        ns: dict[str, Any] = {"Roche": roche_sandbox.Roche}
        self.run_snippet(PROVIDERS, ns)
        self.assertEqual(ns["roche"].provider, "wasm")
        with self.transport_env():
            ns = {"Roche": roche_sandbox.Roche}
            self.run_snippet(PROVIDERS.split("# Firecracker")[0], ns)
            with ns["roche"].create(image=harness.image()) as sandbox:
                self.assertEqual(sandbox.exec(["python3", "-c", "print('hi')"]).stdout, "hi\n")

    def test_overrides(self) -> None:
        with self.transport_env():
            ns: dict[str, Any] = {"roche": roche_sandbox.Roche()}
            self.run_snippet(OVERRIDES, ns)
            with ns["sandbox"] as sandbox:
                # A writable root, and a lifetime of about 600 s.
                r = sandbox.exec(["sh", "-c", "grep ' / ' /proc/mounts"], timeout=30)
                self.assertRegex(r.stdout, r" / \S+ rw[, ]", r)
                life = _sync.remaining_life(sandbox.info)
                self.assertIsNotNone(life)
                assert life is not None
                self.assertGreater(life, 500)

    def test_getting_started(self) -> None:
        with self.transport_env():
            self.assertRegex(self.run_snippet(GETTING_STARTED, {}), r"^3\.\d+\.\d+")


class SeedsThroughCLI(SeedsThroughDaemon):
    transport = "cli"

