"""Durable commands (sandbox.commands) against real sandboxes: through the real roched
and through the CLI transport, sync and async. A command belongs to the sandbox: it
outlives the SDK process that started it (killed with SIGKILL here) and a roched killed
and restarted under a waiting handle, which reconnects from its offsets."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket as socket_
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import harness

from roche_sandbox import (AsyncRoche, CommandHandle, CommandResult, InvalidConfig, OutputGone, Roche,
                           SandboxNotFound)

COUNTER = "i=1; while [ $i -le {n} ]; do echo \"line $i\"; i=$((i+1)); sleep 0.1; done; echo bye >&2; exit 3"


def lines(n: int) -> str:
    return "".join(f"line {i}\n" for i in range(1, n + 1))


class CommandsThroughDaemon(harness.SandboxTestCase):
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

    def sandbox(self):  # type: ignore[no-untyped-def]
        return self.enter(self.roche.create(image=harness.image()))

    def test_run_foreground(self) -> None:
        sb = self.sandbox()
        seen: list[str] = []
        r = sb.commands.run("echo hi; echo err >&2; exit 3", on_stdout=seen.append)
        self.assertIsInstance(r, CommandResult)
        self.assertEqual((r.stdout, r.stderr, r.exit_code, r.unknown), ("hi\n", "err\n", 3, ""))
        self.assertEqual("".join(seen), "hi\n")
        self.assertFalse(r.ok)
        self.assertEqual(r.error, "exit status 3")
        # An argv, the working directory and the environment.
        r = sb.commands.run(["sh", "-c", 'echo "$WHO $(pwd)"'], cwd="/tmp", envs={"WHO": "me"})
        self.assertEqual((r.stdout, r.exit_code), ("me /tmp\n", 0))
        self.assertTrue(r.ok)
        # A program that is not there is a shell's answer, not an exception.
        r = sb.commands.run(["no-such-program"])
        self.assertEqual(r.exit_code, 127, r)
        self.assertIn("command not found", r.stderr)
        # The timeout kills it.
        r = sb.commands.run("sleep 30", timeout=1)
        self.assertTrue(r.timed_out, r)
        self.assertLess(r.duration, 20)

    def test_background_handle(self) -> None:
        sb = self.sandbox()
        h = sb.commands.run(COUNTER.format(n=5), background=True, tag="count")
        self.assertIsInstance(h, CommandHandle)
        self.assertGreater(h.pid, 0)
        listed = {c.pid: c for c in sb.commands.list()}
        self.assertIn(h.pid, listed)
        self.assertEqual(listed[h.pid].tag, "count")
        got = bytearray()
        next_offset = 0
        for ev in h:
            if ev.stream == "stdout":
                self.assertEqual(ev.offset, next_offset, "a piece did not follow the one before")
                got += ev.data
                next_offset = ev.offset + len(ev.data)
        self.assertEqual(got.decode(), lines(5))
        assert h.result is not None
        self.assertEqual((h.result.exit_code, h.result.stderr), (3, "bye\n"))
        self.assertEqual(h.wait().exit_code, 3)
        ended = {c.pid: c for c in sb.commands.list()}[h.pid]
        self.assertEqual((ended.running, ended.exit_code, ended.stdout_bytes), (False, 3, len(lines(5))))

    def test_stdin_kill_and_signal(self) -> None:
        sb = self.sandbox()
        h = sb.commands.run("while read l; do echo got:$l; done; echo eof", background=True, stdin=True)
        h.send_stdin("a\n")
        sb.commands.send_stdin(h.pid, b"b\n")
        h.close_stdin()
        self.assertEqual(h.wait().stdout, "got:a\ngot:b\neof\n")
        # Callbacks get the output as it comes, from the handle's reader.
        out: list[str] = []
        done = threading.Event()

        def on_stdout(text: str) -> None:
            out.append(text)
            if "ready" in "".join(out):
                done.set()

        h = sb.commands.run("echo ready; sleep 300", background=True, on_stdout=on_stdout, tag="sleeper")
        self.assertTrue(done.wait(30), out)
        self.assertTrue(sb.commands.kill(tag="sleeper"))
        r = h.wait(timeout=30)
        self.assertEqual((r.signal, r.exit_code), (9, 137), r)
        self.assertFalse(sb.commands.kill(h.pid), "a second kill found the command running")
        h = sb.commands.run("trap 'echo term; exit 4' TERM; echo set; while :; do sleep 0.1; done", background=True)
        for ev in h:
            if "set" in ev.text:
                break
        sb.commands.signal(h.pid, "TERM")
        r = h.wait(timeout=30)
        self.assertEqual((r.exit_code, r.stdout), (4, "set\nterm\n"))

    def test_connect_from_offsets(self) -> None:
        sb = self.sandbox()
        h = sb.commands.run(COUNTER.format(n=3), background=True)
        h.wait()
        again = sb.commands.connect(h.pid, stdout_offset=len("line 1\n"), stderr_offset=0)
        r = again.wait()
        self.assertEqual((r.stdout, r.stderr, r.exit_code), ("line 2\nline 3\n", "bye\n", 3))
        # Past the window: the first offset still kept, never a silent skip.
        big = sb.commands.run("head -c 5000 /dev/zero", background=True, window=1000)
        deadline = time.monotonic() + 30
        while any(c.pid == big.pid and c.running for c in sb.commands.list()) and time.monotonic() < deadline:
            time.sleep(0.05)  # waited for by the list: a handle from 0 would fall behind the 1000 bytes kept
        with self.assertRaises(OutputGone) as cm:
            sb.commands.connect(big.pid).wait()
        self.assertIn("4000", str(cm.exception))
        info = {c.pid: c for c in sb.commands.list()}[big.pid]
        self.assertEqual((info.first_stdout, info.stdout_bytes, info.window), (4000, 5000, 1000))
        self.assertEqual(len(sb.commands.connect(big.pid, stdout_offset=info.first_stdout).wait().stdout), 1000)
        with self.assertRaises(SandboxNotFound):
            sb.commands.connect(999999).wait()
        with self.assertRaises(InvalidConfig):
            sb.commands.connect(None)
        with self.assertRaises(InvalidConfig):
            sb.commands.run("true", window=1 << 40)

    def test_idempotency_key(self) -> None:
        sb = self.sandbox()
        script = "echo x >> /tmp/runs; wc -l < /tmp/runs"
        first = sb.commands.run(script, idempotency_key="once")
        again = sb.commands.run(script, idempotency_key="once")
        self.assertEqual((first.stdout, again.stdout), ("1\n", "1\n"), "a retried run started its command twice")
        self.assertEqual(sb.commands.run("wc -l < /tmp/runs").stdout, "1\n")

    def test_outlives_the_sdk_process(self) -> None:
        """An SDK process starts a command and is killed (SIGKILL); another process's
        connect replays it all and gets its real exit code."""
        sb = self.enter(self.roche.create(image=harness.image(), leased=False))
        child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {os.path.join(harness.REPO, "sdk", "python", "src")!r})
            from roche_sandbox import Roche
            sb = Roche(transport={self.transport!r}).get({sb.id!r})
            h = sb.commands.run({COUNTER.format(n=20)!r}, background=True)
            print(h.pid, flush=True)
            for ev in h:
                print(ev.offset, flush=True)  # the test kills this process while it reads
        """)], stdout=subprocess.PIPE, text=True)
        self.addCleanup(child.kill)
        assert child.stdout is not None
        pid = int(child.stdout.readline())
        child.stdout.readline()  # it has read some output
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        r = sb.commands.connect(pid).wait(timeout=60)
        self.assertEqual((r.stdout, r.stderr, r.exit_code), (lines(20), "bye\n", 3))


class CommandsThroughCLI(CommandsThroughDaemon):
    transport = "cli"


class DroppingProxy:
    """Relays a unix socket to roched's, and cuts the connection of the first
    StartCommand as its answer comes back: roched has started the command, and the SDK
    never hears of it, as when a connection drops at the worst moment."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.dir = tempfile.mkdtemp(prefix="roche-proxy-")
        self.socket = os.path.join(self.dir, "proxy.sock")
        self.listener = socket_.socket(socket_.AF_UNIX)
        self.listener.bind(self.socket)
        self.listener.listen(16)
        self.dropped = threading.Event()
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
            starting = threading.Event()
            threading.Thread(target=self._up, args=(client, server, starting), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client, starting), daemon=True).start()

    def _up(self, client: socket_.socket, server: socket_.socket, starting: threading.Event) -> None:
        while True:
            try:
                b = client.recv(1 << 16)
            except OSError:
                b = b""
            if not b:
                server.close()
                return
            if b"/roche.v1.SandboxService/StartCommand" in b and not self.dropped.is_set():
                starting.set()
            try:
                server.sendall(b)
            except OSError:
                return

    def _down(self, server: socket_.socket, client: socket_.socket, starting: threading.Event) -> None:
        while True:
            try:
                b = server.recv(1 << 16)
            except OSError:
                b = b""
            if b and starting.is_set() and not self.dropped.is_set():
                self.dropped.set()
                b = b""  # the answer is lost
            if not b:
                client.shutdown(socket_.SHUT_RDWR)
                client.close()
                server.close()
                return
            try:
                client.sendall(b)
            except OSError:
                return


class CommandsRetriedStart(harness.SandboxTestCase):
    """A run whose StartCommand answer is lost (its connection cut as the answer comes)
    starts its command once: the SDK asks again with the same idempotency key, and
    roched's agent answers with the command the first ask started. The async API makes
    a connection per call, so its ask again is the SDK's own (the sync API's kept
    connections may also resend a request cut on a reused connection)."""

    SCRIPT = "echo x >> /tmp/runs; wc -l < /tmp/runs"

    def test_lost_answer_starts_once(self) -> None:
        proxy = DroppingProxy(harness.daemon().socket)
        self.addCleanup(proxy.close)
        roche = Roche(transport="daemon", socket=proxy.socket)
        self.addCleanup(roche.close)
        sb = self.enter(roche.create(image=harness.image()))
        r = sb.commands.run(self.SCRIPT)
        self.assertTrue(proxy.dropped.is_set(), "the proxy never cut a StartCommand")
        self.assertEqual((r.exit_code, r.stdout), (0, "1\n"), "the command ran twice (or not at all)")
        self.assertEqual(len([c for c in sb.commands.list() if "/tmp/runs" in " ".join(c.argv)]), 1)

    def test_lost_answer_starts_once_async(self) -> None:
        proxy = DroppingProxy(harness.daemon().socket)
        self.addCleanup(proxy.close)

        async def main() -> None:
            roche = AsyncRoche(transport="daemon", socket=proxy.socket)
            try:
                async with (await roche.create(image=harness.image())) as sb:
                    r = await sb.commands.run(self.SCRIPT)
                    self.assertTrue(proxy.dropped.is_set(), "the proxy never cut a StartCommand")
                    self.assertEqual((r.exit_code, r.stdout), (0, "1\n"), "the command ran twice (or not at all)")
            finally:
                roche.close()

        asyncio.run(main())
