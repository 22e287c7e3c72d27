"""Each typed exception, raised for its case with Roche's own message, through the daemon
and through the CLI, from the sync and the async API."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import tempfile
import threading
import time
import unittest
from typing import Any, Callable
from unittest import mock

import harness

from roche_sandbox import (
    AsyncRoche,
    ImageNotFound,
    InvalidConfig,
    PermissionDenied,
    ProviderUnavailable,
    ResourceExhausted,
    Roche,
    RocheError,
    SandboxNotFound,
    SandboxTimeout,
    Unsupported,
)


class HungDaemon:
    """A socket that answers /healthz like roched and then never answers a call: a daemon
    stuck behind a hung Docker engine."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="roche-hung-")
        self.socket = os.path.join(self.dir, "hung.sock")
        self.server = socket.socket(socket.AF_UNIX)
        self.server.bind(self.socket)
        self.server.listen(16)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(c)
            request = c.recv(65536)
            if request.startswith(b"GET /healthz"):
                body = b'{"status":"ok","providers":["docker"]}'
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    def close(self) -> None:
        self.server.close()
        for c in self.conns:
            c.close()
        os.unlink(self.socket)
        os.rmdir(self.dir)


def hung_cli(directory: str) -> str:
    """A roche CLI that never answers."""
    path = os.path.join(directory, "roche")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec sleep 60\n")
    os.chmod(path, stat.S_IRWXU)
    return path


class ErrorsThroughDaemon(harness.SandboxTestCase):
    transport = "daemon"

    def roche(self, **kw: Any) -> Roche:
        return Roche(transport=self.transport, **kw)

    def raises(self, exc: type[RocheError], text: str, fn: Callable[[], object]) -> RocheError:
        with self.assertRaises(exc) as cm:
            fn()
        self.assertIn(text, cm.exception.message)
        self.assertEqual(str(cm.exception), cm.exception.message)
        return cm.exception

    def test_sandbox_not_found(self) -> None:
        roche = self.roche()
        e = self.raises(SandboxNotFound, "no sandbox 0123456789ab", lambda: roche.get("0123456789ab"))
        self.assertEqual(e.reason, "not_found")
        sb = roche.create(image=harness.image())
        sb.destroy()
        self.raises(SandboxNotFound, sb.id, lambda: sb.exec(["true"]))
        self.raises(SandboxNotFound, sb.id, lambda: sb.write_file("/tmp/x", b"x"))

    def test_invalid_config(self) -> None:
        roche = self.roche()
        self.raises(InvalidConfig, '"lots" is not a size', lambda: roche.create(image=harness.image(), memory="lots"))
        self.raises(InvalidConfig, "cpus", lambda: roche.create(image=harness.image(), cpus=0))
        self.raises(InvalidConfig, "mount", lambda: roche.create(image=harness.image(), mounts=["nocolon"]))
        with roche.create(image=harness.image()) as sb:
            self.raises(InvalidConfig, "empty command", lambda: sb.exec([]))
            self.raises(InvalidConfig, "as a list", lambda: sb.exec("echo hi"))  # type: ignore[arg-type]
            self.raises(InvalidConfig, "absolute path", lambda: sb.write_file("relative.txt", b""))
        self.assertTrue(issubclass(InvalidConfig, ValueError))

    def test_image_not_found(self) -> None:
        e = self.raises(ImageNotFound, "roche/no-such-image:nope",
                        lambda: self.roche().create(image="roche/no-such-image:nope"))
        self.assertIsInstance(e, InvalidConfig)
        # Worded for a program, through either transport: what to set and where the fix
        # runs; no flag of the CLI's, no script of a clone's.
        self.assertIn('then create sandboxes with image "roche/python:local"', str(e))
        self.assertIn("roche image build python", str(e))
        self.assertNotIn("--image", str(e))
        self.assertNotIn("scripts/", str(e))

    def test_permission_denied(self) -> None:
        with self.roche().create(image=harness.image()) as sb:
            self.raises(PermissionDenied, "read-only root", lambda: sb.write_file("/etc/planted", b"x"))

    def test_provider_unavailable_when_docker_is_down(self) -> None:
        if self.transport == "daemon":
            down = harness.Daemon(env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, name="nodocker")
            self.addCleanup(down.stop)
            roche = Roche(transport="daemon", socket=down.socket)
        else:
            self.enter(mock.patch.dict(os.environ, {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}))
            roche = self.roche()
        self.raises(ProviderUnavailable, "Docker engine is not reachable", lambda: roche.create(image=harness.image()))

    def test_provider_unavailable_when_nothing_answers(self) -> None:
        if self.transport == "daemon":
            roche = Roche(transport="daemon", socket=harness.dead_socket())
            self.raises(ProviderUnavailable, "roched is not answering", lambda: roche.create())
        else:
            roche = Roche(socket=harness.dead_socket(), cli="/nonexistent/roche")
            self.raises(ProviderUnavailable, "cannot run the roche CLI", lambda: roche.create())
            with mock.patch.dict(os.environ, {"PATH": "/nonexistent"}):
                os.environ.pop("ROCHE_CLI", None)
                roche = Roche(socket=harness.dead_socket())
                self.raises(ProviderUnavailable, "no roche CLI was found", lambda: roche.create())

    def test_timeout_when_roche_hangs(self) -> None:
        if self.transport == "daemon":
            hung = HungDaemon()
            self.addCleanup(hung.close)
            roche = Roche(transport="daemon", socket=hung.socket, request_timeout=1)
        else:
            tmp = self.enter(tempfile.TemporaryDirectory())
            roche = Roche(transport="cli", cli=hung_cli(tmp), request_timeout=1)
        started = time.monotonic()
        e = self.raises(SandboxTimeout, "did not answer within 1 s", lambda: roche.create(image=harness.image()))
        self.assertLess(time.monotonic() - started, 5)
        self.assertIsInstance(e, TimeoutError)

    def test_exec_in_a_paused_sandbox_does_not_hang(self) -> None:
        roche = self.roche()
        with roche.create(image=harness.image()) as sb:
            sb.pause()
            try:
                hurried = self.roche(request_timeout=1).get(sb.id)
                started = time.monotonic()
                with self.assertRaises(RocheError):
                    hurried.exec(["true"], timeout=1)
                self.assertLess(time.monotonic() - started, 8)
            finally:
                # Killing the stuck command may thaw the sandbox on its way (Docker).
                if roche.get(sb.id).info.state == "paused":
                    sb.unpause()
            self.assertTrue(sb.exec(["true"]).ok)

    def test_unsupported(self) -> None:
        roche = Roche(provider="wasm", transport=self.transport)
        self.raises(Unsupported, "no network", lambda: roche.create(image="python:3.12-slim", network=True))

    def test_unknown_provider(self) -> None:
        roche = Roche(provider="nosuch", transport=self.transport)
        if self.transport == "daemon":
            self.raises(ProviderUnavailable, "does not serve the nosuch provider", lambda: roche.create())
        else:
            self.raises(InvalidConfig, 'unknown provider "nosuch"', lambda: roche.create())

    def test_async_errors(self) -> None:
        async def main() -> None:
            roche = AsyncRoche(transport=self.transport)
            with self.assertRaises(SandboxNotFound):
                await roche.get("0123456789ab")
            with self.assertRaises(InvalidConfig):
                await roche.create(image=harness.image(), memory="lots")
            with self.assertRaises(ImageNotFound):
                await roche.create(image="roche/no-such-image:nope")
            if self.transport == "daemon":
                hung = HungDaemon()
                self.addCleanup(hung.close)
                slow = AsyncRoche(transport="daemon", socket=hung.socket, request_timeout=1)
                with self.assertRaises(ProviderUnavailable):
                    await AsyncRoche(transport="daemon", socket=harness.dead_socket()).create()
            else:
                slow = AsyncRoche(transport="cli", cli=hung_cli(self.enter(tempfile.TemporaryDirectory())),
                                  request_timeout=1)
                with self.assertRaises(ProviderUnavailable):
                    await AsyncRoche(socket=harness.dead_socket(), cli="/nonexistent/roche").create()
            started = time.monotonic()
            with self.assertRaises(SandboxTimeout):
                await slow.create(image=harness.image())
            self.assertLess(time.monotonic() - started, 5)

        asyncio.run(main())


class ErrorsThroughCLI(ErrorsThroughDaemon):
    transport = "cli"


class DaemonLimits(harness.SandboxTestCase):
    def test_resource_exhausted(self) -> None:
        small = harness.Daemon(name="small", args=["--max-sandboxes", "1"])
        self.addCleanup(small.stop)
        roche = Roche(transport="daemon", socket=small.socket)
        with roche.create(image=harness.image()):
            with self.assertRaises(ResourceExhausted) as cm:
                roche.create(image=harness.image())
            self.assertIn("max", cm.exception.message)
            self.assertIsNone(cm.exception.retry_after)

    def test_retry_after(self) -> None:
        """A create roched's pool refuses at once (making the next sandbox takes longer than
        the pool's wait) says how long to wait before asking again."""
        spec = f"docker/{harness.image()}?min=1&max=1&queue=1&wait=0.001"
        pooled = harness.Daemon(name="pooled", args=["--pool", spec])
        self.addCleanup(pooled.stop)
        roche = Roche(transport="daemon", socket=pooled.socket)
        # A create takes the pool's one sandbox or finds it making the next, which takes
        # longer than 1 ms: within a few creates in a row, one is refused.
        for _ in range(5):
            try:
                sb = roche.create(image=harness.image())
            except ResourceExhausted as e:
                self.assertIn("retry in", e.message)
                assert e.retry_after is not None, e.message
                self.assertGreater(e.retry_after, 0)
                self.assertLess(e.retry_after, 11)
                return
            self.addCleanup(sb.destroy)
        self.fail("no create was refused in five tries")


if __name__ == "__main__":
    unittest.main()
