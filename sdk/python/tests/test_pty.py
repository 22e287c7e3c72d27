"""PTY sessions (sandbox.pty) against real sandboxes through the real roched, sync and
async; through the CLI transport they are refused with a reason."""

from __future__ import annotations

import asyncio
import threading
import time

import harness

from roche_sandbox import AsyncRoche, InvalidConfig, Roche, SandboxNotFound, Unsupported


class Screen:
    """Collects a terminal's output (on_data runs in the handle's reader thread)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.lock = threading.Lock()

    def __call__(self, data: bytes) -> None:
        with self.lock:
            self.buf += data

    def text(self) -> str:
        with self.lock:
            return self.buf.decode(errors="replace")

    def wait_for(self, want: str, after: int = 0, within: float = 30.0) -> int:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            i = self.text().find(want, after)
            if i >= 0:
                return i + len(want)
            time.sleep(0.02)
        raise AssertionError(f"{want!r} never appeared on the terminal; it shows {self.text()!r}")


class PtyThroughDaemon(harness.SandboxTestCase):
    transport = "daemon"

    def test_shell_session(self) -> None:
        roche = Roche(transport="daemon")
        self.addCleanup(roche.close)
        sandbox = self.enter(roche.create(image=harness.image()))
        screen = Screen()
        term = sandbox.pty.create(cols=100, rows=30, on_data=screen)
        self.assertGreater(term.pid, 0)
        term.send_input("stty size; id -u\n")
        at = screen.wait_for("30 100\r\n")
        uid = screen.text()[at:].split("\r\n", 1)[0]
        self.assertNotEqual(uid.strip(), "0", "the terminal runs as root")
        term.resize(120, 40)
        term.send_input("stty size\n")
        at = screen.wait_for("40 120\r\n", at)
        # Ctrl-C interrupts the foreground job at once; the shell lives on.
        term.send_input("sleep 100\n")
        time.sleep(0.3)
        start = time.monotonic()
        term.send_input("\x03")
        term.send_input("echo after-int''errupt\n")
        screen.wait_for("after-interrupt\r\n", at)
        self.assertLess(time.monotonic() - start, 10)
        term.send_input("exit 3\n")
        self.assertEqual(term.wait(timeout=30).exit_code, 3)

        # A command of the caller's, collected into .output; kill ends it.
        term = sandbox.pty.create(cmd=["python3", "-c", "import sys, time; print(sys.stdin.isatty()); time.sleep(100)"])
        deadline = time.monotonic() + 30
        while b"True" not in term.output and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertIn(b"True", term.output)
        term.kill()
        self.assertEqual(term.wait(timeout=30).exit_code, 137)
        with self.assertRaises(SandboxNotFound):
            sandbox.pty.send_stdin(term.pid, "x")  # E2B's name
        with self.assertRaises(InvalidConfig):
            sandbox.pty.create(cols=0)

    def test_async_session(self) -> None:
        async def main() -> None:
            roche = AsyncRoche(transport="daemon")
            try:
                async with (await roche.create(image=harness.image())) as sandbox:
                    chunks: list[bytes] = []

                    async def on_data(data: bytes) -> None:
                        chunks.append(data)

                    term = await sandbox.pty.create(cols=90, rows=20, on_data=on_data)
                    await term.send_input("stty size\n")
                    deadline = time.monotonic() + 30
                    while b"20 90\r\n" not in b"".join(chunks) and time.monotonic() < deadline:
                        await asyncio.sleep(0.02)
                    self.assertIn(b"20 90\r\n", b"".join(chunks))
                    await term.resize(132, 50)
                    await sandbox.pty.send_input(term.pid, "stty size; exit 4\n")
                    result = await term.wait(timeout=30)
                    self.assertEqual(result.exit_code, 4)
                    self.assertIn(b"50 132\r\n", b"".join(chunks))
            finally:
                roche.close()

        asyncio.run(main())


class PtyThroughCLI(harness.SandboxTestCase):
    transport = "cli"

    def test_refused(self) -> None:
        roche = Roche(transport="cli")
        self.addCleanup(roche.close)
        sandbox = self.enter(roche.create(image=harness.image()))
        with self.assertRaises(Unsupported) as cm:
            sandbox.pty.create()
        self.assertIn("roche shell", str(cm.exception))


if __name__ == "__main__":
    import unittest
    unittest.main()
