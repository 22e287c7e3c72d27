"""The Python side of bench/e2b: times create + run + kill cycles, on request, through
E2B's SDK (against roched's E2B listener: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY) and
through Roche's own Python SDK (against roched's unix socket).

Reads commands on stdin, one per line, and answers each with a JSON list of durations in
nanoseconds: "e2b N" or "roche N". Both run the same command in the sandbox: E2B's SDK
runs every command as `/bin/bash -l -c CMD`, so Roche's runs that argv too."""

from __future__ import annotations

import json
import sys
import time

from e2b import Sandbox
from roche_sandbox import Roche


def main() -> None:
    socket, image = sys.argv[1], sys.argv[2]
    roche = Roche(transport="daemon", socket=socket)

    def e2b_cycle() -> None:
        sbx = Sandbox.create(timeout=300)
        r = sbx.commands.run("true")
        assert r.exit_code == 0, r
        sbx.kill()

    def roche_cycle() -> None:
        sb = roche.create(image, timeout_secs=300)
        r = sb.exec(["/bin/bash", "-l", "-c", "true"])
        assert r.exit_code == 0, r
        sb.destroy()

    cycles = {"e2b": e2b_cycle, "roche": roche_cycle}
    print("ready", flush=True)
    for line in sys.stdin:
        what, _, count = line.strip().partition(" ")
        cycle = cycles.get(what)
        if cycle is None:
            break
        out = []
        for _ in range(int(count or 0)):
            t = time.perf_counter_ns()
            cycle()
            out.append(time.perf_counter_ns() - t)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
