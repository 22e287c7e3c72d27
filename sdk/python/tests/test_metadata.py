"""Labels and lifetimes through the SDK, sync and async, through roched and the CLI:
metadata given at create comes back everywhere a sandbox is described and selects it in
list; set_timeout moves the sandbox's end, and the new end is what ends it."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timezone

import harness

from roche_sandbox import AsyncRoche, InvalidConfig, Roche, SandboxNotFound


class MetadataThroughDaemon(harness.SandboxTestCase):
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

    def test_metadata_round_trip_and_list_filter(self) -> None:
        run = uuid.uuid4().hex[:8]
        a = self.enter(self.roche.create(image=harness.image(), metadata={"run": run, "user": "alice"}))
        b = self.enter(self.roche.create(image=harness.image(), metadata={"run": run, "user": "bob"}))
        self.assertEqual(dict(a.info.metadata), {"run": run, "user": "alice"})
        self.assertEqual(dict(self.roche.get(a.id).info.metadata), {"run": run, "user": "alice"})
        ids = lambda l: sorted(s.id for s in l)  # noqa: E731
        self.assertEqual(ids(self.roche.list(metadata={"run": run})), sorted([a.id, b.id]))
        self.assertEqual(ids(self.roche.list(metadata={"run": run, "user": "bob"})), [b.id])
        self.assertEqual(ids(self.roche.list(metadata={"run": run, "user": "carol"})), [])
        self.assertEqual(ids(self.roche.list(metadata={"run": run}, state="running")), sorted([a.id, b.id]))
        self.assertEqual(ids(self.roche.list(metadata={"run": run}, state="paused")), [])
        listed = [s for s in self.roche.list(metadata={"run": run, "user": "alice"})]
        self.assertEqual(dict(listed[0].metadata), {"run": run, "user": "alice"})

    def test_metadata_refused(self) -> None:
        for md, want in (({"roche.managed": "false"}, "Roche's own"),
                         ({"Roche.owner": "x"}, "Roche's own"),
                         ({"a b": "x"}, "use letters"),
                         ({"k": "v" * 513}, "over the limit"),
                         ({f"k{i}": "v" for i in range(33)}, "over the limit")):
            with self.assertRaises(InvalidConfig) as cm:
                self.roche.create(image=harness.image(), metadata=md)
            self.assertIn(want, str(cm.exception))
        with self.assertRaises(InvalidConfig):
            self.roche.list(state="sleeping")

    def test_set_timeout_shortens_and_the_sandbox_ends(self) -> None:
        sb = self.enter(self.roche.create(image=harness.image(), timeout_secs=300, leased=False))
        before = time.time()
        sb.set_timeout(3)
        assert sb.info.expires_at is not None
        self.assertLess(abs(sb.info.expires_at.timestamp() - (before + 3)), 2)
        self.assertEqual(self.roche.get(sb.id).info.expires_at, sb.info.expires_at)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.roche.get(sb.id)
            except SandboxNotFound:
                break
            time.sleep(0.25)
        else:
            self.fail(f"sandbox {sb.id} outlived its shortened lifetime by 27 s")
        self.assertGreater(time.time() - before, 2)

    def test_set_timeout_extends_past_the_old_end(self) -> None:
        sb = self.enter(self.roche.create(image=harness.image(), timeout_secs=4))
        sb.set_timeout(60)
        assert sb.info.expires_at is not None
        self.assertGreater(sb.info.expires_at, datetime.now(timezone.utc))
        old_end = time.time() + 4
        time.sleep(max(0.0, old_end - time.time()) + 4)  # past the old end, with margin
        self.assertEqual(sb.exec(["echo", "alive"]).stdout, "alive\n")
        with self.assertRaises(InvalidConfig):
            sb.set_timeout(0)
        with self.assertRaises(InvalidConfig):
            sb.set_timeout(24 * 3600 + 1)

    def test_async(self) -> None:
        async def main() -> None:
            r = AsyncRoche(transport=self.transport)
            try:
                run = uuid.uuid4().hex[:8]
                async with await r.create(image=harness.image(), metadata={"run": run}) as sb:
                    self.assertEqual(dict(sb.info.metadata), {"run": run})
                    self.assertEqual([s.id for s in await r.list(metadata={"run": run}, state="running")], [sb.id])
                    await sb.set_timeout(120)
                    assert sb.info.expires_at is not None
                    self.assertGreater(sb.info.expires_at.timestamp(), time.time() + 100)
            finally:
                r.close()
        asyncio.run(main())


class MetadataThroughCLI(MetadataThroughDaemon):
    transport = "cli"


