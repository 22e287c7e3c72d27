"""Memory snapshots through the SDK, against real qemu microVMs (the vm provider) served by
the real roched and the roche CLI: a code context's variable survives pause(to_disk=True)
and Roche.resume(id), and fork(2) makes two sandboxes whose state diverges from each
other's and from their origin's. One VM, shared by both transports and every step (a
boot is ~2.6 s under TCG); the forks are restored, not booted. Providers without memory
snapshots (docker) refuse each call in one line.

Needs QEMU and a kernel as the Go tests' testenv.QEMU does (the README's test command
sets them up), besides what harness.py needs."""

from __future__ import annotations

import asyncio

import harness

from roche_sandbox import AsyncRoche, InvalidConfig, Roche, Sandbox, SandboxNotFound, Unsupported


def printed(sb: Sandbox, code: str) -> str:
    ex = sb.run_code(code)
    if ex.error is not None:
        raise AssertionError(f"{code!r} in {sb.id} raised {ex.error.name}: {ex.error.value}")
    return "".join(ex.logs.stdout).strip()


class MemorySnapshots(harness.SandboxTestCase):
    """One VM, made in direct mode by the CLI transport, which roched also serves (the
    same user's direct sandboxes): each transport pauses to disk, resumes and forks it."""

    def test_pause_to_disk_resume_and_fork(self) -> None:
        cli = Roche("qemu", transport="cli")
        self.addCleanup(cli.close)
        daemon = Roche("qemu", transport="daemon")
        self.addCleanup(daemon.close)
        # Not leased: a sandbox paused to disk is one meant to outlive its maker. (A
        # leased one paused to disk, resumed and then forked stops at the fork, in
        # roched's vm provider: reported, not the SDK's.)
        sb = self.enter(cli.create(image=harness.image(), leased=False))
        printed(sb, "x = 41")

        # Forks, through the CLI: each starts from the origin's x and goes its own way.
        forks = sb.fork(2)
        for f in forks:
            self.addCleanup(f.destroy)
        ids = [f.id for f in forks]
        self.assertEqual(len(set(ids + [sb.id])), 3, f"fork(2) of {sb.id} made {ids}, want two new ids")
        self.assertTrue(all(f.info.state == "running" for f in forks), [f.info for f in forks])
        self.assertEqual(printed(forks[0], "x += 1; print(x)"), "42")
        self.assertEqual(printed(forks[1], "x += 100; print(x)"), "141")
        self.assertEqual(printed(forks[0], "print(x)"), "42", "the second fork's change reached the first")
        self.assertEqual(printed(sb, "print(x)"), "41", "a fork's change reached its origin")

        # Pause to disk and resume, through roched.
        via_daemon = daemon.get(sb.id)
        via_daemon.pause(to_disk=True)
        self.assertEqual(daemon.get(sb.id).info.state, "paused")
        back = daemon.resume(sb.id)
        self.assertEqual((back.id, back.info.state), (sb.id, "running"))
        self.assertEqual(printed(back, "print(x + 1)"), "42", "after pause to disk and resume through roched")

        # And through the CLI, a fork's own state.
        forks[1].pause(to_disk=True)
        self.assertEqual(cli.get(forks[1].id).info.state, "paused")
        self.assertEqual(printed(cli.resume(forks[1].id), "print(x + 1)"), "142")

        # The async half, through roched: a fork of the origin, destroyed on the way out.
        async def in_async() -> None:
            aroche = AsyncRoche("qemu", transport="daemon")
            try:
                origin = await aroche.get(sb.id)
                made = await origin.fork(1)
                self.assertEqual(len(made), 1)
                async with made[0] as f:
                    ex = await f.run_code("print(x * 2)")
                    self.assertEqual("".join(ex.logs.stdout).strip(), "82")
                with self.assertRaises(SandboxNotFound):
                    await aroche.resume(made[0].id)  # destroyed by the async with
            finally:
                aroche.close()

        asyncio.run(in_async())

        listed = {s.id for s in daemon.list()}
        self.assertTrue(set(ids) <= listed, f"the forks {ids} are not listed: {listed}")
        for f in forks:
            f.destroy()
        listed = {s.id for s in daemon.list()}
        self.assertFalse(set(ids) & listed, f"destroyed forks still listed: {listed}")
        for bad in (0, 65):
            with self.assertRaises(InvalidConfig):
                sb.fork(bad)


class MemorySnapshotsRefusedOnDocker(harness.SandboxTestCase):
    """docker cannot save a process's memory (CRIU would be needed): each call says so in
    one line, through roched and through the CLI, and the sandbox is left as it was."""

    def test_refused_in_one_line(self) -> None:
        for transport in harness.TRANSPORTS:
            with self.subTest(transport=transport):
                roche = Roche("docker", transport=transport)
                self.addCleanup(roche.close)
                with roche.create(image=harness.image()) as sb:
                    for call in (lambda: sb.pause(to_disk=True), lambda: sb.fork(1), lambda: roche.resume(sb.id)):
                        with self.assertRaises(Unsupported) as cm:
                            call()
                        msg = str(cm.exception)
                        self.assertNotIn("\n", msg)
                        self.assertIn("qemu", msg, msg)
                    self.assertEqual(sb.exec(["true"]).exit_code, 0, "the refused sandbox no longer runs commands")
                    self.assertEqual(roche.get(sb.id).info.state, "running")
