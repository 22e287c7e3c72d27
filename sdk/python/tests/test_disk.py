"""Disk limits through the SDK, against the real Docker provider, through the daemon and
through the CLI, sync and async: disk= bounds a writable root, workspace_size= a new
workspace, and a write past either fails with ENOSPC inside the sandbox."""

from __future__ import annotations

import asyncio
import uuid

import harness

from roche_sandbox import AsyncRoche, InvalidConfig, Roche, SandboxNotFound

#: Writes up to 200 MiB into a file in the directory given and prints the errno it
#: stopped at and the MiB written.
FILL = """
import errno, os, sys
n = 0
try:
    with open(os.path.join(sys.argv[1], 'fill'), 'wb') as f:
        while n < (200 << 20):
            f.write(b'z' * (1 << 20)); f.flush(); n += 1 << 20
    print('unbounded', n >> 20)
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno), n >> 20)
"""

#: Prints the size of the filesystem holding the path given, in MiB.
STATFS = "import os, sys; s = os.statvfs(sys.argv[1]); print(s.f_blocks * s.f_frsize >> 20)"


class DiskThroughDaemon(harness.SandboxTestCase):
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

    def workspace(self) -> str:
        name = f"sdk-test-size-{uuid.uuid4().hex[:8]}"

        def remove() -> None:
            try:
                self.roche.delete_workspace(name)
            except SandboxNotFound:
                pass

        self.addCleanup(remove)
        return name

    def test_disk_bounds_a_writable_root(self) -> None:
        with self.roche.create(image=harness.image(), writable=True, disk="100m") as sb:
            r = sb.exec(["python3", "-c", FILL, "/var/tmp"])
            stopped, mib = r.stdout.split()
            self.assertEqual(stopped, "ENOSPC", r)
            self.assertTrue(80 <= int(mib) <= 100, r.stdout)
        # A number is bytes.
        with self.roche.create(image=harness.image(), writable=True, disk=200 << 20) as sb:
            mib = int(sb.exec(["python3", "-c", STATFS, "/"]).stdout)
            self.assertTrue(160 <= mib <= 200, mib)

    def test_default_disk_is_one_gib(self) -> None:
        with self.roche.create(image=harness.image(), writable=True) as sb:
            mib = int(sb.exec(["python3", "-c", STATFS, "/"]).stdout)
            self.assertTrue(900 <= mib <= 1024, mib)

    def test_workspace_size(self) -> None:
        ws = self.workspace()
        with self.roche.create(image=harness.image(), workspace=ws, workspace_size="50m") as sb:
            r = sb.exec(["python3", "-c", FILL, "/workspace"])
            stopped, mib = r.stdout.split()
            self.assertEqual(stopped, "ENOSPC", r)
            self.assertTrue(40 <= int(mib) <= 50, r.stdout)
        listed = [w for w in self.roche.workspaces() if w.name == ws]
        self.assertEqual([w.size_bytes for w in listed], [50 << 20])
        with self.assertRaises(InvalidConfig) as caught:
            self.roche.create(image=harness.image(), workspace=ws, workspace_size="60m")
        self.assertIn("fixed when it was made", caught.exception.message)
        # Left out, the workspace keeps its own.
        with self.roche.create(image=harness.image(), workspace=ws) as sb:
            self.assertTrue(40 <= int(sb.exec(["python3", "-c", STATFS, "/workspace"]).stdout) <= 50)
        self.roche.delete_workspace(ws)

    def test_bad_sizes(self) -> None:
        for kwargs, said in (({"disk": "lots"}, "disk"), ({"disk": "-1g"}, "negative"),
                             ({"disk": "2t"}, "maximum"), ({"workspace_size": "1g"}, "without a workspace")):
            with self.subTest(**kwargs):
                with self.assertRaises(InvalidConfig) as caught:
                    self.roche.create(image=harness.image(), writable=True, **kwargs)
                self.assertIn(said, caught.exception.message)
        with self.assertRaises(InvalidConfig):
            self.roche.create(image=harness.image(), disk=True)  # type: ignore[arg-type]

    def test_async(self) -> None:
        async def main() -> None:
            roche = AsyncRoche(transport=self.transport)
            async with (await roche.create(image=harness.image(), writable=True, disk="100m")) as sb:
                r = await sb.exec(["python3", "-c", FILL, "/var/tmp"])
                stopped, mib = r.stdout.split()
                self.assertEqual(stopped, "ENOSPC", r)
                self.assertTrue(80 <= int(mib) <= 100, r.stdout)
            ws = self.workspace()
            async with (await roche.create(image=harness.image(), workspace=ws, workspace_size="50m")) as sb:
                r = await sb.exec(["python3", "-c", STATFS, "/workspace"])
                self.assertTrue(40 <= int(r.stdout) <= 50, r.stdout)
            self.assertEqual([w.size_bytes for w in await roche.workspaces() if w.name == ws], [50 << 20])
            with self.assertRaises(InvalidConfig):
                await roche.create(image=harness.image(), writable=True, disk="lots")

        asyncio.run(main())


class DiskThroughCLI(DiskThroughDaemon):
    transport = "cli"

