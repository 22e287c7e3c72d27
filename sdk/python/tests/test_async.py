"""The asyncio API against real sandboxes, through the daemon and through the CLI."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

import harness

from roche_sandbox import AsyncRoche, AsyncSandbox, SandboxNotFound


class AsyncThroughDaemon(harness.SandboxTestCase):
    transport = "daemon"

    def roche(self) -> AsyncRoche:
        return AsyncRoche(transport=self.transport)

    def test_exec(self) -> None:
        async def main() -> None:
            roche = self.roche()
            self.assertEqual(await roche.transport(), self.transport)
            async with (await roche.create(image=harness.image())) as sandbox:
                self.assertIsInstance(sandbox, AsyncSandbox)
                r = await sandbox.exec(["python3", "-c", "import sys; print(input()); sys.exit(2)"], stdin="echo\n")
                self.assertEqual((r.stdout, r.exit_code), ("echo\n", 2))
                r = await sandbox.exec(["sleep", "30"], timeout=1)
                self.assertTrue(r.timed_out)

        asyncio.run(main())

    def test_inspect_after_destroy(self) -> None:
        async def main() -> None:
            roche = self.roche()
            sandbox = await roche.create(image=harness.image())
            r = await sandbox.exec(["sh", "-c", "sleep 100 >/dev/null 2>&1 & echo $! > /tmp/left"])
            self.assertIsNotNone(r.receipt)
            assert r.receipt is not None
            self.assertEqual(r.receipt.leftover_processes, 1)
            await sandbox.destroy()
            if self.transport == "daemon":
                info = await roche.inspect(sandbox.id)
                assert info.end is not None
                self.assertEqual((info.state, info.end.kind), ("exited", "destroyed"))
            else:
                with self.assertRaises(SandboxNotFound):
                    await roche.inspect(sandbox.id)

        asyncio.run(main())

    def test_files_and_pause(self) -> None:
        async def main() -> None:
            roche = self.roche()
            async with (await roche.create(image=harness.image())) as sandbox:
                await sandbox.write_file("/tmp/a/b.bin", b"\xff\x00" * 5000)
                self.assertEqual(await sandbox.read_file("/tmp/a/b.bin"), b"\xff\x00" * 5000)
                with tempfile.TemporaryDirectory() as tmp:
                    with open(os.path.join(tmp, "x.txt"), "w") as f:
                        f.write("x\n")
                    await sandbox.copy_to(tmp, "/tmp/in")
                    self.assertEqual((await sandbox.exec(["cat", "/tmp/in/x.txt"])).stdout, "x\n")
                    await sandbox.copy_from("/tmp/in", os.path.join(tmp, "back"))
                    with open(os.path.join(tmp, "back", "x.txt")) as f:
                        self.assertEqual(f.read(), "x\n")
                await sandbox.pause()
                self.assertEqual((await roche.get(sandbox.id)).info.state, "paused")
                await sandbox.unpause()
                self.assertIn(sandbox.id, [s.id for s in await roche.list()])

        asyncio.run(main())

    def test_exception_in_async_with_body_still_destroys(self) -> None:
        async def main() -> None:
            roche = self.roche()
            with self.assertRaises(ZeroDivisionError):
                async with (await roche.create(image=harness.image())) as sandbox:
                    await sandbox.exec(["true"])
                    1 / 0
            with self.assertRaises(SandboxNotFound):
                await sandbox.exec(["true"])
            with self.assertRaises(SandboxNotFound):
                await roche.get(sandbox.id)

        asyncio.run(main())

    def test_twenty_sandboxes_with_gather(self) -> None:
        async def one(roche: AsyncRoche, i: int) -> tuple[str, str]:
            async with (await roche.create(image=harness.image())) as sandbox:
                r = await sandbox.exec(["python3", "-c", f"print({i} * {i})"])
                return sandbox.id, r.stdout

        async def main() -> list[tuple[str, str]]:
            roche = self.roche()
            return await asyncio.gather(*(one(roche, i) for i in range(20)))

        started = time.monotonic()
        results = asyncio.run(main())
        elapsed = time.monotonic() - started
        self.assertEqual([out for _, out in results], [f"{i * i}\n" for i in range(20)])
        self.assertEqual(len({sid for sid, _ in results}), 20)
        print(f"[20 sandboxes with asyncio.gather through the {self.transport}: {elapsed:.1f} s] ", end="", flush=True)

    def test_streaming_yields_the_first_line_before_the_command_ends(self) -> None:
        async def main() -> None:
            roche = self.roche()
            async with (await roche.create(image=harness.image())) as sandbox:
                started = time.monotonic()
                seen = []
                async with sandbox.exec_stream(["sh", "-c", "echo first; sleep 2; echo second; exit 5"]) as stream:
                    async for event in stream:
                        seen.append((time.monotonic() - started, event.text))
                self.assertEqual([t for _, t in seen], ["first\n", "second\n"])
                self.assertLess(seen[0][0], 1.5, "the first line came only at the end")
                self.assertGreaterEqual(seen[1][0], 1.9)
                assert stream.result is not None
                self.assertEqual((stream.result.exit_code, stream.result.stdout), (5, "first\nsecond\n"))

        asyncio.run(main())

    def test_cancelling_an_exec_kills_the_command(self) -> None:
        async def main() -> None:
            roche = self.roche()
            async with (await roche.create(image=harness.image())) as sandbox:
                with self.assertRaises(asyncio.TimeoutError):
                    await asyncio.wait_for(sandbox.exec(["sh", "-c", "exec sleep 4321"]), 2)
                deadline = time.monotonic() + 10
                while any("sleep 4321" in p for p in harness.running_in(sandbox.id)):
                    self.assertLess(time.monotonic(), deadline, "the command outlived its cancelled exec")
                    await asyncio.sleep(0.1)
                self.assertEqual((await sandbox.exec(["echo", "still usable"])).stdout, "still usable\n")

        asyncio.run(main())

    def test_a_cancelled_task_still_destroys_its_sandbox(self) -> None:
        created: list[str] = []

        async def body(roche: AsyncRoche) -> None:
            async with (await roche.create(image=harness.image())) as sandbox:
                created.append(sandbox.id)
                await asyncio.sleep(60)

        async def main() -> None:
            roche = self.roche()
            task = asyncio.ensure_future(body(roche))
            while not created:
                await asyncio.sleep(0.05)
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            with self.assertRaises(SandboxNotFound):
                await roche.get(created[0])

        asyncio.run(main())


class AsyncThroughCLI(AsyncThroughDaemon):
    transport = "cli"
