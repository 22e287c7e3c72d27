"""The Python side of bench/files: writes and reads a file of SIZE bytes N times through the
SDK (sync, daemon transport) on a sandbox the Go side made, and prints one JSON line: the
seconds of each write and read, and how far its resident memory rose over what it held
before (sampled every 10 ms), which a file's size must not decide."""

from __future__ import annotations

import json
import resource
import sys
import threading
import time

from roche_sandbox import Roche


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def main() -> None:
    socket, sandbox_id, size, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    box = Roche(transport="daemon", socket=socket).get(sandbox_id)
    piece = bytes(range(256)) * 256  # 64 KiB

    def content():
        left = size
        while left > 0:
            yield piece[:left]
            left -= len(piece)

    before = peak = rss()
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.01):
            peak = max(peak, rss())

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    writes, reads = [], []
    for _ in range(n):
        start = time.perf_counter()
        info = box.files.write("/var/tmp/python.bin", content())
        writes.append(time.perf_counter() - start)
        assert info.size == size, info
        start = time.perf_counter()
        got = 0
        for chunk in box.files.read("/var/tmp/python.bin", format="stream"):
            got += len(chunk)
        reads.append(time.perf_counter() - start)
        assert got == size, got
    stop.set()
    t.join()
    print(json.dumps({"write": writes, "read": reads, "rss_grew": max(peak, rss()) - before}))


if __name__ == "__main__":
    main()
