"""The Python side of bench/sdk: times Sandbox.exec through the SDK, on request.

Reads commands on stdin, one per line, and answers each with a JSON list of durations
in nanoseconds: "sync N" (Roche, daemon transport), "async N" (AsyncRoche), "cli N"
(Roche, CLI transport). The sandbox is made by the Go side and shared."""

from __future__ import annotations

import asyncio
import json
import sys
import time

from roche_sandbox import AsyncRoche, Roche


def main() -> None:
    socket, sandbox_id, cli = sys.argv[1], sys.argv[2], sys.argv[3]
    sync_box = Roche(transport="daemon", socket=socket).get(sandbox_id)
    cli_box = Roche(transport="cli", cli=cli).get(sandbox_id)
    loop = asyncio.new_event_loop()
    async_box = loop.run_until_complete(AsyncRoche(transport="daemon", socket=socket).get(sandbox_id))
    cmd = ["true"]

    async def async_times(n: int) -> list[int]:
        out = []
        for _ in range(n):
            t = time.perf_counter_ns()
            await async_box.exec(cmd)
            out.append(time.perf_counter_ns() - t)
        return out

    def sync_times(box: object, n: int) -> list[int]:
        out = []
        for _ in range(n):
            t = time.perf_counter_ns()
            box.exec(cmd)  # type: ignore[attr-defined]
            out.append(time.perf_counter_ns() - t)
        return out

    print("ready", flush=True)
    for line in sys.stdin:
        what, _, count = line.strip().partition(" ")
        n = int(count or 0)
        if what == "sync":
            times = sync_times(sync_box, n)
        elif what == "cli":
            times = sync_times(cli_box, n)
        elif what == "async":
            times = loop.run_until_complete(async_times(n))
        else:
            break
        print(json.dumps(times), flush=True)
    loop.close()


if __name__ == "__main__":
    main()
