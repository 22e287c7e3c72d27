"""sandbox.files against real sandboxes, through roched and through the roche CLI, sync
and async: every call, the refusals that keep it to the sandbox user's view (symlinks,
FIFOs, devices, /proc), streaming in bounded memory, and watches."""

from __future__ import annotations

import asyncio
import io
import os
import resource
import threading
import time
import unittest
from typing import Any, Iterator

import harness

from roche_sandbox import (AsyncRoche, EntryInfo, FilesystemEvent, FilesystemEventType, FileType, InvalidConfig,
                           PermissionDenied, ResourceExhausted, Roche, SandboxNotFound)
from roche_sandbox._afiles import AsyncWatchHandle
from roche_sandbox._filesutil import WATCH_QUEUE, Abort, WriteEncoder, read_item, write_response
from roche_sandbox._files import WatchHandle


def rss() -> int:
    """This process's resident memory now, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


class PeakRSS:
    """The highest resident memory seen while it runs (sampled every 10 ms), over what it
    was at the start: ru_maxrss is the whole process's peak, which an earlier test may
    have set higher."""

    def __enter__(self) -> "PeakRSS":
        self.before = self.peak = rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, rss())

    @property
    def grew(self) -> int:
        return self.peak - self.before


def wait_for(handle: Any, name: str, kind: FilesystemEventType, seen: list[FilesystemEvent], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.extend(handle.get_new_events())
        if any(e.name == name and e.type is kind for e in seen):
            return
        time.sleep(0.05)
    raise AssertionError(f"no {kind.value} event for {name!r} within {timeout} s; seen {seen[-8:]}")


class FilesThroughDaemon(harness.SandboxTestCase):
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

    def test_every_call(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            f = sb.files
            info = f.write("/tmp/a/b/hello.txt", "héllo\n", mode=0o640)
            self.assertEqual((info.name, info.type, info.path, info.size, info.mode),
                             ("hello.txt", FileType.FILE, "/tmp/a/b/hello.txt", len("héllo\n".encode()), 0o640))
            self.assertEqual(f.read("/tmp/a/b/hello.txt"), "héllo\n")
            self.assertEqual(f.read("/tmp/a/b/hello.txt", format="bytes"), bytearray("héllo\n".encode()))
            self.assertEqual(b"".join(f.read("/tmp/a/b/hello.txt", format="stream")), "héllo\n".encode())
            st = f.get_info("/tmp/a/b/hello.txt")
            self.assertEqual((st.type, st.mode, st.permissions), (FileType.FILE, 0o640, "-rw-r-----"))
            uid = sb.exec(["id", "-u"]).stdout.strip()
            self.assertEqual(str(st.uid), uid, "a file written through the API is the sandbox user's")
            self.assertIsNotNone(st.modified_time)
            self.assertEqual(f.stat("/tmp/a/b/hello.txt"), st)
            self.assertEqual([(e.path, e.type) for e in f.list("/tmp/a")], [("/tmp/a/b", FileType.DIR)])
            self.assertEqual([e.path for e in f.list("/tmp/a", depth=3)], ["/tmp/a/b", "/tmp/a/b/hello.txt"])
            self.assertTrue(f.exists("/tmp/a/b/hello.txt"))
            self.assertFalse(f.exists("/tmp/a/nothing"))
            self.assertTrue(f.make_dir("/tmp/d/e"))
            self.assertFalse(f.make_dir("/tmp/d/e"), "make_dir of an existing directory is False")
            moved = f.rename("/tmp/a/b/hello.txt", "/tmp/d/e/moved.txt")
            self.assertEqual((moved.path, moved.type, moved.size), ("/tmp/d/e/moved.txt", FileType.FILE, st.size))
            self.assertFalse(f.exists("/tmp/a/b/hello.txt"))
            f.remove("/tmp/d")
            self.assertFalse(f.exists("/tmp/d/e/moved.txt"))
            # A file-like object and an iterable of bytes, streamed.
            f.write("/tmp/from-file", io.BytesIO(b"x" * 300_000))
            f.write("/tmp/from-iter", (bytes([i]) * 1000 for i in range(200)))
            self.assertEqual(f.get_info("/tmp/from-file").size, 300_000)
            self.assertEqual(f.read("/tmp/from-iter", format="bytes")[:1000], bytearray(1000))
            with self.assertRaises(SandboxNotFound):
                f.get_info("/tmp/nothing")
            sid = sb.id
        # exists() in a sandbox that is gone is an error, not False.
        gone = self.roche.get if False else None  # noqa: F841 (kept simple: a handle on the dead id)
        from roche_sandbox._sync import Sandbox
        dead = Sandbox(self.roche, self.roche._resolve(), sb.info)
        self.assertEqual(dead.id, sid)
        with self.assertRaises(SandboxNotFound):
            dead.files.exists("/tmp")

    def test_refusals(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            f = sb.files
            r = sb.exec(["sh", "-c", "ln -s / /tmp/root && ln -s /etc/hostname /tmp/host && mkfifo /tmp/fifo"])
            self.assertEqual(r.exit_code, 0, r.stderr)
            for what, call, kind in [
                ("relative path", lambda: f.read("tmp/x"), InvalidConfig),
                ("path with ..", lambda: f.read("/tmp/../etc/hostname"), InvalidConfig),
                ("read through a symlinked directory", lambda: f.read("/tmp/root/etc/hostname"), PermissionDenied),
                ("read of a symlink", lambda: f.read("/tmp/host"), PermissionDenied),
                ("write through a symlinked directory", lambda: f.write("/tmp/root/tmp/dropped", "x"), PermissionDenied),
                ("read of a FIFO", lambda: f.read("/tmp/fifo"), InvalidConfig),
                ("read of a device", lambda: f.read("/dev/zero"), InvalidConfig),
                ("the agent's /proc", lambda: f.read("/proc/1/environ"), PermissionDenied),
                ("list deeper than 64", lambda: f.list("/tmp", depth=65), InvalidConfig),
                ("a mode with more than permission bits", lambda: f.write("/tmp/m", "x", mode=0o4755), InvalidConfig),
            ]:
                with self.subTest(what):
                    with self.assertRaises(kind):
                        call()
            self.assertFalse(f.exists("/tmp/dropped"))
            with self.assertRaises(ResourceExhausted):
                f.write("/tmp/over", b"x" * 5000, max_bytes=4096)
            time.sleep(0.2)
            self.assertFalse(f.exists("/tmp/over"), "a write over its cap left its file")
            f.write("/tmp/small", b"x" * 2000)
            with self.assertRaises(ResourceExhausted):
                f.read("/tmp/small", max_bytes=1000)

    def test_streams_in_bounded_memory(self) -> None:
        size = 128 << 20
        piece = b"0123456789abcdef" * 4096  # 64 KiB

        def content() -> Iterator[bytes]:
            for _ in range(size // len(piece)):
                yield piece

        with self.roche.create(image=harness.image(), writable=True) as sb:
            with PeakRSS() as mem:
                t = time.monotonic()
                info = sb.files.write("/var/tmp/big", content())
                wrote = time.monotonic() - t
                self.assertEqual(info.size, size)
                n = 0
                t = time.monotonic()
                for chunk in sb.files.read("/var/tmp/big", format="stream"):
                    n += len(chunk)
                read = time.monotonic() - t
            self.assertEqual(n, size)
            grew = mem.grew
            print(f"\n{self.transport}: 128 MiB written at {128 / wrote:.0f} MiB/s, read at {128 / read:.0f} MiB/s; "
                  f"peak RSS grew {grew >> 20} MiB", end=" ")
            self.assertLess(grew, 48 << 20, "files.write/read held the content in memory")

    def test_watch(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            f = sb.files
            f.make_dir("/tmp/w/sub")
            flat = f.watch_dir("/tmp/w")
            tree = f.watch_dir("/tmp/w", recursive=True)
            seen: list[FilesystemEvent] = []
            tseen: list[FilesystemEvent] = []
            f.write("/tmp/w/a.txt", "a")
            wait_for(flat, "a.txt", FilesystemEventType.CREATE, seen)
            wait_for(flat, "a.txt", FilesystemEventType.WRITE, seen)
            sb.exec(["chmod", "600", "/tmp/w/a.txt"])
            wait_for(flat, "a.txt", FilesystemEventType.CHMOD, seen)
            f.rename("/tmp/w/a.txt", "/tmp/w/b.txt")
            wait_for(flat, "a.txt", FilesystemEventType.RENAME, seen)
            wait_for(flat, "b.txt", FilesystemEventType.CREATE, seen)
            f.remove("/tmp/w/b.txt")
            wait_for(flat, "b.txt", FilesystemEventType.REMOVE, seen)
            f.write("/tmp/w/sub/new/deep.txt", "d")
            wait_for(tree, "sub/new/deep.txt", FilesystemEventType.CREATE, tseen)
            seen.extend(flat.get_new_events())
            self.assertFalse([e for e in seen if e.name.startswith("sub/")], "a watch that is not recursive saw below")
            # Iterating waits for each event; stop() ends the watch at once.
            got: list[FilesystemEvent] = []

            def take() -> None:
                for ev in flat:
                    got.append(ev)
                    if ev.name == "it.txt":
                        return

            reader = threading.Thread(target=take)
            reader.start()
            f.write("/tmp/w/it.txt", "i")
            reader.join(20)
            self.assertIn("it.txt", [e.name for e in got])
            t = time.monotonic()
            flat.stop()
            self.assertLess(time.monotonic() - t, 5, "stop() took long")
            self.assertFalse(flat.running)
            # The watched directory removed: its own event is the last, and the watch ends.
            f.remove("/tmp/w")
            wait_for(tree, "", FilesystemEventType.REMOVE, tseen)
            deadline = time.monotonic() + 20
            while tree.running and time.monotonic() < deadline:
                time.sleep(0.05)
            self.assertFalse(tree.running, "the watch of a removed directory did not end")
            with self.assertRaises(SandboxNotFound):
                f.watch_dir("/tmp/no-such-dir")

    def test_async(self) -> None:
        async def run() -> None:
            roche = AsyncRoche(transport=self.transport)
            try:
                async with (await roche.create(image=harness.image())) as sb:
                    f = sb.files
                    events: list[FilesystemEvent] = []
                    arrived = asyncio.Event()

                    async def on_event(ev: FilesystemEvent) -> None:
                        events.append(ev)
                        if ev.name == "async.txt":
                            arrived.set()

                    ended: list[Any] = []
                    h = await f.watch_dir("/tmp", on_event, on_exit=ended.append)

                    async def pieces() -> Any:
                        for i in range(10):
                            yield bytes([65 + i]) * 100_000

                    info = await f.write("/tmp/async.txt", pieces())
                    self.assertEqual(info.size, 1_000_000)
                    await asyncio.wait_for(arrived.wait(), 20)
                    await h.stop()
                    self.assertEqual(ended, [None], "on_exit after stop() gets None")
                    data = await f.read("/tmp/async.txt", format="bytes")
                    self.assertEqual(bytes(data[::100_000]), b"ABCDEFGHIJ")
                    n = 0
                    async for chunk in await f.read("/tmp/async.txt", format="stream"):
                        n += len(chunk)
                    self.assertEqual(n, 1_000_000)
                    self.assertEqual([e.name for e in await f.list("/tmp") if e.name == "async.txt"], ["async.txt"])
                    self.assertTrue(await f.exists("/tmp/async.txt"))
                    self.assertTrue(await f.make_dir("/tmp/ad"))
                    await f.remove("/tmp/ad")
                    with self.assertRaises(PermissionDenied):
                        await f.read("/proc/1/environ")
            finally:
                roche.close()

        asyncio.run(run())


class FilesThroughCLI(FilesThroughDaemon):
    transport = "cli"


class WatchHandleQueue(unittest.TestCase):
    """The handle's own bound, with no sandbox: a reader that never takes its events keeps
    at most WATCH_QUEUE, and is told how many it lost."""

    def test_overflow_is_reported(self) -> None:
        total = WATCH_QUEUE + 2500

        def events() -> Iterator[FilesystemEvent]:
            for i in range(total):
                yield FilesystemEvent(f"f{i}", FilesystemEventType.CREATE)

        h = WatchHandle(events(), Abort(), None, None)
        deadline = time.monotonic() + 10
        while h.running and time.monotonic() < deadline:
            time.sleep(0.01)
        got = h.get_new_events()
        self.assertEqual(len(got), WATCH_QUEUE + 1)
        self.assertEqual(got[-1].type, FilesystemEventType.OVERFLOW)
        self.assertEqual(got[-1].lost, total - WATCH_QUEUE)
        self.assertEqual(got[0].name, "f0")

    def test_async_handle_reports_the_error_that_ended_it(self) -> None:
        async def run() -> None:
            async def events() -> Any:
                yield FilesystemEvent("x", FilesystemEventType.CREATE)
                raise SandboxNotFound("not found: the sandbox went")

            h = AsyncWatchHandle(events(), Abort(), None, None)
            got = [ev async for ev in _upto(h, 1)]
            self.assertEqual([e.name for e in got], ["x"])
            with self.assertRaises(SandboxNotFound):
                async for _ in h:
                    pass

        asyncio.run(run())


async def _upto(h: AsyncWatchHandle, n: int) -> Any:
    async for ev in h:
        yield ev
        n -= 1
        if n == 0:
            return


class Codec(unittest.TestCase):
    """The binary messages of file content, as the SDK writes and reads them."""

    def test_write_messages(self) -> None:
        enc = WriteEncoder("sb1", "/tmp/f", 0o600, 0)
        msgs = enc.feed(b"a" * (600 << 10)) + enc.feed(b"b" * 10) + enc.finish()
        self.assertEqual(len(msgs), 3)
        self.assertEqual(enc.size, (600 << 10) + 10)
        self.assertTrue(msgs[0][5:].startswith(b"\x0a\x03sb1\x12\x06/tmp/f\x18\x80\x03"))
        empty = WriteEncoder("sb1", "/tmp/e", 0, 0)
        self.assertEqual(len(empty.finish()), 1, "an empty file still names itself")

    def test_read_messages(self) -> None:
        entry, data = read_item(b"\x12\x03abc")
        self.assertIsNone(entry)
        self.assertEqual(data, b"abc")
        e = b"\x0a\x01x\x10\x01\x1a\x02/x\x20\x05\x28\xa4\x03"
        entry, data = read_item(b"\x0a" + bytes([len(e)]) + e)
        assert entry is not None
        self.assertEqual((entry.name, entry.type, entry.path, entry.size, entry.mode), ("x", FileType.FILE, "/x", 5, 0o644))
        self.assertEqual(data, b"")
        self.assertIsInstance(write_response(b"\x0a" + bytes([len(e)]) + e), EntryInfo)


if __name__ == "__main__":
    unittest.main()
