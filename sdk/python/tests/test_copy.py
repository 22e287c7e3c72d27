"""The copy boundary, attacked through the SDK against real sandboxes, once per transport
and for the async API too: what a sandbox holds must never make a copy write outside its
destination, read outside its source, or move more than its cap."""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import tempfile
import threading
import time

import harness

from roche_sandbox import AsyncRoche, Mount, PermissionDenied, ResourceExhausted, Roche

VICTIM_CONTENT = "victim: must never change or leave the host"

#: Fills /tmp to its last block, in big writes then small ones, and says so.
FILL_TMP = """
import errno, os
fd = os.open('/tmp/fill', os.O_WRONLY | os.O_CREAT)
for size in (1 << 20, 4096, 1):
    try:
        while True:
            os.write(fd, os.urandom(size))
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
print('full')
"""


def make_victim(test: harness.SandboxTestCase) -> str:
    """A harmless victim directory on the host, outside every destination, removed at the end."""
    victim = tempfile.mkdtemp(prefix="roche-victim-")
    test.addCleanup(shutil.rmtree, victim, True)
    with open(os.path.join(victim, "keep"), "w") as f:
        f.write(VICTIM_CONTENT)
    return victim


def check_victim(test: harness.SandboxTestCase, victim: str) -> None:
    test.assertEqual(sorted(os.listdir(victim)), ["keep"], "something was written into the victim directory")
    with open(os.path.join(victim, "keep")) as f:
        test.assertEqual(f.read(), VICTIM_CONTENT, "the victim file changed")


def max_rss() -> int:
    """This process's peak resident memory, in bytes."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class CopyThroughDaemon(harness.SandboxTestCase):
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

    def tmp(self) -> str:
        d = tempfile.mkdtemp(prefix="roche-sdk-copy-")
        self.addCleanup(shutil.rmtree, d, True)
        return d

    def test_symlink_swap_attack(self) -> None:
        """The audit's attack: /tmp/e -> victim copied out, then /tmp/e replaced by a
        directory holding cron.d/p and copied out again, onto a host symlink to the victim."""
        victim = make_victim(self)
        dst = os.path.join(self.tmp(), "e")
        with self.roche.create(image=harness.image()) as sb:
            sb.exec(["ln", "-s", victim, "/tmp/e"])
            for preserve in (False, True):
                report = sb.copy_from("/tmp/e", dst, preserve_links=preserve)
                self.assertFalse(os.path.lexists(dst), f"a host symlink was made (preserve_links={preserve})")
                self.assertEqual((report.skipped, report.skipped_links), (1, 1))
                self.assertEqual(report.examples[0].path, "/tmp/e")
                self.assertIn("skipped 1 symlink", report.note)
            sb.exec(["sh", "-c", "rm /tmp/e && mkdir -p /tmp/e/cron.d && echo pwned > /tmp/e/cron.d/p && echo pwned > /tmp/e/keep"])
            os.symlink(victim, dst)  # planted on the host, as the first copy once made it
            sb.copy_from("/tmp/e", dst)
            check_victim(self, victim)
            self.assertFalse(os.path.islink(dst))
            with open(os.path.join(dst, "cron.d", "p")) as f:
                self.assertEqual(f.read(), "pwned\n")

    def test_planted_link_below_destination(self) -> None:
        victim = make_victim(self)
        dst = os.path.join(self.tmp(), "out")
        os.makedirs(dst)
        os.symlink(victim, os.path.join(dst, "sub"))
        os.symlink(os.path.join(victim, "keep"), os.path.join(dst, "f"))
        with self.roche.create(image=harness.image()) as sb:
            sb.exec(["sh", "-c", "mkdir -p /tmp/out/sub && echo pwned > /tmp/out/sub/keep && echo pwned > /tmp/out/f"])
            sb.copy_from("/tmp/out", dst)
        check_victim(self, victim)
        self.assertFalse(os.path.islink(os.path.join(dst, "sub")))
        self.assertFalse(os.path.islink(os.path.join(dst, "f")))

    def test_preserve_links(self) -> None:
        tmp = self.tmp()
        with self.roche.create(image=harness.image()) as sb:
            sb.exec(["sh", "-c", "mkdir -p /tmp/t/a && echo hi > /tmp/t/f && ln -s ../f /tmp/t/a/in && "
                                 "ln -s ../../etc /tmp/t/out && ln -s /etc/passwd /tmp/t/abs"])
            plain = sb.copy_from("/tmp/t", os.path.join(tmp, "plain"))
            kept = sb.copy_from("/tmp/t", os.path.join(tmp, "kept"), preserve_links=True)
        self.assertEqual((plain.skipped_links, plain.links), (3, 0))
        self.assertEqual((kept.skipped_links, kept.links), (2, 1))
        self.assertEqual(os.readlink(os.path.join(tmp, "kept", "a", "in")), "../f")
        with open(os.path.join(tmp, "kept", "a", "in")) as f:
            self.assertEqual(f.read(), "hi\n")
        for gone in ("out", "abs"):
            self.assertFalse(os.path.lexists(os.path.join(tmp, "kept", gone)))
        self.assertFalse(os.path.lexists(os.path.join(tmp, "plain", "a", "in")))

    def test_huge_sparse_file_refused_without_memory(self) -> None:
        dst = os.path.join(self.tmp(), "s")
        with self.roche.create(image=harness.image()) as sb:
            sb.exec(["truncate", "-s", "10T", "/tmp/s"])
            before = max_rss()
            with self.assertRaises(ResourceExhausted) as cm:
                sb.read_file("/tmp/s")
            self.assertIn("10 TiB", str(cm.exception))
            self.assertIn("1 GiB", str(cm.exception))
            with self.assertRaises(ResourceExhausted):
                sb.copy_from("/tmp/s", dst)
            self.assertFalse(os.path.lexists(dst), "the oversized file was written")
            self.assertLess(max_rss() - before, 100 << 20, "read_file held the file in memory")
            # A cap of one's own, lower or higher.
            sb.write_file("/tmp/small", b"x" * 2000)
            with self.assertRaises(ResourceExhausted):
                sb.read_file("/tmp/small", max_bytes=1000)
            self.assertEqual(len(sb.read_file("/tmp/small", max_bytes=2000)), 2000)

    def test_sparse_file_keeps_holes(self) -> None:
        dst = os.path.join(self.tmp(), "sp")
        with self.roche.create(image=harness.image()) as sb:
            sb.exec(["python3", "-c", "f = open('/tmp/sp', 'wb'); f.seek(50 << 20); f.write(b'd' * 4096); f.truncate(100 << 20)"])
            sb.copy_from("/tmp/sp", dst)
        st = os.stat(dst)
        self.assertEqual(st.st_size, 100 << 20)
        self.assertLess(st.st_blocks * 512, 1 << 20, "the holes were filled on the host")
        with open(dst, "rb") as f:
            f.seek(50 << 20)
            self.assertEqual(f.read(4096), b"d" * 4096)

    def test_copy_in_race_never_reads_outside(self) -> None:
        """A rw mount whose file the sandbox swaps with a symlink to a root-only host file
        while the host copies the mount in, again and again."""
        shared = self.tmp()
        os.chmod(shared, 0o777)
        secret_dir = self.tmp()
        secret = os.path.join(secret_dir, "secret")
        with open(secret, "w") as f:
            f.write("root-only-secret-" + os.urandom(8).hex())
        os.chmod(secret, 0o600)
        with open(secret) as f:
            content = f.read()
        loop = ("import os, sys, time\n"
                "d, victim = '/shared', sys.argv[1]\n"
                "end = time.time() + 120\n"
                "while time.time() < end and not os.path.exists(d + '/stop'):\n"
                "    open(d + '/.f', 'w').write('plain'); os.rename(d + '/.f', d + '/f'); time.sleep(0.001)\n"
                "    os.symlink(victim, d + '/.l'); os.rename(d + '/.l', d + '/f'); time.sleep(0.001)\n")
        with self.roche.create(image=harness.image(), mounts=[Mount(shared, "/shared", read_write=True)]) as sb:
            swapper = threading.Thread(target=self._swap, args=(sb.id, loop, secret))
            swapper.start()
            try:
                deadline = time.monotonic() + 30
                while not os.path.lexists(os.path.join(shared, "f")):
                    self.assertLess(time.monotonic(), deadline, "the swapping loop did not start")
                    time.sleep(0.05)
                for i in range(60):
                    sb.copy_to(shared, f"/tmp/got/{i}")
            finally:
                with open(os.path.join(shared, "stop"), "w"):
                    pass
                swapper.join(timeout=150)
            found = sb.exec(["sh", "-c", "grep -rl -- \"$1\" /tmp/got || true", "sh", content]).stdout
            kinds = sb.exec(["sh", "-c", "find /tmp/got -name f -type l | wc -l; find /tmp/got -name f -type f | wc -l"]).stdout.split()
        self.assertEqual(found, "", f"the root-only host file reached the sandbox: {found}")
        # The race was live: the copies saw the symlink and the file.
        self.assertTrue(int(kinds[0]) > 0 and int(kinds[1]) > 0, f"links, files copied: {kinds}")

    def _swap(self, sid: str, loop: str, victim: str) -> None:
        # A client of its own: the test's client is busy copying meanwhile.
        r = Roche(transport=self.transport)
        try:
            r.get(sid).exec(["python3", "-c", loop, victim], timeout=140)
        finally:
            r.close()

    def test_full_tmp_is_no_space(self) -> None:
        with self.roche.create(image=harness.image()) as sb:
            fill = sb.exec(["python3", "-c", FILL_TMP])
            self.assertEqual(fill.stdout, "full\n", fill.stderr)
            # Random bytes: zeros would be written as holes and need no space.
            with self.assertRaises(ResourceExhausted) as cm:
                sb.write_file("/tmp/more", os.urandom(2 << 20))
            self.assertNotIsInstance(cm.exception, PermissionDenied)
            self.assertIn("no space", str(cm.exception))
            src = os.path.join(self.tmp(), "blob")
            with open(src, "wb") as f:
                f.write(os.urandom(2 << 20))
            with self.assertRaises(ResourceExhausted):
                sb.copy_to(src, "/tmp/blob")


class CopyThroughCLI(CopyThroughDaemon):
    transport = "cli"


class AsyncCopy(harness.SandboxTestCase):
    """The async API's own download and upload paths (a worker thread unpacks as the
    event loop receives)."""

    def test_attack_cap_and_links(self) -> None:
        for transport in ("daemon", "cli"):
            with self.subTest(transport=transport):
                asyncio.run(self._attack(transport))

    async def _attack(self, transport: str) -> None:
        victim = make_victim(self)
        tmp = tempfile.mkdtemp(prefix="roche-sdk-copy-")
        self.addCleanup(shutil.rmtree, tmp, True)
        dst = os.path.join(tmp, "e")
        roche = AsyncRoche(transport=transport)
        try:
            async with (await roche.create(image=harness.image())) as sb:
                await sb.exec(["sh", "-c", f"ln -s {victim} /tmp/e && truncate -s 10T /tmp/s && "
                                           "mkdir /tmp/t && echo hi > /tmp/t/f && ln -s f /tmp/t/in"])
                report = await sb.copy_from("/tmp/e", dst, preserve_links=True)
                self.assertFalse(os.path.lexists(dst))
                self.assertEqual(report.skipped_links, 1)
                await sb.exec(["sh", "-c", "rm /tmp/e && mkdir -p /tmp/e/cron.d && echo pwned > /tmp/e/cron.d/p"])
                os.symlink(victim, dst)
                await sb.copy_from("/tmp/e", dst)
                check_victim(self, victim)
                with self.assertRaises(ResourceExhausted):
                    await sb.read_file("/tmp/s")
                with self.assertRaises(ResourceExhausted):
                    await sb.copy_from("/tmp/s", os.path.join(tmp, "s"))
                self.assertFalse(os.path.lexists(os.path.join(tmp, "s")))
                kept = await sb.copy_from("/tmp/t", os.path.join(tmp, "t"), preserve_links=True)
                self.assertEqual((kept.links, kept.files), (1, 1))
                self.assertEqual(os.readlink(os.path.join(tmp, "t", "in")), "f")
                src = os.path.join(tmp, "up")
                os.makedirs(src)
                with open(os.path.join(src, "big"), "wb") as f:
                    f.write(bytes(5000))
                with self.assertRaises(ResourceExhausted):
                    await sb.copy_to(src, "/tmp/up", max_bytes=4096)
                up = await sb.copy_to(src, "/tmp/up2")
                self.assertEqual((up.files, up.bytes), (1, 5000))
                with self.assertRaises(PermissionDenied):
                    await sb.read_file("/tmp/t/in")
        finally:
            roche.close()


if __name__ == "__main__":
    import unittest

    unittest.main()
