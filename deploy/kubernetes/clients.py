"""Clients of roched's replicas for TestRochedReplicasInCluster (replicas_test.go): N
threads, each its own Roche of the Python SDK (sdk/python, with its retries), loop
create, exec, a background command and destroy through the Service's address until
stdin closes (the test's signal) or MAX_SECONDS pass; one more thread keeps a single
sandbox for the whole run and uses it the same way. Each step is a JSON line on stdout;
a call that fails (after the SDK's retries) or a command's output that is not all there
is a "failed" line, and the exit status is 1.

    python3 clients.py ADDRESS IMAGE CLIENTS   (the token in ROCHE_TOKEN)
"""

import json
import sys
import threading
import time
import traceback
import uuid

from roche_sandbox import Roche

MAX_SECONDS = 120
LINES = 30  # the background command prints LINES lines, one every 0.1 s
BACKGROUND = f"for i in $(seq 1 {LINES}); do echo line-$i; sleep 0.1; done; echo done >&2"
WANT = "".join(f"line-{i}\n" for i in range(1, LINES + 1))

address, image, clients = sys.argv[1], sys.argv[2], int(sys.argv[3])
stop = threading.Event()
deadline = time.monotonic() + MAX_SECONDS
out = threading.Lock()
failures = []


def say(**ev):
    with out:
        print(json.dumps(ev), flush=True)


def use(roche, sb, who, i):
    """An exec and a background command in sb, checked; a check that fails raises."""
    word = f"{who}-{i}"
    r = sb.exec(["echo", word], idempotency_key="exec-" + uuid.uuid4().hex)
    if r.exit_code != 0 or r.stdout != word + "\n":
        raise AssertionError(f"exec in {sb.id} answered {r!r}, want {word!r}")
    h = sb.commands.run(BACKGROUND, background=True)
    res = h.wait()
    if res.exit_code != 0 or res.stdout != WANT or res.stderr != "done\n":
        raise AssertionError(f"background command {h.pid} in {sb.id}: exit {res.exit_code} "
                             f"({getattr(res, 'unknown', '')}), {res.stdout.count(chr(10))} of {LINES} lines, "
                             f"stderr {res.stderr!r}")
    state = roche.inspect(sb.id).state
    if state != "running":
        raise AssertionError(f"sandbox {sb.id} is {state} while its client still uses it")


def looper(k):
    roche = Roche("kubernetes", address=address, transport="daemon")
    i = 0
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            i += 1
            sb = roche.create(image=image)
            say(ev="created", client=k, id=sb.id)
            use(roche, sb, f"c{k}", i)
            say(ev="destroying", client=k, id=sb.id)
            sb.destroy()
            say(ev="destroyed", client=k, id=sb.id)
    except Exception:
        failures.append(k)
        say(ev="failed", client=k, error=traceback.format_exc())
    finally:
        roche.close()


def keeper():
    """One sandbox through the whole run, across both replicas' loss."""
    roche = Roche("kubernetes", address=address, transport="daemon")
    try:
        sb = roche.create(image=image)
        say(ev="created", client="keeper", id=sb.id)
        i = 0
        while not stop.is_set() and time.monotonic() < deadline:
            i += 1
            use(roche, sb, "keeper", i)
            say(ev="used", client="keeper", id=sb.id)
        say(ev="destroying", client="keeper", id=sb.id)
        sb.destroy()
        say(ev="destroyed", client="keeper", id=sb.id)
    except Exception:
        failures.append("keeper")
        say(ev="failed", client="keeper", error=traceback.format_exc())
    finally:
        roche.close()


threads = [threading.Thread(target=looper, args=(k,)) for k in range(clients)]
threads.append(threading.Thread(target=keeper))
for t in threads:
    t.start()


def until_stdin_closes():
    sys.stdin.read()  # the test closes it: finish the iteration under way and stop
    stop.set()


threading.Thread(target=until_stdin_closes, daemon=True).start()
for t in threads:
    t.join()
sys.exit(1 if failures else 0)
