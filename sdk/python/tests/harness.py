"""What the SDK's tests share: the real roched (started from bin/ on a socket of its own),
the real roche CLI, and an image tag private to this test process, so that a leaked
sandbox can be told from those of other tests running on the same Docker engine.

Needs `make build` (bin/roche, bin/roched, bin/roche-agent), Docker, and the test image
(scripts/build-test-image.sh); the README's test command provides all three."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import uuid
from typing import ContextManager, Optional, TypeVar

T = TypeVar("T")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(REPO, "sdk", "python", "src"))
sys.path.insert(0, REPO)  # for examples/

BIN = os.environ.get("ROCHE_BIN") or os.path.join(REPO, "bin")
CLI = os.path.join(BIN, "roche")
ROCHED = os.path.join(BIN, "roched")
BASE_IMAGE = os.environ.get("ROCHE_TEST_IMAGE") or "roche/python:local"
TRANSPORTS = ("daemon", "cli")


def _run(*argv: str, check: bool = True) -> str:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


class Daemon:
    """A roched on a temporary socket, stopped at exit."""

    def __init__(self, env: Optional[dict[str, str]] = None, name: str = "roched",
                 args: Optional[list[str]] = None, dir: Optional[str] = None) -> None:
        # dir: one a roched before this one used (its socket and state file), which this
        # one then serves, as a roched restarted there.
        self.dir = dir or tempfile.mkdtemp(prefix="roche-sdk-test-")
        self.socket = os.path.join(self.dir, f"{name}.sock")
        self.log = os.path.join(self.dir, f"{name}.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([ROCHED, "--socket", self.socket, "--log-level", "warn", *(args or [])],
                                         stdout=log, stderr=log, env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 60
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"roched did not start: {self.tail()}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.settimeout(1)
            s.connect(self.socket)
            s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            return b" 200 " in s.recv(64)
        except OSError:
            return False
        finally:
            s.close()

    def tail(self) -> str:
        try:
            with open(self.log) as f:
                return "".join(f.readlines()[-10:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class _Env:
    """The process-wide set-up, made on first use."""

    image = ""
    daemon: Optional[Daemon] = None
    dead_socket = ""


def setup() -> None:
    """Tags the private image, starts roched and points the SDK's environment at both."""
    global CLI, ROCHED
    if _Env.daemon is not None:
        return
    # A copy of bin/, so that a `make build` meanwhile cannot swap binaries mid-run;
    # roche and roched find roche-agent beside themselves.
    snapshot = tempfile.mkdtemp(prefix="roche-sdk-test-bin-")
    atexit.register(shutil.rmtree, snapshot, True)
    for name in ("roche", "roched", "roche-agent"):
        path = os.path.join(BIN, name)
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"{path} is missing: run `make build` first")
        shutil.copy2(path, snapshot)
    CLI, ROCHED = os.path.join(snapshot, "roche"), os.path.join(snapshot, "roched")
    tag = f"{BASE_IMAGE.rsplit(':', 1)[0]}:sdk-test-{uuid.uuid4().hex[:8]}"
    _run("docker", "tag", BASE_IMAGE, tag)
    _Env.image = tag
    atexit.register(_untag, tag)
    # One owner for the CLI's direct-mode sandboxes and the roched processes of this run,
    # which serve those (roched --direct-owner's default): none another run makes.
    os.environ["ROCHE_OWNER"] = f"cli:sdk-test-{uuid.uuid4().hex[:8]}"
    _Env.daemon = Daemon()
    atexit.register(_Env.daemon.stop)
    _Env.dead_socket = os.path.join(_Env.daemon.dir, "nobody-listens.sock")
    os.environ["ROCHE_SOCKET"] = _Env.daemon.socket
    os.environ["ROCHE_CLI"] = CLI
    os.environ["ROCHE_IMAGE"] = tag


def _untag(tag: str) -> None:
    subprocess.run(["docker", "rmi", tag], capture_output=True)


def image() -> str:
    setup()
    return _Env.image


def daemon() -> Daemon:
    setup()
    assert _Env.daemon is not None
    return _Env.daemon


def dead_socket() -> str:
    """A socket path nothing listens on: with it, the SDK falls back to the CLI."""
    setup()
    return _Env.dead_socket


def containers() -> list[str]:
    """The Roche containers, running or not, made from this process's private image tag
    (an ancestor= filter would match every tag of the same image)."""
    out = _run("docker", "ps", "-a", "--filter", "label=roche.managed=true", "--format", "{{.ID}} {{.Image}}")
    return [cid for cid, _, img in (line.partition(" ") for line in out.splitlines()) if img == image()]


def running_in(sandbox_id: str) -> list[str]:
    """The command lines of the processes in a sandbox, from the host."""
    out = _run("docker", "top", sandbox_id, "-eo", "args", check=False)
    return out.splitlines()[1:]


class SandboxTestCase(unittest.TestCase):
    """Starts the environment, and fails the class if any sandbox of ours is left."""

    transport = "daemon"

    @classmethod
    def setUpClass(cls) -> None:
        setup()

    @classmethod
    def tearDownClass(cls) -> None:
        # roched removes destroyed sandboxes in the background: allow it a moment.
        deadline = time.monotonic() + 20
        left = containers()
        while left and time.monotonic() < deadline:
            time.sleep(0.25)
            left = containers()
        if left:
            details = _run("docker", "ps", "-a", *(a for c in left for a in ("--filter", f"id={c}")), check=False)
            _run("docker", "rm", "-f", *left, check=False)
            raise AssertionError(f"{cls.__name__} left {len(left)} sandbox(es) behind:\n{details}")

    def enter(self, cm: ContextManager[T]) -> T:
        """Enters a context manager until the test ends (TestCase.enterContext is 3.11+)."""
        value = cm.__enter__()
        self.addCleanup(cm.__exit__, None, None, None)
        return value

