"""Runs a command in the network namespace this process is in (unshare --net made it,
empty): loopback up, a veth pair as the only way out, and 127.0.0.1:PORT forwarded to
roched's E2B listener through a unix socket the Go test serves. Every packet that takes
the way out is captured on the pair's far end and written to REPORT, one line each, as
"ADDRESS:PORT" (ARP and IPv6 neighbour discovery aside): the SDKs must send none.

usage: netns.py SOCKET PORT REPORT -- COMMAND ARGS...
"""
import os
import socket
import struct
import subprocess
import sys
import threading

sock_path, port, report = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cmd = sys.argv[sys.argv.index("--") + 1:]


def sh(*args):
    subprocess.run(args, check=True)


sh("ip", "link", "set", "lo", "up")
sh("ip", "link", "add", "out0", "type", "veth", "peer", "name", "out1")
sh("ip", "link", "set", "out0", "up")
sh("ip", "link", "set", "out1", "up")
sh("ip", "addr", "add", "10.99.0.1/24", "dev", "out0")
sh("ip", "-6", "addr", "add", "fd00:99::1/64", "dev", "out0", "nodad")
# The gateways do not exist: their neighbour entries send every packet for them to
# out1's address, where it is captured (and then dropped).
mac = subprocess.run(
    ["ip", "-o", "link", "show", "out1"], check=True, capture_output=True, text=True
).stdout.split("link/ether ")[1].split()[0]
sh("ip", "neigh", "add", "10.99.0.2", "lladdr", mac, "dev", "out0")
sh("ip", "route", "add", "default", "via", "10.99.0.2", "dev", "out0")
sh("ip", "-6", "neigh", "add", "fd00:99::2", "lladdr", mac, "dev", "out0")
sh("ip", "-6", "route", "add", "default", "via", "fd00:99::2", "dev", "out0")

seen = []
lock = threading.Lock()


def capture():
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    s.bind(("out1", 0))
    while True:
        frame = s.recv(65535)
        eth = struct.unpack("!H", frame[12:14])[0]
        p = frame[14:]
        where = None
        if eth == 0x0800:
            proto, dst = p[9], socket.inet_ntop(socket.AF_INET, p[16:20])
            ihl = (p[0] & 15) * 4
            dport = struct.unpack("!H", p[ihl + 2:ihl + 4])[0] if proto in (6, 17) else 0
            where = "%s:%d" % (dst, dport)
        elif eth == 0x86DD:
            nxt, dst = p[6], socket.inet_ntop(socket.AF_INET6, p[24:40])
            if nxt == 58 or dst.startswith("ff"):
                continue  # neighbour discovery, router solicitations, listener reports
            dport = struct.unpack("!H", p[42:44])[0] if nxt in (6, 17) else 0
            where = "[%s]:%d" % (dst, dport)
        if where:
            with lock:
                seen.append(where)


threading.Thread(target=capture, daemon=True).start()


def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def forward():
    ln = socket.socket()
    ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ln.bind(("127.0.0.1", port))
    ln.listen(64)
    ready.set()
    while True:
        c, _ = ln.accept()
        u = socket.socket(socket.AF_UNIX)
        u.connect(sock_path)
        threading.Thread(target=pipe, args=(c, u), daemon=True).start()
        threading.Thread(target=pipe, args=(u, c), daemon=True).start()


ready = threading.Event()
threading.Thread(target=forward, daemon=True).start()
ready.wait()
code = subprocess.run(cmd).returncode
with lock, open(report, "w") as f:
    f.write("".join(w + "\n" for w in seen))
sys.exit(code)
