"""Leases: a sandbox the SDK creates goes within seconds of its creating process's end,
however it ends, through both transports. Each test runs a child Python process that
uses the SDK as the seeds do, kills it outright (SIGKILL: no Python cleanup runs), and
watches the sandbox on the Docker engine."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from typing import Any

import harness

from roche_sandbox import Roche, SandboxNotFound, SandboxTimeout, _wire
from roche_sandbox._discovery import Endpoint
from roche_sandbox._http import Deadline
from roche_sandbox._lease import DaemonHold

SRC = os.path.join(harness.REPO, "sdk", "python", "src")

#: How long after its creator's kill a leased sandbox must be gone: the lease's grace is
#: 3 s, the issue asks for 5 s, and the engine's removal is shared with other tests.
GONE_WITHIN = 10.0
#: Longer than anything that would end a sandbox wrongly: the lease's grace (3 s) and
#: roched's wait for the first Hold of a leased sandbox (10 s), with margin.
OUTLIVES = 14.0

SYNC = '''
import sys, time
from roche_sandbox import Roche
with Roche(transport=sys.argv[1]).create(image=sys.argv[2]) as sb:
    print(sb.id, flush=True)
    time.sleep(600)
'''

ASYNC = '''
import asyncio, sys
from roche_sandbox import AsyncRoche
async def main():
    roche = AsyncRoche(transport=sys.argv[1])
    async with (await roche.create(image=sys.argv[2])) as sb:
        print(sb.id, flush=True)
        await asyncio.sleep(600)
asyncio.run(main())
'''

# The async API's sandbox outlives the event loop that created it: it is held by the
# process, not by a task.
ASYNC_LOOP_ENDS = '''
import asyncio, sys, time
from roche_sandbox import AsyncRoche
roche = AsyncRoche(transport=sys.argv[1])
sb = asyncio.run(roche.create(image=sys.argv[2]))
print(sb.id, flush=True)
time.sleep(600)
'''

RESET = '''
import sys, time
from roche_sandbox import Roche
with Roche(transport=sys.argv[1]).create(image=sys.argv[2]) as sb:
    print(sb.id, flush=True)
    sb.reset()
    print(sb.id, flush=True)
    time.sleep(600)
'''

# A child forked while the sandbox is held (multiprocessing's default on Linux) does
# not keep it alive after its parent dies: its copies of the connection or pipe are closed.
FORKED = '''
import os, sys, time
from roche_sandbox import Roche
with Roche(transport=sys.argv[1]).create(image=sys.argv[2]) as sb:
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    print(sb.id, pid, flush=True)
    time.sleep(600)
'''

KEPT = '''
import sys, time
from roche_sandbox import Roche
sb = Roche(transport=sys.argv[1]).create(image=sys.argv[2], leased=False)
print(sb.id, flush=True)
time.sleep(600)
'''


def kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def exists(sid: str) -> bool:
    """Whether the sandbox's container exists on the engine, in any state."""
    out = subprocess.run(["docker", "ps", "-aq", "--no-trunc", "--filter", f"id={sid}"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return sid in out.split()


class Child:
    """A Python process running a script with the SDK, killed at the end of the test."""

    def __init__(self, test: Any, script: str) -> None:
        self.test = test
        self.err = tempfile.TemporaryFile()
        env = {**os.environ, "PYTHONPATH": SRC}
        self.proc = subprocess.Popen([sys.executable, "-c", script, test.transport, harness.image()],
                                     stdout=subprocess.PIPE, stderr=self.err, env=env)
        test.addCleanup(self.close)
        self._buf = b""

    def line(self, limit: float = 120) -> str:
        """The next line it prints."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + limit
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                self.test.fail(f"the child printed no line within {limit:g} s: {self.stderr()}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def sandbox(self) -> str:
        """The id of a sandbox it printed, destroyed at the end of the test whatever happens."""
        sid = self.line()
        self.test.addCleanup(self.test.destroy, sid)
        self.test.assertTrue(exists(sid), f"the child's sandbox {sid} does not exist")
        return sid

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.err.close()


class FakeHoldServer:
    """A unix socket answering Hold calls as a script says, one entry per connection:
    "cut" sends one message and closes the connection, "gone" one message and an
    end-of-stream with NOT_FOUND, "hold" one message and keeps the stream open, "drop"
    closes the connection before any answer (a replica killed under it). For the
    retry logic only: the real thing is tested against roched below."""

    def __init__(self, script: list[str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="roche-fake-hold-")
        self.socket = os.path.join(self.dir, "hold.sock")
        self.server = socketlib.socket(socketlib.AF_UNIX)
        self.server.bind(self.socket)
        self.server.listen(4)
        self.script = list(script)
        self.calls: list[bytes] = []
        self.closed = threading.Event()  # a "hold" connection was closed by the client
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.script:
            try:
                c, _ = self.server.accept()
            except OSError:
                return
            what = self.script.pop(0)
            try:
                self._answer(c, what)
            except OSError:
                pass  # the client went first (it stops reading at the end of the stream)
            finally:
                c.close()

    def _answer(self, c: socketlib.socket, what: str) -> None:
        self.calls.append(self._request(c))
        if what == "drop":
            return
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        self._chunk(c, _wire.envelope({}))
        if what == "gone":
            self._chunk(c, _wire.envelope({"error": {"code": "not_found", "message": "not found: no sandbox x"}},
                                          _wire.END_STREAM))
            c.sendall(b"0\r\n\r\n")
        elif what == "hold":
            c.settimeout(30)
            if c.recv(1) == b"":
                self.closed.set()

    @staticmethod
    def _request(c: socketlib.socket) -> bytes:
        """The whole request (headers, then a Content-Length body), so that none is left
        unread when the connection closes."""
        def more() -> bytes:
            b = c.recv(65536)
            if not b:
                raise ConnectionResetError("the client closed the connection mid-request")
            return b

        data = b""
        while b"\r\n\r\n" not in data:
            data += more()
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        while len(body) < length:
            body += more()
        return head + b"\r\n\r\n" + body

    @staticmethod
    def _chunk(c: socketlib.socket, data: bytes) -> None:
        c.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    def close(self) -> None:
        self.server.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class DaemonHoldLogic(unittest.TestCase):
    """DaemonHold's retries and release, against FakeHoldServer."""

    def hold(self, script: list[str]) -> tuple[FakeHoldServer, DaemonHold]:
        server = FakeHoldServer(script)
        self.addCleanup(server.close)
        h = DaemonHold(Endpoint(socket=server.socket), "x")
        self.addCleanup(h.release)
        h.start(Deadline(10))
        return server, h

    def wait_ended(self, h: DaemonHold) -> None:
        deadline = time.monotonic() + 10
        while not h.ended():
            self.assertLess(time.monotonic(), deadline, "the hold did not end")
            time.sleep(0.05)

    def test_a_cut_hold_is_taken_again_until_the_sandbox_is_gone(self) -> None:
        server, h = self.hold(["cut", "cut", "gone"])
        self.wait_ended(h)
        self.assertEqual(len(server.calls), 3)
        self.assertTrue(all(c.startswith(b"POST /roche.v1.SandboxService/Hold ") for c in server.calls), server.calls)
        self.assertIn(b'{"sandboxId":"x"}', server.calls[0])
        self.assertIsInstance(h.error, SandboxNotFound)

    def test_release_closes_the_stream(self) -> None:
        server, h = self.hold(["hold"])
        self.assertFalse(h.ended())
        h.release()
        self.wait_ended(h)
        self.assertTrue(server.closed.wait(10), "the Hold connection stayed open after release()")
        self.assertEqual(len(server.calls), 1)

    def test_a_first_hold_cut_before_any_answer_is_taken_again(self) -> None:
        # The create reached roched, then the Hold's connection was lost: taken again
        # (through a Service, to another replica), as the Go client does.
        server, h = self.hold(["drop", "hold"])
        self.assertFalse(h.ended())
        self.assertEqual(len(server.calls), 2)

    def test_a_hold_refused_throughout_fails_the_start_at_its_deadline(self) -> None:
        server = FakeHoldServer([])
        self.addCleanup(server.close)
        server.server.close()  # its socket file stays, refusing connections: roched gone
        h = DaemonHold(Endpoint(socket=server.socket), "x")
        start = time.monotonic()
        with self.assertRaises(SandboxTimeout):
            h.start(Deadline(1))
        self.assertLess(time.monotonic() - start, 5)
        self.wait_ended(h)  # start let go: the retries stop


class LeaseCases(harness.SandboxTestCase):
    """The cases both transports pass (run by the subclasses below)."""

    transport = ""

    def destroy(self, sid: str) -> None:
        roche = Roche(transport=self.transport)
        try:
            roche.get(sid).destroy()
        except SandboxNotFound:
            pass
        finally:
            roche.close()

    def assert_gone_within(self, sid: str, limit: float, since: float) -> float:
        while exists(sid):
            if time.monotonic() - since > limit:
                self.fail(f"sandbox {sid} still exists {limit:g} s later")
            time.sleep(0.2)
        return time.monotonic() - since

    def killed_creator_leaves_no_sandbox(self, script: str, what: str) -> None:
        child = Child(self, script)
        sid = child.sandbox()
        child.kill()
        took = self.assert_gone_within(sid, GONE_WITHIN, time.monotonic())
        print(f"[{self.transport}, {what}: gone {took:.1f} s after SIGKILL of its creator] ", end="", file=sys.stderr)

    def test_killed_creator_leaves_no_sandbox(self) -> None:
        self.killed_creator_leaves_no_sandbox(SYNC, "sync")

    def test_killed_async_creator_leaves_no_sandbox(self) -> None:
        self.killed_creator_leaves_no_sandbox(ASYNC, "async")

    def test_async_sandbox_outlives_its_event_loop(self) -> None:
        child = Child(self, ASYNC_LOOP_ENDS)
        sid = child.sandbox()
        time.sleep(OUTLIVES)
        self.assertTrue(exists(sid), "a sandbox went with the event loop that created it, its process alive")
        child.kill()
        self.assert_gone_within(sid, GONE_WITHIN, time.monotonic())

    def test_reset_sandbox_is_held_too(self) -> None:
        child = Child(self, RESET)
        first = child.sandbox()
        second = child.sandbox()
        self.assertNotEqual(first, second)
        time.sleep(OUTLIVES)
        self.assertTrue(exists(second), "the sandbox a reset made went while its creator lived")
        self.assertFalse(exists(first), "reset left the old sandbox")
        child.kill()
        self.assert_gone_within(second, GONE_WITHIN, time.monotonic())

    def test_forked_child_does_not_keep_the_sandbox(self) -> None:
        child = Child(self, FORKED)
        sid, pid = child.line().split()
        self.addCleanup(self.destroy, sid)
        self.addCleanup(kill_quietly, int(pid))
        child.kill()
        self.assert_gone_within(sid, GONE_WITHIN, time.monotonic())
        os.kill(int(pid), 0)  # the forked child still runs

    def test_unleased_sandbox_outlives_its_creator(self) -> None:
        child = Child(self, KEPT)
        sid = child.sandbox()
        child.kill()
        time.sleep(OUTLIVES)
        self.assertTrue(exists(sid), "a sandbox created with leased=False went with its creator")
        # Another process finds it, and destroys it.
        roche = Roche(transport=self.transport)
        self.addCleanup(roche.close)
        roche.get(sid).destroy()
        with self.assertRaises(SandboxNotFound):
            roche.get(sid)
        self.assert_gone_within(sid, GONE_WITHIN, time.monotonic())

    def test_close_lets_go_of_leased_sandboxes_only(self) -> None:
        roche = Roche(transport=self.transport)
        kept = roche.create(image=harness.image(), leased=False)
        self.addCleanup(self.destroy, kept.id)
        held = roche.create(image=harness.image())
        self.addCleanup(self.destroy, held.id)
        roche.close()
        self.assert_gone_within(held.id, GONE_WITHIN, time.monotonic())
        self.assertTrue(exists(kept.id), "close() destroyed a sandbox created with leased=False")


class LeaseThroughDaemon(LeaseCases):
    transport = "daemon"

    def test_stopped_interpreter_keeps_its_sandbox(self) -> None:
        # What holds the sandbox is an open connection, not Python code: a process that
        # runs nothing at all for longer than roched's heartbeat (15 s) plus the lease's
        # grace keeps its sandbox. (Through the CLI, the holder is another process.)
        child = Child(self, SYNC)
        sid = child.sandbox()
        child.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(20)
            self.assertTrue(exists(sid), "the sandbox of a stopped (living) process went")
        finally:
            child.proc.send_signal(signal.SIGCONT)
        child.kill()
        self.assert_gone_within(sid, GONE_WITHIN, time.monotonic())


class LeaseThroughCLI(LeaseCases):
    transport = "cli"


del LeaseCases  # only its subclasses run
