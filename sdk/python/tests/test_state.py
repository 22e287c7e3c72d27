"""State that outlives a sandbox, against the real Docker provider, through the daemon and
through the CLI: persistent workspaces, reset, and snapshots. Every workspace and snapshot
a test makes has a name of its own and is removed when the test ends."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Callable

import harness

from roche_sandbox import AsyncRoche, InUse, Roche, RocheError, SandboxNotFound, SnapshotInfo, WorkspaceInfo


def unique(kind: str) -> str:
    return f"sdk-test-{kind}-{uuid.uuid4().hex[:8]}"


def gone(call: Callable[[], object]) -> None:
    """Cleanup: removes a workspace or snapshot unless the test already did."""
    try:
        call()
    except SandboxNotFound:
        pass


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


class StateThroughDaemon(harness.SandboxTestCase):
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
        name = unique("ws")
        self.addCleanup(gone, lambda: self.roche.delete_workspace(name))
        return name

    def snapshot_name(self) -> str:
        name = unique("snap")
        self.addCleanup(gone, lambda: self.roche.delete_snapshot(name))
        return name

    def listed_workspace(self, name: str) -> WorkspaceInfo:
        found = [w for w in self.roche.workspaces() if w.name == name]
        self.assertEqual(len(found), 1, f"workspace {name} is not listed once")
        return found[0]

    def test_workspace_files_outlive_the_sandbox(self) -> None:
        ws = self.workspace()
        with self.roche.create(image=harness.image(), workspace=ws) as sb:
            # The root stays read-only; the workspace is writable.
            r = sb.exec(sh("echo kept > /workspace/notes.txt && touch /x 2>/dev/null || echo read-only"))
            self.assertEqual((r.stdout, r.exit_code), ("read-only\n", 0), r.stderr)
            w = self.listed_workspace(ws)
            self.assertEqual(w.provider, "docker")
            self.assertIsNotNone(w.created_at)
            self.assertTrue(any(sb.id.startswith(i) or i.startswith(sb.id) for i in w.in_use_by), w)
            with self.assertRaises(InUse) as caught:
                self.roche.delete_workspace(ws)
            self.assertIn(ws, caught.exception.message)
            self.assertEqual(caught.exception.reason, "in_use")
            first = sb.id
        with self.roche.create(image=harness.image(), workspace=ws) as sb:
            self.assertNotEqual(sb.id, first)
            self.assertEqual(sb.read_file("/workspace/notes.txt"), b"kept\n")
        self.roche.delete_workspace(ws)
        self.assertNotIn(ws, [w.name for w in self.roche.workspaces()])
        with self.assertRaises(SandboxNotFound):
            self.roche.delete_workspace(ws)

    def test_reset_wipes_the_sandbox_but_keeps_its_workspace(self) -> None:
        ws = self.workspace()
        # /var/tmp is on the (writable) root filesystem, /tmp on its own tmpfs.
        changes = "test -e /var/tmp/change && echo root; test -e /tmp/change && echo tmp; cat /workspace/change"
        with self.roche.create(image=harness.image(), workspace=ws, writable=True, env={"MARK": "env"}) as sb:
            sb.exec(sh("echo x > /var/tmp/change; echo x > /tmp/change; echo ws > /workspace/change"))
            self.assertEqual(sb.exec(sh(changes)).stdout, "root\ntmp\nws\n")
            before = sb.info
            self.assertIs(sb.reset(), sb)
            self.assertNotEqual(sb.id, before.id)
            self.assertEqual(sb.info.image, before.image)
            self.assertEqual(self.roche.get(sb.id).id, sb.id)
            with self.assertRaises(SandboxNotFound):
                self.roche.get(before.id)
            # The lifetime it had left, not a new one.
            assert before.expires_at is not None and sb.info.expires_at is not None
            self.assertLessEqual(sb.info.expires_at, before.expires_at + timedelta(seconds=5))
            # Same settings (writable root, env), a clean filesystem, the same workspace.
            self.assertEqual(sb.exec(sh(changes + "; echo $MARK; touch /var/tmp/w && echo writable")).stdout,
                             "ws\nenv\nwritable\n")

            middle = sb.id
            sb.reset(keep_workspace=False)
            self.assertNotEqual(sb.id, middle)
            r = sb.exec(sh("ls -A /workspace; test -e /var/tmp/w || echo clean"))
            self.assertEqual(r.stdout, "clean\n")
            # Emptied, not detached: the workspace is still this sandbox's.
            sb.exec(sh("echo new > /workspace/after"))
            self.assertIn(sb.id[:12], " ".join(self.listed_workspace(ws).in_use_by))
        with self.roche.create(image=harness.image(), workspace=ws) as sb:
            self.assertEqual(sb.read_file("/workspace/after"), b"new\n")

    def test_snapshot_restores_files_into_a_new_sandbox(self) -> None:
        name = self.snapshot_name()
        with self.roche.create(image=harness.image()) as sb:
            sb.write_file("/tmp/state/data.json", b'{"step": 3}')
            snap = sb.snapshot(name)
        self.assertIsInstance(snap, SnapshotInfo)
        self.assertEqual((snap.name, snap.provider), (name, "docker"))
        self.assertIsNotNone(snap.created_at)
        listed = [s for s in self.roche.snapshots() if s.name == name]
        self.assertEqual(len(listed), 1)
        self.assertEqual(listed[0].image, snap.image)
        with self.roche.create(from_snapshot=name) as sb:
            self.assertEqual(sb.read_file("/tmp/state/data.json"), b'{"step": 3}')
            self.assertEqual(sb.exec(["python3", "-c", "import json; print(json.load(open('/tmp/state/data.json')))"]).stdout,
                             "{'step': 3}\n")
            with self.assertRaises(InUse):
                self.roche.delete_snapshot(name)
        self.roche.delete_snapshot(name)
        self.assertNotIn(name, [s.name for s in self.roche.snapshots()])
        with self.assertRaises(SandboxNotFound):
            self.roche.create(from_snapshot=name)

    def test_snapshot_of_a_destroyed_sandbox_is_not_found(self) -> None:
        name = self.snapshot_name()
        sb = self.roche.create(image=harness.image())
        sb.destroy()
        with self.assertRaises(SandboxNotFound):
            sb.snapshot(name)
        with self.assertRaises(SandboxNotFound):
            sb.reset()
        self.assertNotIn(name, [s.name for s in self.roche.snapshots()])


class StateThroughCLI(StateThroughDaemon):
    transport = "cli"


class AsyncStateThroughDaemon(harness.SandboxTestCase):
    transport = "daemon"

    def test_workspace_reset_and_snapshot(self) -> None:
        ws, snap = unique("ws"), unique("snap")

        async def main(roche: AsyncRoche) -> None:
            async with (await roche.create(image=harness.image(), workspace=ws)) as sb:
                await sb.exec(sh("echo ws > /workspace/a; echo tmp > /tmp/b"))
                self.assertIn(ws, [w.name for w in await roche.workspaces()])
                with self.assertRaises(InUse):
                    await roche.delete_workspace(ws)
                info = await sb.snapshot(snap)
                self.assertEqual(info.name, snap)
                self.assertIn(snap, [s.name for s in await roche.snapshots()])
                old = sb.id
                self.assertIs(await sb.reset(), sb)
                self.assertNotEqual(sb.id, old)
                r = await sb.exec(sh("cat /workspace/a; test -e /tmp/b && echo tmp kept"))
                self.assertEqual(r.stdout, "ws\n")
                await sb.reset(keep_workspace=False)
                self.assertEqual((await sb.exec(["ls", "-A", "/workspace"])).stdout, "")
            async with (await roche.create(from_snapshot=snap)) as sb:
                self.assertEqual(await sb.read_file("/tmp/b"), b"tmp\n")
            await roche.delete_snapshot(snap)
            await roche.delete_workspace(ws)
            self.assertNotIn(snap, [s.name for s in await roche.snapshots()])
            self.assertNotIn(ws, [w.name for w in await roche.workspaces()])

        roche = AsyncRoche(transport=self.transport)
        sync = Roche(transport=self.transport)
        self.addCleanup(sync.close)
        self.addCleanup(gone, lambda: sync.delete_workspace(ws))
        self.addCleanup(gone, lambda: sync.delete_snapshot(snap))
        asyncio.run(main(roche))


class AsyncStateThroughCLI(AsyncStateThroughDaemon):
    transport = "cli"


if __name__ == "__main__":
    import unittest

    unittest.main()
