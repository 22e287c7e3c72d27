"""The SDK's pieces that need no sandbox: the Connect codec, error mapping, the CLI's
output parser and safe tar extraction."""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import threading
import unittest
from datetime import datetime, timedelta, timezone
from typing import Iterator

import harness

from roche_sandbox import (
    ImageNotFound,
    InUse,
    InvalidConfig,
    PermissionDenied,
    ResourceExhausted,
    RocheError,
    SandboxNotFound,
    SandboxTimeout,
    Unsupported,
)
from roche_sandbox import _cli, _tarutil, _wire
from roche_sandbox.types import Mount, make_config, make_exec_request


class WireTest(unittest.TestCase):
    def test_the_sdk_under_test_is_this_checkouts(self) -> None:
        import roche_sandbox

        self.assertTrue(roche_sandbox.__file__.startswith(harness.REPO))

    def test_times(self) -> None:
        self.assertEqual(_wire.parse_time("2026-11-20T23:00:57.648510800Z"),
                         datetime(2026, 11, 20, 23, 0, 57, 648510, tzinfo=timezone.utc))
        t = _wire.parse_time("2026-11-20T23:00:57+05:30")
        assert t is not None
        self.assertEqual(t.utcoffset(), timedelta(hours=5, minutes=30))
        self.assertIsNone(_wire.parse_time(""))
        self.assertEqual(_wire.parse_duration("1.5s"), 1.5)

    def test_connect_errors(self) -> None:
        detail = {"type": "roche.v1.ErrorDetail", "value": "CAE", "debug": {"reason": "ERROR_REASON_NOT_FOUND"}}
        e = _wire.error_from_connect({"code": "not_found", "message": "not found: no sandbox x", "details": [detail]},
                                     404, "sock")
        self.assertIsInstance(e, SandboxNotFound)
        self.assertEqual(e.message, "not found: no sandbox x")
        # Without the debug form, the binary detail: reason 6 is image not found.
        e = _wire.error_from_connect({"code": "failed_precondition", "message": "m",
                                      "details": [{"type": "roche.v1.ErrorDetail", "value": "CAY"}]}, 412, "s")
        self.assertIsInstance(e, ImageNotFound)
        self.assertIsInstance(_wire.error_from_connect({"code": "deadline_exceeded", "message": "m"}, 504, "s"),
                              SandboxTimeout)
        self.assertIsInstance(_wire.error_from_connect({"code": "permission_denied", "message": "m"}, 403, "s"),
                              PermissionDenied)
        e = _wire.error_from_connect({"code": "internal", "message": "unsupported: no"}, 500, "s")
        self.assertIsInstance(e, Unsupported)
        e = _wire.error_from_connect({"code": "unauthenticated", "message": "missing token"}, 401, "s")
        self.assertIn("ROCHE_TOKEN", e.message)
        self.assertEqual(type(_wire.error_from_connect("junk", 502, "s")), RocheError)

    def test_retry_after(self) -> None:
        message = "resource exhausted: pool p has no idle sandbox: retry in 1.5s, or raise the pool's max or wait"
        # google.rpc.RetryInfo{retry_delay: {seconds: 1, nanos: 500000000}}, as roched sends it.
        value = "CggIARCAyrXuAQ"
        e = _wire.error_from_connect({"code": "resource_exhausted", "message": message,
                                      "details": [{"type": "google.rpc.RetryInfo", "value": value}]}, 429, "s")
        self.assertIsInstance(e, ResourceExhausted)
        self.assertEqual(e.retry_after, 1.5)
        # The JSON form, when a server adds it, and no hint at all.
        debug = {"type": "google.rpc.RetryInfo", "value": "", "debug": {"retryDelay": "0.250s"}}
        self.assertEqual(_wire.error_from_connect({"code": "resource_exhausted", "message": message,
                                                   "details": [debug]}, 429, "s").retry_after, 0.25)
        self.assertIsNone(_wire.error_from_connect({"code": "resource_exhausted", "message": message}, 429,
                                                   "s").retry_after)
        # A malformed detail is no hint, not a crash.
        junk = {"type": "google.rpc.RetryInfo", "value": "Cg"}
        self.assertIsNone(_wire.error_from_connect({"code": "resource_exhausted", "message": message,
                                                   "details": [junk]}, 429, "s").retry_after)
        line = '{"error":{"reason":"exhausted","message":"m: retry in 564ms","retry_after_ms":564}}\n'
        e = _cli.error_from_stderr(line.encode(), 125, "create")
        self.assertIsInstance(e, ResourceExhausted)
        self.assertEqual(e.retry_after, 0.564)
        self.assertIsNone(_cli.error_from_stderr(b'{"error":{"reason":"exhausted","message":"m"}}\n', 125,
                                                 "create").retry_after)

    def test_in_use(self) -> None:
        message = "in use: workspace w is mounted by sandbox abc: destroy it first (roche destroy abc)"
        detail = {"type": "roche.v1.ErrorDetail", "value": "CAk", "debug": {"reason": "ERROR_REASON_IN_USE"}}
        e = _wire.error_from_connect({"code": "failed_precondition", "message": message, "details": [detail]}, 412, "s")
        self.assertIsInstance(e, InUse)
        self.assertEqual((e.reason, e.message), ("in_use", message))
        binary_only = {"type": "roche.v1.ErrorDetail", "value": "CAk"}
        e = _wire.error_from_connect({"code": "failed_precondition", "message": "m", "details": [binary_only]}, 412, "s")
        self.assertIsInstance(e, InUse)
        # Without a detail the message says it; failed_precondition alone is also image not found.
        self.assertIsInstance(_wire.error_from_connect({"code": "failed_precondition", "message": message}, 412, "s"),
                              InUse)
        e = _cli.error_from_stderr(f"roche: {message}\n".encode(), 1, "workspace")
        self.assertIsInstance(e, InUse)
        e = _cli.error_from_stderr(b"roche: removing snapshot s: in use: snapshot s is the image of a live sandbox\n",
                                   1, "snapshot")
        self.assertIsInstance(e, InUse)

    def test_snapshots_and_workspaces(self) -> None:
        cfg = make_config(None, False, False, 300, "512m", 1.0, 64, None, None, None, None, None, "proj", "deps")
        c = _wire.config_request("docker", cfg)["config"]
        self.assertEqual((c["workspace"], c["fromSnapshot"]), ("proj", "deps"))
        args = _cli.create_args("docker", cfg)
        self.assertEqual(args[-5:], ["--workspace", "proj", "--from-snapshot", "deps", "--hold"])
        plain = make_config("img", False, False, 300, "512m", 1.0, 64, None, None, None, None)
        self.assertNotIn("workspace", _wire.config_request("docker", plain)["config"])
        self.assertNotIn("--workspace", _cli.create_args("docker", plain))
        with self.assertRaises(InvalidConfig):
            make_config("img", False, False, 300, "512m", 1.0, 64, None, None, None, None, None, 7)  # type: ignore[arg-type]
        self.assertEqual(_cli.reset_args("abc", True), ["reset", "--json", "abc"])
        self.assertEqual(_cli.reset_args("abc", False), ["reset", "--json", "abc", "--wipe-workspace"])

        when = datetime(2026, 11, 20, 23, 0, 57, tzinfo=timezone.utc)
        s = _wire.parse_snapshot({"name": "n", "provider": "docker", "image": "i", "createdAt": "2026-11-20T23:00:57Z"})
        self.assertEqual(s, _cli.parse_snapshot({"name": "n", "provider": "docker", "image": "i",
                                                 "created_at": "2026-11-20T23:00:57Z"}))
        self.assertEqual(s.created_at, when)
        w = _wire.parse_workspace({"name": "w", "provider": "docker", "createdAt": "2026-11-20T23:00:57Z",
                                   "inUseBy": ["a", "b"]})
        self.assertEqual(w, _cli.parse_workspace({"name": "w", "provider": "docker",
                                                  "created_at": "2026-11-20T23:00:57Z", "in_use_by": ["a", "b"]}))
        self.assertEqual((w.in_use_by, w.created_at), (("a", "b"), when))
        # Go leaves an unused workspace's in_use_by out of its JSON.
        self.assertEqual(_cli.parse_workspace({"name": "w"}).in_use_by, ())
        self.assertEqual(_wire.parse_workspace({"name": "w"}).in_use_by, ())

    def test_leased_unless_asked_not_to_be(self) -> None:
        cfg = make_config("img", False, False, 300, "512m", 1.0, 64, None, None, None, None)
        self.assertTrue(cfg.leased)
        self.assertIs(_wire.config_request("docker", cfg)["config"]["leased"], True)
        self.assertEqual(_cli.create_args("docker", cfg)[-1], "--hold")
        kept = make_config("img", False, False, 300, "512m", 1.0, 64, None, None, None, None, leased=False)
        self.assertNotIn("leased", _wire.config_request("docker", kept)["config"])
        self.assertNotIn("--hold", _cli.create_args("docker", kept))
        listed = {"providers": [{"name": "docker", "capabilities": {"leases": True, "files": True}},
                                {"name": "wasm", "capabilities": {"files": True}}, {"name": "old"}]}
        self.assertEqual(_wire.leases(listed), {"docker": True, "wasm": False, "old": False})
        self.assertEqual(_wire.leases({}), {})

    def test_output_decodes_characters_split_across_chunks(self) -> None:
        out = _wire.OutputAssembler(limit=8)
        snowman = "☃".encode()
        a = out.output("stdout", b"x" + snowman[:1])
        b = out.output("stdout", snowman[1:] + b"yyyyyyy")
        self.assertEqual(a.text + b.text, "x☃yyyyyyy")
        r = out.result(_wire.parse_result({"exitCode": 1}))
        self.assertTrue(r.truncated)
        self.assertEqual(r.stdout, "x☃yyyy")

    def test_requests(self) -> None:
        cfg = make_config("img", False, False, 300, "512m", 1.0, 64, {"A": "b"},
                          ["/h:/s:rw", Mount("/a", "/b")], None, None)
        req = _wire.config_request("docker", cfg)
        self.assertEqual(req["config"]["mounts"], [{"source": "/h", "target": "/s", "readWrite": True},
                                                   {"source": "/a", "target": "/b", "readWrite": False}])
        self.assertNotIn("user", req["config"])
        # The disk limit always travels, so a daemon's default never replaces it; a
        # workspace's size only when asked.
        self.assertEqual(req["config"]["disk"], "1g")
        self.assertNotIn("workspaceSize", req["config"])
        sized = make_config("img", False, True, 300, "512m", 1.0, 64, None, None, None, None,
                            workspace="w", disk=100 << 20, workspace_size="50m")
        self.assertEqual((_wire.config_request("docker", sized)["config"]["disk"],
                          _wire.config_request("docker", sized)["config"]["workspaceSize"]), (str(100 << 20), "50m"))
        args = _cli.create_args("docker", sized)
        self.assertEqual(args[args.index("--disk") + 1], str(100 << 20))
        self.assertEqual(args[args.index("--workspace-size") + 1], "50m")
        self.assertNotIn("--workspace-size", _cli.create_args("docker", cfg))
        self.assertEqual(_wire.parse_workspace({"name": "w", "sizeBytes": "52428800"}).size_bytes, 50 << 20)
        self.assertEqual(_cli.parse_workspace({"name": "w", "size_bytes": 52428800}).size_bytes, 50 << 20)
        self.assertEqual(_wire.parse_workspace({"name": "old"}).size_bytes, 0)
        e = _wire.exec_request("id", make_exec_request(["cat"], 2, "in", None, None))
        self.assertEqual((e["timeoutSecs"], e["stdin"]), (2.0, "aW4="))
        with self.assertRaises(InvalidConfig):
            make_exec_request(["x"], -1, None, None, None)
        with self.assertRaises(InvalidConfig):
            Mount.parse("/a:/b:rx")


class CLIParserTest(unittest.TestCase):
    def feed_all(self, chunks: list[bytes], rc: int) -> tuple[str, object]:
        p = _cli.StreamParser()
        text = "".join(e.text for c in chunks for e in p.feed("stderr", c))
        events, result = p.finish(rc, 0.5)
        return text + "".join(e.text for e in events), result

    def test_closing_lines_become_flags(self) -> None:
        text, r = self.feed_all([b"warn\n", b"roche: output truncated: a stream passed 10485760 bytes\n",
                                 b"roche: the command timed out: --timeout 1s killed it after it ran 1.003s\n"], 124)
        self.assertEqual(text, "warn\n")
        self.assertEqual((r.truncated, r.timed_out, r.exit_code), (True, True, 137))  # type: ignore[attr-defined]
        # The sandbox's lifetime, rather than the command's timeout, killed it.
        text, r = self.feed_all([b"roche: the command was killed when the sandbox's lifetime ended (--timeout 2s, "
                                 b"counted from its create; the command ran 1.7s; --exec-timeout bounds the command alone)\n"], 124)
        self.assertEqual(text, "")
        self.assertEqual((r.timed_out, r.exit_code), (True, 137))  # type: ignore[attr-defined]

    def test_commands_own_roche_lines_are_kept(self) -> None:
        text, r = self.feed_all([b"roche: said by the command\nafter\n"], 0)
        self.assertEqual(text, "roche: said by the command\nafter\n")
        self.assertEqual(r.exit_code, 0)  # type: ignore[attr-defined]

    def test_error_line(self) -> None:
        p = _cli.StreamParser()
        p.feed("stderr", b"roche: not found: no sandbox abc (roche list shows the live ones)\n")
        with self.assertRaises(SandboxNotFound):
            p.finish(125, 0)

    def test_one_line_errors(self) -> None:
        e = _cli.error_from_stderr(b"roche: invalid config: memory: bad (see --help)\n", 1, "create")
        self.assertIsInstance(e, InvalidConfig)
        self.assertEqual(e.message, "invalid config: memory: bad")
        e = _cli.error_from_stderr(b"panic: boom\n", 2, "create")
        self.assertEqual(type(e), RocheError)
        self.assertIn("panic: boom", e.message)

    def test_json_errors(self) -> None:
        # With --json the reason decides, whatever the English says.
        e = _cli.error_from_stderr(b'{"error":{"reason":"in_use","message":"workspace w is mounted"}}\n', 1, "workspace")
        self.assertIsInstance(e, InUse)
        self.assertEqual(e.message, "workspace w is mounted")
        e = _cli.error_from_stderr(b'{"error":{"reason":"","message":"not found in the text"}}\n', 1, "create")
        self.assertEqual(type(e), RocheError)
        e = _cli.error_from_stderr(b'{"error": broken\n', 1, "create")
        self.assertEqual(type(e), RocheError)


class TarTest(unittest.TestCase):
    def tar(self, *members: tuple[str, bytes, bytes]) -> io.BytesIO:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tw:
            for name, kind, data in members:
                info = tarfile.TarInfo(name)
                if kind == b"sym":
                    info.type, info.linkname = tarfile.SYMTYPE, data.decode()
                    tw.addfile(info)
                elif kind == b"d":
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    tw.addfile(info)
                else:
                    info.size = len(data)
                    tw.addfile(info, io.BytesIO(data))
        buf.seek(0)
        return buf

    def test_extract_refuses_escapes(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            for bad in [self.tar(("root/../../evil", b"f", b"x")),
                        self.tar(("/etc/evil", b"f", b"x")),
                        self.tar(("root/", b"d", b""), ("other/evil", b"f", b"x"))]:
                with self.assertRaises(RocheError):
                    _tarutil.extract(bad, os.path.join(tmp, "dst"), 1 << 20, True, "/tmp")
            # A link in the archive cannot carry a later entry out: the link is replaced.
            tar = self.tar(("root/link", b"sym", tmp.encode()), ("root/link/evil", b"f", b"x"))
            _tarutil.extract(tar, os.path.join(tmp, "dst2"), 1 << 20, True, "/tmp")
            self.assertFalse(os.path.exists(os.path.join(tmp, "evil")))
            self.assertFalse(os.path.islink(os.path.join(tmp, "dst2", "link")))

    def test_round_trip(self) -> None:
        data = os.urandom(100_000)
        tar = io.BytesIO(_tarutil.file_tar("f.bin", data, 0o600))
        self.assertEqual(_tarutil.file_from_tar(tar, "/tmp/f.bin", 1 << 20), data)
        with self.assertRaises(InvalidConfig):
            _tarutil.base_name("/", "path")

    def test_planted_links_replaced_never_followed(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            victim = os.path.join(tmp, "victim")
            os.mkdir(victim)
            with open(os.path.join(victim, "keep"), "w") as f:
                f.write("victim")
            dst = os.path.join(tmp, "e")
            os.symlink(victim, dst)  # the destination itself
            os.makedirs(os.path.join(tmp, "out"))
            os.symlink(victim, os.path.join(tmp, "out", "sub"))  # below it
            os.symlink(os.path.join(victim, "keep"), os.path.join(tmp, "out", "f"))
            _tarutil.extract(self.tar(("e/", b"d", b""), ("e/cron.d/p", b"f", b"pwned"), ("e/keep", b"f", b"pwned")),
                             dst, 1 << 20, False, "/tmp")
            _tarutil.extract(self.tar(("out/sub/keep", b"f", b"pwned"), ("out/f", b"f", b"pwned")),
                             os.path.join(tmp, "out"), 1 << 20, False, "/tmp")
            self.assertEqual(sorted(os.listdir(victim)), ["keep"])
            with open(os.path.join(victim, "keep")) as f:
                self.assertEqual(f.read(), "victim")
            self.assertFalse(os.path.islink(dst))

    def test_links_only_when_asked_and_inside(self) -> None:
        members = [("r/", b"d", b""), ("r/f", b"f", b"x"), ("r/a/in", b"sym", b"../f"), ("r/out", b"sym", b"../x"),
                   ("r/abs", b"sym", b"/etc"), ("r/a/tricky", b"sym", b"b/../..")]
        with tempfile.TemporaryDirectory() as tmp:
            rep = _tarutil.extract(self.tar(*members), os.path.join(tmp, "plain"), 1 << 20, False, "/tmp")
            self.assertEqual((rep.skipped, rep.skipped_links, rep.links), (4, 4, 0))
            self.assertIn("skipped 4 symlinks", rep.note)
            rep = _tarutil.extract(self.tar(*members), os.path.join(tmp, "kept"), 1 << 20, True, "/tmp")
            self.assertEqual((rep.skipped, rep.links), (3, 1))
            self.assertEqual(os.readlink(os.path.join(tmp, "kept", "a", "in")), "../f")
            for gone in ("out", "abs", "a/tricky"):
                self.assertFalse(os.path.lexists(os.path.join(tmp, "kept", gone)))
            # A root that is itself a link is never inside: the destination is the link.
            rep = _tarutil.extract(self.tar(("e", b"sym", b"x")), os.path.join(tmp, "e"), 1 << 20, True, "/tmp")
            self.assertEqual(rep.skipped, 1)
            self.assertFalse(os.path.lexists(os.path.join(tmp, "e")))

    def test_cap_refused_before_the_data_is_read(self) -> None:
        info = tarfile.TarInfo("s")
        info.size = 10 << 40
        head = info.tobuf(tarfile.PAX_FORMAT)

        def stream() -> Iterator[bytes]:
            yield head
            raise AssertionError("the data of a file over the cap was read")

        with tempfile.TemporaryDirectory() as tmp:
            with self.assertRaises(ResourceExhausted) as cm:
                _tarutil.extract(_tarutil.ChunkReader(stream()), os.path.join(tmp, "s"), 1 << 30, False, "/tmp")
            self.assertIn("10 TiB", str(cm.exception))
            self.assertIn("1 GiB", str(cm.exception))
            self.assertFalse(os.path.lexists(os.path.join(tmp, "s")))
            with self.assertRaises(ResourceExhausted):
                _tarutil.file_from_tar(_tarutil.ChunkReader(stream()), "/tmp/s", 1 << 30)

    def test_sparse_kept(self) -> None:
        size = 100 << 20
        info = tarfile.TarInfo("sp")
        info.size = size

        def stream() -> Iterator[bytes]:
            yield info.tobuf(tarfile.PAX_FORMAT)
            for i in range(100):
                yield (b"d" * 4096 + bytes((1 << 20) - 4096)) if i == 50 else bytes(1 << 20)
            yield bytes(1024)

        with tempfile.TemporaryDirectory() as tmp:
            dst = os.path.join(tmp, "sp")
            _tarutil.extract(_tarutil.ChunkReader(stream()), dst, 1 << 30, False, "/tmp")
            st = os.stat(dst)
            self.assertEqual(st.st_size, size)
            self.assertLess(st.st_blocks * 512, 1 << 20)
            with open(dst, "rb") as f:
                f.seek(50 << 20)
                self.assertEqual(f.read(4096), b"d" * 4096)

    def test_path_tar_never_reads_through_a_link(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            victim = os.path.join(tmp, "victim")
            with open(victim, "w") as f:
                f.write("victim-secret")
            src = os.path.join(tmp, "src")
            os.mkdir(src)
            os.symlink(victim, os.path.join(src, "l"))
            os.mkfifo(os.path.join(src, "fifo"))
            rep = _tarutil.Report()
            data = b"".join(_tarutil.path_tar(src, "r", 1 << 20, rep))
            self.assertNotIn(b"victim-secret", data)
            self.assertEqual((rep.links, rep.skipped), (1, 1))
            with open(os.path.join(src, "big"), "wb") as f:
                f.write(bytes(2048))
            with self.assertRaises(ResourceExhausted):
                b"".join(_tarutil.path_tar(src, "r", 1024))

    def test_path_tar_race_never_reads_through_a_link(self) -> None:
        """A file and a symlink to a victim swapped in a loop while the tree is read: the
        victim's content never reaches a stream (the copy-in race of a rw mount)."""
        with tempfile.TemporaryDirectory() as tmp:
            victim = os.path.join(tmp, "victim")
            with open(victim, "w") as f:
                f.write("victim-secret")
            src = os.path.join(tmp, "src")
            os.mkdir(src)
            stop = threading.Event()

            def swap() -> None:
                p, tf, tl = os.path.join(src, "f"), os.path.join(src, ".f"), os.path.join(src, ".l")
                while not stop.is_set():
                    with open(tf, "w") as f:
                        f.write("plain")
                    os.rename(tf, p)
                    os.symlink(victim, tl)
                    os.rename(tl, p)

            t = threading.Thread(target=swap)
            t.start()
            try:
                for i in range(1000):
                    try:
                        data = b"".join(_tarutil.path_tar(src, "r", 1 << 20))
                    except RocheError:
                        continue  # "kept changing": refused, which is fine
                    self.assertFalse(b"victim-secret" in data, f"round {i}: the victim's content was read")
            finally:
                stop.set()
                t.join()


if __name__ == "__main__":
    unittest.main()
