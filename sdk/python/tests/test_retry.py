"""The SDK's retries of calls safe to repeat (_retry.py), against the real roched: a
create whose answer is lost (its connection cut as the answer comes back, as when a
replica dies) is asked again with the same idempotency key and makes one sandbox, not
two; a roched killed outright (SIGKILL) under an exec with an idempotency key, a list
and a destroy, and another started on the same socket, has each of those calls succeed
once it answers, the command run once. A call roched refused is not retried."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket as socket_
import tempfile
import threading
import time
import unittest
import uuid
from typing import Any, Callable

import harness

from roche_sandbox import AsyncRoche, ProviderUnavailable, Roche, RocheError, SandboxNotFound
from roche_sandbox import _retry
from roche_sandbox._deadline import Deadline


class CuttingProxy:
    """Relays a unix socket to roched's, and cuts the connection of the first call to
    method as its answer comes back: roched has done the call, and the SDK never hears
    of it. Counts the calls to method it relays."""

    def __init__(self, target: str, method: str) -> None:
        self.target = target
        self.marker = f"/roche.v1.SandboxService/{method} ".encode()
        self.dir = tempfile.mkdtemp(prefix="roche-proxy-")
        self.socket = os.path.join(self.dir, "proxy.sock")
        self.listener = socket_.socket(socket_.AF_UNIX)
        self.listener.bind(self.socket)
        self.listener.listen(16)
        self.cut = threading.Event()
        self.calls = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket_.socket(socket_.AF_UNIX)
            server.connect(self.target)
            asked = threading.Event()
            threading.Thread(target=self._up, args=(client, server, asked), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, asked), daemon=True).start()

    def _up(self, client: socket_.socket, server: socket_.socket, asked: threading.Event) -> None:
        while True:
            try:
                b = client.recv(1 << 16)
            except OSError:
                b = b""
            if not b:
                server.close()
                return
            if self.marker in b:
                with self._lock:
                    self.calls += 1
                if not self.cut.is_set():
                    asked.set()
            try:
                server.sendall(b)
            except OSError:
                return

    def _down(self, server: socket_.socket, client: socket_.socket, asked: threading.Event) -> None:
        while True:
            try:
                b = server.recv(1 << 16)
            except OSError:
                b = b""
            if b and asked.is_set() and not self.cut.is_set():
                self.cut.set()
                b = b""  # the answer is lost
            if not b:
                try:
                    client.shutdown(socket_.SHUT_RDWR)
                except OSError:
                    pass
                client.close()
                server.close()
                return
            try:
                client.sendall(b)
            except OSError:
                return


def in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    """Runs fn in a thread; the returned function waits for it and returns (or raises)
    what it did."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the waiter
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()

    def wait() -> Any:
        t.join(120)
        if t.is_alive():
            raise AssertionError("the call did not end within 120 s")
        if "error" in out:
            raise out["error"]
        return out["value"]

    return wait


class Retries(harness.SandboxTestCase):

    def labelled(self) -> dict[str, str]:
        return {"sdk-retry-test": uuid.uuid4().hex[:12]}

    def test_lost_create_answer_makes_one_sandbox(self) -> None:
        proxy = CuttingProxy(harness.daemon().socket, "Create")
        self.addCleanup(proxy.close)
        roche = Roche(transport="daemon", socket=proxy.socket)
        self.addCleanup(roche.close)
        label = self.labelled()
        sb = self.enter(roche.create(image=harness.image(), metadata=label))
        self.assertTrue(proxy.cut.is_set(), "the proxy never cut a Create")
        self.assertEqual(proxy.calls, 2, "the SDK did not ask again after the lost answer")
        direct = Roche(transport="daemon")
        self.addCleanup(direct.close)
        made = [s.id for s in direct.list(metadata=label)]
        self.assertEqual(made, [sb.id], "a retried create made another sandbox")
        self.assertEqual(sb.exec(["echo", "hi"]).stdout, "hi\n")

    def test_lost_create_answer_makes_one_sandbox_async(self) -> None:
        proxy = CuttingProxy(harness.daemon().socket, "Create")
        self.addCleanup(proxy.close)
        label = self.labelled()

        async def main() -> None:
            roche = AsyncRoche(transport="daemon", socket=proxy.socket)
            try:
                async with (await roche.create(image=harness.image(), metadata=label)) as sb:
                    self.assertTrue(proxy.cut.is_set(), "the proxy never cut a Create")
                    self.assertEqual(proxy.calls, 2, "the SDK did not ask again after the lost answer")
                    made = [s.id for s in await AsyncRoche(transport="daemon").list(metadata=label)]
                    self.assertEqual(made, [sb.id], "a retried create made another sandbox")
            finally:
                roche.close()

        asyncio.run(main())

    def test_refused_call_is_not_retried(self) -> None:
        """A safe call roched answers with an error is an answer: asked once."""
        proxy = CuttingProxy(harness.daemon().socket, "Inspect")
        proxy.cut.set()  # relay only, counting
        self.addCleanup(proxy.close)
        roche = Roche(transport="daemon", socket=proxy.socket)
        self.addCleanup(roche.close)
        with self.assertRaises(SandboxNotFound):
            roche.get("0123456789ab")
        self.assertEqual(proxy.calls, 1)

    def test_roched_killed_and_restarted_mid_call(self) -> None:
        first = harness.Daemon(name="retried")
        dir_ = first.dir
        second: list[harness.Daemon] = []

        def cleanup() -> None:
            if first.proc.poll() is None:
                first.proc.kill()
                first.proc.wait()
            for d in reversed(second):
                d.stop()
            shutil.rmtree(dir_, ignore_errors=True)

        self.addCleanup(cleanup)
        roche = Roche(transport="daemon", socket=first.socket)
        self.addCleanup(roche.close)
        sb = roche.create(image=harness.image(), leased=False)

        def destroy() -> None:
            r = Roche(transport="daemon", socket=first.socket, request_timeout=10)
            try:
                r.get(sb.id).destroy()
            except RocheError:
                pass  # destroyed by the test, or no roched left to ask
            finally:
                r.close()

        self.addCleanup(destroy)
        # The command marks its start, waits for the test's word (a file) and counts its runs.
        script = ("echo run >> /tmp/runs; touch /tmp/started; "
                  "while [ ! -e /tmp/go ]; do sleep 0.05; done; wc -l < /tmp/runs")
        exec_done = in_thread(lambda: sb.exec(["sh", "-c", script], timeout=60, idempotency_key="once"))
        deadline = time.monotonic() + 60
        while sb.exec(["test", "-e", "/tmp/started"]).exit_code != 0:
            self.assertLess(time.monotonic(), deadline, "the command never started")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait()
        # Calls made while nothing answers: retried until the next roched does.
        list_done = in_thread(lambda: [s.id for s in roche.list()])
        second.append(harness.Daemon(name="retried", dir=dir_))
        self.assertIn(sb.id, list_done(), "the list retried across the restart does not show the sandbox")
        roche.get(sb.id).write_file("/tmp/go", "")
        r = exec_done()
        self.assertEqual((r.exit_code, r.stdout), (0, "1\n"), "the exec retried across the restart ran its command again")
        # A destroy across another kill and restart.
        second[0].proc.send_signal(signal.SIGKILL)
        second[0].proc.wait()
        destroy_done = in_thread(sb.destroy)
        second.append(harness.Daemon(name="retried", dir=dir_))
        destroy_done()
        self.assertNotIn(sb.id, [s.id for s in roche.list()])


class BackoffRules(unittest.TestCase):
    """_retry's rules, as a unit: what is retried, the growing jittered waits, and the
    bounds (RETRY_FOR, and the call's own deadline)."""

    @staticmethod
    def lost(kind: str) -> ProviderUnavailable:
        e = ProviderUnavailable("roched went away")
        e.lost = kind
        return e

    def test_rules(self) -> None:
        b = _retry.Backoff(Deadline(None))
        self.assertIsNone(b.next(ProviderUnavailable("roched's own answer"), True), "an answer was retried")
        self.assertIsNone(b.next(SandboxNotFound("no sandbox"), True))
        self.assertIsNone(b.next(self.lost(_retry.REFUSED), False), "a roched never reached was waited for")
        waits = [b.next(self.lost(_retry.BROKE), False) for _ in range(8)]
        self.assertTrue(all(w is not None for w in waits), waits)
        self.assertTrue(0.05 <= waits[0] <= 0.1 and all(w <= _retry.MAX_DELAY for w in waits), waits)  # type: ignore[operator]
        self.assertGreater(waits[4], waits[0])  # type: ignore[operator]
        self.assertIsNotNone(b.next(self.lost(_retry.REFUSED), True))
        # The call's deadline bounds the waits: none is begun that would outlast it.
        short = _retry.Backoff(Deadline(0.05))
        self.assertIsNone(short.next(self.lost(_retry.BROKE), True))
