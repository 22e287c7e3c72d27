"""The synchronous API against real sandboxes, through the daemon and through the CLI:
each test runs once per transport and both must behave the same."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Optional
from unittest import mock

import harness

from roche_sandbox import AsyncRoche, ExecResult, Mount, ProviderUnavailable, Roche, RocheError, SandboxNotFound


class SandboxThroughDaemon(harness.SandboxTestCase):
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

    def test_transport_is_the_one_asked_for(self) -> None:
        self.assertEqual(self.roche.transport, self.transport)

    def test_exec_result(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            r = sb.exec(["python3", "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
            self.assertIsInstance(r, ExecResult)
            self.assertEqual((r.stdout, r.stderr, r.exit_code), ("out\n", "err\n", 3))
            self.assertFalse(r.timed_out or r.truncated or r.oom_killed)
            self.assertFalse(r.ok)
            self.assertGreater(r.duration, 0)
            self.assertTrue(sb.exec(["true"]).ok)

    def test_exec_stdin_env_workdir(self) -> None:
        with self.roche.create(image=harness.image(), env={"GREETING": "hi"}) as sb:
            self.assertEqual(sb.exec(["cat"], stdin=b"\x00binary in\n").stdout, "\x00binary in\n")
            self.assertEqual(sb.exec(["cat"], stdin="").stdout, "")
            r = sb.exec(["sh", "-c", 'echo "$GREETING $EXTRA $(pwd)"'], env={"EXTRA": "there"}, workdir="/tmp")
            self.assertEqual(r.stdout, "hi there /tmp\n")

    def test_secure_defaults(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            r = sb.exec(["sh", "-c", "id -u; cat /sys/class/net/*/operstate 2>/dev/null | wc -l; "
                         "touch /x 2>/dev/null && echo writable || echo read-only"])
            uid, _, root = r.stdout.split()
            self.assertNotEqual(uid, "0")
            self.assertEqual(root, "read-only")

    def test_exec_timeout_is_a_result(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            started = time.monotonic()
            r = sb.exec(["sh", "-c", "echo before; sleep 30"], timeout=1)
            self.assertLess(time.monotonic() - started, 10)
            self.assertTrue(r.timed_out, r)
            self.assertEqual(r.exit_code, 137)
            self.assertEqual(r.stdout, "before\n")

    def test_output_is_capped_and_flagged(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            r = sb.exec(["sh", "-c", "head -c 11000000 /dev/zero | tr '\\0' a"])
            self.assertTrue(r.truncated)
            self.assertEqual(len(r.stdout), 10 << 20)

    def test_streaming_yields_the_first_line_before_the_command_ends(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            started = time.monotonic()
            seen: list[tuple[float, str, str]] = []
            with sb.exec_stream(["sh", "-c", "echo first; sleep 2; echo second >&2; exit 4"]) as stream:
                for event in stream:
                    seen.append((time.monotonic() - started, event.stream, event.text))
            self.assertEqual([(s, t) for _, s, t in seen], [("stdout", "first\n"), ("stderr", "second\n")])
            self.assertLess(seen[0][0], 1.5, "the first line came only at the end")
            self.assertGreaterEqual(seen[1][0], 1.9)
            r = stream.result
            assert r is not None
            self.assertEqual((r.exit_code, r.stdout, r.stderr), (4, "first\n", "second\n"))

    def test_streaming_keeps_roche_like_lines_of_the_command(self) -> None:
        # The CLI transport tells roche's closing lines from the command's own.
        with self.roche.create(image=harness.image()) as sb:
            s = sb.exec_stream(["sh", "-c", "echo 'roche: mine' >&2; printf 'roc' >&2; exit 125"])
            text = "".join(e.text for e in s)
            r = s.result
            assert r is not None
            self.assertEqual(text, "roche: mine\nroc")
            self.assertEqual((r.exit_code, r.stderr), (125, "roche: mine\nroc"))

    def test_streaming_timeout(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            s = sb.exec_stream(["sh", "-c", "echo tick; sleep 30"], timeout=1)
            self.assertEqual([e.text for e in s], ["tick\n"])
            r = s.result
            assert r is not None
            self.assertTrue(r.timed_out)
            self.assertEqual(r.exit_code, 137)

    def test_closing_a_stream_kills_the_command(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            with sb.exec_stream(["sh", "-c", "echo started; exec sleep 1234"]) as stream:
                for event in stream:
                    self.assertEqual(event.text, "started\n")
                    break
            deadline = time.monotonic() + 10
            while any("sleep 1234" in p for p in harness.running_in(sb.id)):
                self.assertLess(time.monotonic(), deadline, "the command outlived its stream")
                time.sleep(0.1)

    def test_files(self) -> None:
        blob = bytes(range(256)) * 1000
        with self.roche.create(image=harness.image()) as sb:
            sb.write_file("/tmp/deep/er/blob.bin", blob)
            self.assertEqual(sb.read_file("/tmp/deep/er/blob.bin"), blob)
            sb.write_file("/tmp/run.sh", "echo ran\n", mode=0o750)
            self.assertEqual(sb.exec(["sh", "-c", "stat -c %a /tmp/run.sh; sh /tmp/run.sh"]).stdout, "750\nran\n")
            sb.write_file("/tmp/empty", b"")
            self.assertEqual(sb.read_file("/tmp/empty"), b"")
            with self.assertRaises(SandboxNotFound):
                sb.read_file("/tmp/no-such-file")

    def test_copy_directories_both_ways(self) -> None:
        with self.roche.create(image=harness.image()) as sb, tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "project")
            os.makedirs(os.path.join(src, "pkg"))
            with open(os.path.join(src, "main.py"), "w") as f:
                f.write("from pkg import answer\nprint(answer)\n")
            with open(os.path.join(src, "pkg", "__init__.py"), "w") as f:
                f.write("answer = 42\n")
            sb.copy_to(src, "/tmp/app")
            self.assertEqual(sb.exec(["python3", "/tmp/app/main.py"], workdir="/tmp/app").stdout, "42\n")
            sb.exec(["sh", "-c", "mkdir -p /tmp/out/sub && echo result > /tmp/out/sub/r.txt"])
            dst = os.path.join(tmp, "back")
            sb.copy_from("/tmp/out", dst)
            with open(os.path.join(dst, "sub", "r.txt")) as f:
                self.assertEqual(f.read(), "result\n")

    def test_mounts(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            os.chmod(tmp, 0o755)
            with open(os.path.join(tmp, "in.txt"), "w") as f:
                f.write("from the host\n")
            os.chmod(os.path.join(tmp, "in.txt"), 0o644)
            with self.roche.create(image=harness.image(), mounts=[Mount(tmp, "/data"), f"{tmp}:/data2:ro"]) as sb:
                self.assertEqual(sb.exec(["cat", "/data/in.txt", "/data2/in.txt"]).stdout, "from the host\n" * 2)
                self.assertNotEqual(sb.exec(["sh", "-c", "echo x > /data/new"]).exit_code, 0)

    def test_pause_and_unpause(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            sb.pause()
            self.assertEqual(self.roche.get(sb.id).info.state, "paused")
            sb.unpause()
            self.assertEqual(sb.exec(["echo", "awake"]).stdout, "awake\n")

    def test_get_list_destroy(self) -> None:
        sb = self.roche.create(image=harness.image())
        try:
            self.assertIn(sb.id, [s.id for s in self.roche.list()])
            again = self.roche.get(sb.id)
            self.assertEqual((again.id, again.info.image, again.info.provider), (sb.id, harness.image(), "docker"))
            self.assertIsNotNone(again.info.expires_at)
        finally:
            sb.destroy()
        sb.destroy()  # idempotent
        self.assertNotIn(sb.id, [s.id for s in self.roche.list()])
        with self.assertRaises(SandboxNotFound):
            self.roche.get(sb.id)

    def test_inspect_says_why_it_ended_and_exec_has_a_receipt(self) -> None:
        sb = self.roche.create(image=harness.image())
        try:
            live = self.roche.inspect(sb.id)
            self.assertEqual((live.id, live.state, live.end), (sb.id, "running", None))
            r = sb.exec(["python3", "-c", "b = b'x' * (100 << 20); print(len(b))"])
            self.assertTrue(r.ok, r)
            self.assertIsNotNone(r.receipt)
            assert r.receipt is not None
            self.assertGreaterEqual(r.receipt.peak_memory_bytes, 100 << 20)
            self.assertGreater(r.receipt.cpu_time, 0)
            self.assertEqual((r.receipt.end, r.receipt.evidence), ("", ""))
            t = sb.exec(["sleep", "30"], timeout=1)
            assert t.receipt is not None
            self.assertTrue(t.timed_out, t)
            self.assertEqual(t.receipt.end, "command_timeout", t.receipt)
            self.assertIn("timeout", t.receipt.evidence)
        finally:
            sb.destroy()
        if self.transport == "daemon":
            info = self.roche.inspect(sb.id)
            self.assertEqual(info.state, "exited")
            assert info.end is not None
            self.assertEqual(info.end.kind, "destroyed")
            self.assertTrue(info.end.by.startswith("tenant:"), info.end)
            self.assertIsNotNone(info.end.at)
            with self.assertRaises(SandboxNotFound):
                self.roche.get(sb.id)  # get() wants a live one
        else:
            # Direct mode keeps no ends, and says so.
            with self.assertRaises(SandboxNotFound) as cm:
                self.roche.inspect(sb.id)
            self.assertIn("direct mode", str(cm.exception))

    def test_exception_in_with_body_still_destroys(self) -> None:
        class Boom(Exception):
            pass

        with self.assertRaises(Boom):
            with self.roche.create(image=harness.image()) as sb:
                self.assertTrue(sb.exec(["true"]).ok)
                raise Boom()
        with self.assertRaises(SandboxNotFound):
            sb.exec(["true"])
        with self.assertRaises(SandboxNotFound):
            self.roche.get(sb.id)

    def test_lifetime_ends_the_sandbox(self) -> None:
        with self.roche.create(image=harness.image(), timeout_secs=2) as sb:
            self.assertTrue(sb.exec(["true"]).ok)
            deadline = time.monotonic() + 20
            while True:
                try:
                    self.roche.get(sb.id)
                except SandboxNotFound:
                    break
                self.assertLess(time.monotonic(), deadline, "the sandbox outlived its timeout_secs")
                time.sleep(0.25)


    def test_network_allowlist(self) -> None:
        import http.server
        import threading

        class Hello(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = b"allowed"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        srv = http.server.HTTPServer(("127.0.0.12", 0), Hello)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        addr = "127.0.0.12:%d" % srv.server_address[1]
        code = "import sys, urllib.request\nprint(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
        with self.roche.create(image=harness.image(), network_allowlist=[addr]) as sb:
            self.assertEqual(sb.exec(["python3", "-c", code, "http://%s/" % addr]).stdout, "allowed\n")
            r = sb.exec(["python3", "-c", code, "http://127.0.0.13:1/"])
            self.assertNotEqual(r.exit_code, 0)
            self.assertIn("403", r.stderr)
            # The decision log has both, the refusal's entry suggested; an entry allowed
            # live lets the next request through, one denied refuses it again.
            deadline = time.monotonic() + 10
            while True:
                log = sb.egress_log()
                if len(log) == 2 and log[0].done:
                    break
                self.assertLess(time.monotonic(), deadline, "the egress log lacks the two decisions: %r" % (log,))
                time.sleep(0.1)
            self.assertTrue(log[0].allowed)
            self.assertEqual((log[0].method, log[0].rule, log[0].sandbox), ("GET", addr, sb.id))
            self.assertGreater(log[0].bytes_in, 0)
            self.assertFalse(log[1].allowed)
            self.assertIn("allowlist", log[1].reason)
            self.assertEqual(sb.egress_suggest(), ["127.0.0.13:1"])
            self.assertEqual(sb.egress_deny(addr), [])
            r = sb.exec(["python3", "-c", code, "http://%s/" % addr])
            self.assertIn("403", r.stderr)
            self.assertEqual(sb.egress_allow(addr), [addr])
            self.assertEqual(sb.exec(["python3", "-c", code, "http://%s/" % addr]).stdout, "allowed\n")
            with self.assertRaises(RocheError):
                sb.egress_deny("nowhere.example")


class SandboxThroughCLI(SandboxThroughDaemon):
    transport = "cli"

    def test_network_allowlist(self) -> None:
        # The CLI transport creates directly, in a process that does not outlive the
        # sandbox, so it cannot run the proxy: a clear refusal rather than a silent no.
        with self.assertRaises(RocheError) as cm:
            self.roche.create(image=harness.image(), network_allowlist=["pypi.org"])
        self.assertIn("roched", str(cm.exception))


class DirectThenDaemon(harness.SandboxTestCase):
    """One view: a sandbox made with roche in direct mode, before roched runs, is the
    user's through roched too: the SDK lists it, gets it, runs in it, copies to it and
    destroys it, sync and async."""

    def test_lists_and_gets_what_roche_made_directly(self) -> None:
        for api in ("sync", "async"):
            with self.subTest(api=api):
                made = subprocess.run([harness.CLI, "--direct", "create", "--image", harness.image()],
                                      capture_output=True, text=True, timeout=120)
                self.assertEqual(made.returncode, 0, made.stderr)
                sid = made.stdout.strip()
                self.addCleanup(subprocess.run, [harness.CLI, "--direct", "destroy", sid], capture_output=True)
                d = harness.Daemon(name="oneview-" + api)
                self.addCleanup(d.stop)
                if api == "sync":
                    self._sync(d.socket, sid)
                else:
                    asyncio.run(self._async(d.socket, sid))
                # roched removes a destroyed sandbox in the background.
                deadline = time.monotonic() + 30
                while sid in subprocess.run([harness.CLI, "--direct", "list", "--json"], capture_output=True, text=True).stdout:
                    self.assertLess(time.monotonic(), deadline, f"{sid} outlived its destroy through roched")
                    time.sleep(0.25)

    def _sync(self, socket_path: str, sid: str) -> None:
        roche = Roche(transport="daemon", socket=socket_path)
        self.addCleanup(roche.close)
        listed = {s.id: s for s in roche.list()}
        self.assertIn(sid, listed)
        self.assertEqual(listed[sid].owner, os.environ["ROCHE_OWNER"])
        sb = roche.get(sid)
        self.assertEqual(sb.exec(["echo", "made directly"]).stdout, "made directly\n")
        sb.write_file("/tmp/f.txt", b"through roched")
        self.assertEqual(sb.read_file("/tmp/f.txt"), b"through roched")
        sb.destroy()
        self.assertNotIn(sid, [s.id for s in roche.list()])
        with self.assertRaises(SandboxNotFound):
            roche.get(sid)

    async def _async(self, socket_path: str, sid: str) -> None:
        roche = AsyncRoche(transport="daemon", socket=socket_path)
        try:
            self.assertIn(sid, [s.id for s in await roche.list()])
            sb = await roche.get(sid)
            self.assertEqual((await sb.exec(["echo", "made directly"])).stdout, "made directly\n")
            await sb.destroy()
            with self.assertRaises(SandboxNotFound):
                await roche.get(sid)
        finally:
            roche.close()


class DaemonOverTLS(harness.SandboxTestCase):
    """roched over TLS, with the local CA roche daemon start --tls makes: the SDK verifies
    its certificate (ca= or ROCHE_CA_FILE), sync and async, and refuses it in one line
    without the CA or with another one, never falling back to the CLI."""

    def _start(self, name: str, client_ca: bool = False) -> tuple[str, str, str]:
        """A roched over TLS on a free port: its address, CA file and token. With
        client_ca, it requires client certificates signed by its local CA."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        d = tempfile.mkdtemp(prefix=f"roche-sdk-tls-{name}-")
        sock = os.path.join(d, "r.sock")
        token = os.urandom(16).hex()
        tok = os.path.join(d, "token")
        with open(os.open(tok, os.O_CREAT | os.O_WRONLY, 0o600), "w") as f:
            f.write(token)
        p = subprocess.run([harness.CLI, "--socket", sock, "daemon", "start", "--roched", harness.ROCHED,
                            "--listen", f"tcp://127.0.0.1:{port}", "--tls", "--token-file", tok,
                            *(["--client-ca", os.path.join(d, "tls", "ca.pem")] if client_ca else []),
                            "--", "--providers", "docker"], capture_output=True, text=True, timeout=120)
        self.addCleanup(shutil.rmtree, d, True)
        self.addCleanup(subprocess.run, [harness.CLI, "--socket", sock, "daemon", "stop"], capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        m = re.search(r"ROCHE_ADDRESS=(\S+) ROCHE_CA_FILE=(\S+)", p.stdout)
        self.assertIsNotNone(m, p.stdout)
        assert m is not None
        self._sockets[m.group(1)] = sock
        return m.group(1), m.group(2), token

    def setUp(self) -> None:
        super().setUp()
        self._sockets: dict[str, str] = {}

    def _client_cert(self, address: str, tenant: str) -> tuple[str, str]:
        """A client certificate for tenant from the local CA of the roched at address."""
        out = tempfile.mkdtemp(prefix="roche-sdk-tls-client-")
        self.addCleanup(shutil.rmtree, out, True)
        p = subprocess.run([harness.CLI, "--socket", self._sockets[address], "daemon", "client-cert", tenant, "--out", out],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        return os.path.join(out, f"{tenant}-client.pem"), os.path.join(out, f"{tenant}-client-key.pem")

    def test_client_certificates(self) -> None:
        address, ca, token = self._start("c", client_ca=True)
        other, _, _ = self._start("d")
        cert, key = self._client_cert(address, "acme")
        wrong_cert, wrong_key = self._client_cert(other, "acme")
        env = {"ROCHE_CA_FILE": "", "ROCHE_TOKEN": "", "ROCHE_TOKEN_FILE": "", "ROCHE_CLIENT_CERT": "", "ROCHE_CLIENT_KEY": ""}
        with mock.patch.dict(os.environ, env):
            with Roche(transport="daemon", address=address, ca=ca, client_cert=cert, client_key=key).create(
                    image=harness.image()) as sb:
                self.assertEqual(sb.exec(["echo", "by certificate"]).stdout, "by certificate\n")
                self.assertTrue(sb.info.owner.endswith("/acme"), sb.info)

            async def alist(**kw: str) -> None:
                await AsyncRoche(transport="daemon", address=address, ca=ca, **kw).list()

            with mock.patch.dict(os.environ, {"ROCHE_CLIENT_CERT": cert, "ROCHE_CLIENT_KEY": key}):
                self.assertEqual(Roche(transport="daemon", address=address, ca=ca).list(), [])
                asyncio.run(alist())
            for what, kw in (("no client certificate", {"token": token}),
                             ("one from another CA", {"client_cert": wrong_cert, "client_key": wrong_key})):
                with self.subTest(what=what):
                    with self.assertRaises(ProviderUnavailable) as cm:
                        Roche(transport="daemon", address=address, ca=ca, **kw).list()
                    self.assertNotIn("\n", cm.exception.message)
                    self.assertIn("client_cert=", cm.exception.message)
                    with self.assertRaises(ProviderUnavailable) as acm:
                        asyncio.run(alist(**kw))
                    self.assertIn("client_cert=", acm.exception.message)

    def test_tls(self) -> None:
        address, ca, token = self._start("a")
        self.assertTrue(address.startswith("https://127.0.0.1:"), address)
        with mock.patch.dict(os.environ, {"ROCHE_CA_FILE": "", "ROCHE_TOKEN": ""}):
            roche = Roche(transport="daemon", address=address, token=token, ca=ca)
            with roche.create(image=harness.image()) as sb:
                self.assertEqual(sb.exec(["echo", "over tls"]).stdout, "over tls\n")
                self.assertTrue(sb.info.owner.endswith("/default"), sb.info)

            async def main(ca_arg: Optional[str]) -> str:
                aroche = AsyncRoche(transport="daemon", address=address, token=token, ca=ca_arg)
                async with (await aroche.create(image=harness.image())) as asb:
                    return (await asb.exec(["echo", "async over tls"])).stdout

            self.assertEqual(asyncio.run(main(ca)), "async over tls\n")
            with mock.patch.dict(os.environ, {"ROCHE_CA_FILE": ca}):
                self.assertEqual(Roche(transport="daemon", address=address, token=token).list(), [])
                self.assertEqual(asyncio.run(main(None)), "async over tls\n")

            # Another roched's CA, and the system's CAs: refused, in one line, for
            # either transport choice (auto must not fall back to the CLI).
            _, other_ca, _ = self._start("b")
            for what, kw in (("another CA", {"ca": other_ca}), ("the system's CAs", {})):
                for transport in ("daemon", "auto"):
                    with self.subTest(what=what, transport=transport):
                        with self.assertRaises(ProviderUnavailable) as cm:
                            Roche(transport=transport, address=address, token=token, **kw).list()
                        msg = cm.exception.message
                        self.assertNotIn("\n", msg)
                        self.assertIn("does not trust", msg)
                        self.assertIn("ROCHE_CA_FILE", msg)

                        async def alist() -> None:
                            await AsyncRoche(transport=transport, address=address, token=token, **kw).list()

                        with self.assertRaises(ProviderUnavailable) as acm:
                            asyncio.run(alist())
                        self.assertIn("does not trust", acm.exception.message)
            with self.assertRaises(RocheError) as cm:
                Roche(transport="daemon", address=address.replace("https:", "http:"), token=token, ca=ca)
            self.assertIn("use https://", cm.exception.message)


class DaemonOverTCP(harness.SandboxTestCase):
    """roched on TCP, which it serves only with a bearer token, and to each tenant only
    its own sandboxes."""

    def test_token(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        token = os.urandom(16).hex()
        d = harness.Daemon(name="tcp", args=["--listen", f"tcp://127.0.0.1:{port}"], env={"ROCHE_TOKEN": token})
        self.addCleanup(d.stop)
        with open(f"/proc/{d.proc.pid}/cmdline", "rb") as f:
            self.assertNotIn(token.encode(), f.read())
        address = f"http://127.0.0.1:{port}"
        roche = Roche(transport="daemon", address=address, token=token)
        with roche.create(image=harness.image()) as sb:
            self.assertEqual(sb.exec(["echo", "over tcp"]).stdout, "over tcp\n")
            self.assertTrue(sb.info.owner.endswith("/default"), sb.info)

        async def main() -> str:
            aroche = AsyncRoche(transport="daemon", address=address, token=token)
            async with (await aroche.create(image=harness.image())) as asb:
                return (await asb.exec(["echo", "async over tcp"])).stdout

        self.assertEqual(asyncio.run(main()), "async over tcp\n")
        with mock.patch.dict(os.environ, {"ROCHE_TOKEN": ""}):
            with self.assertRaises(RocheError) as cm:
                Roche(transport="daemon", address=address, token="wrong").create(image=harness.image())
        self.assertEqual(cm.exception.reason, "unauthenticated")
        self.assertIn("ROCHE_TOKEN", cm.exception.message)

        # A token file: used when only its owner can read it, refused otherwise.
        tdir = tempfile.mkdtemp()
        self.addCleanup(lambda: [os.remove(os.path.join(tdir, n)) for n in os.listdir(tdir)] and os.rmdir(tdir))
        path = os.path.join(tdir, "token")
        with open(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600), "w") as f:
            f.write(token + "\n")
        with mock.patch.dict(os.environ, {"ROCHE_TOKEN": ""}):
            with Roche(transport="daemon", address=address, token_file=path).create(image=harness.image()) as sb:
                self.assertEqual(sb.exec(["echo", "by file"]).stdout, "by file\n")
            with mock.patch.dict(os.environ, {"ROCHE_TOKEN_FILE": path}):
                self.assertEqual(Roche(transport="daemon", address=address).list(), [])
            os.chmod(path, 0o644)
            with self.assertRaises(RocheError) as cm:
                Roche(transport="daemon", address=address, token_file=path)
            self.assertIn("chmod 600", str(cm.exception))

    def test_tenants(self) -> None:
        """Two tenants of one roched: neither reaches the other's sandbox."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        tokens = {"acme": os.urandom(16).hex(), "bolt": os.urandom(16).hex()}
        tdir = tempfile.mkdtemp()
        path = os.path.join(tdir, "tokens.json")
        hashes = {n: subprocess.run([harness.ROCHED, "hash-token"], input=t, capture_output=True, text=True,
                                    check=True).stdout.strip() for n, t in tokens.items()}
        with open(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600), "w") as f:
            json.dump({"tenants": [{"name": n, "token_sha256": h} for n, h in hashes.items()]}, f)
        d = harness.Daemon(name="tenants", args=["--listen", f"tcp://127.0.0.1:{port}", "--tokens-file", path])
        self.addCleanup(d.stop)
        os.remove(path)
        os.rmdir(tdir)
        address = f"http://127.0.0.1:{port}"
        acme = Roche(transport="daemon", address=address, token=tokens["acme"])
        bolt = Roche(transport="daemon", address=address, token=tokens["bolt"])
        with acme.create(image=harness.image()) as sb:
            with self.assertRaises(SandboxNotFound):
                bolt.get(sb.id)
            self.assertEqual(bolt.list(), [])
            self.assertEqual(sb.exec(["echo", "still mine"]).stdout, "still mine\n")
            self.assertEqual([i.id for i in acme.list()], [sb.id])
