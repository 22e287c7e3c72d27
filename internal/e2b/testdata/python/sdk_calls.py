"""Documented calls of E2B's Python SDKs (e2b, e2b-code-interpreter), against roched's
E2B listener. Only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY are set. Prints one
"ok NAME" line per check and exits non-zero at the first failure."""
import os
import sys
import time
import uuid
from datetime import datetime, timezone

from e2b import Sandbox, SandboxQuery, CommandExitException, NotFoundException, FilesystemEventType, PtySize
from e2b.exceptions import SandboxException
from e2b_code_interpreter import Sandbox as CodeSandbox


def ok(name):
    print("ok", name, flush=True)


def check(cond, name, detail=""):
    if not cond:
        print("FAIL", name, detail, flush=True)
        sys.exit(1)
    ok(name)


def ends_in(sb, secs, name):
    """sb's end is secs seconds from now, within a margin of 60 s."""
    left = (sb.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
    check(secs - 60 < left <= secs + 1, name, left)


run = uuid.uuid4().hex  # this run's sandboxes alone match it
meta = {"purpose": "sdk-calls", "run": run}
sbx = Sandbox.create(timeout=600, metadata=meta)
try:
    check(sbx.is_running(), "is_running")
    info = sbx.get_info()
    check(info.sandbox_id == sbx.sandbox_id and info.template_id == "base", "get_info", info)
    check(info.metadata == meta, "metadata round trip", info.metadata)
    try:
        Sandbox.create(metadata={"bad key!": "x"})
        check(False, "a key Roche cannot keep is refused")
    except SandboxException as e:
        check("bad key!" in str(e) and "400" in str(e), "metadata key refused in E2B's error shape", str(e))

    # commands: foreground, exit codes, env, cwd
    r = sbx.commands.run("echo out; echo err >&2")
    check(r.stdout == "out\n" and r.stderr == "err\n" and r.exit_code == 0, "commands.run", r)
    try:
        sbx.commands.run("exit 3")
        check(False, "commands.run exit 3 raises")
    except CommandExitException as e:
        check(e.exit_code == 3, "CommandExitException", e.exit_code)
    r = sbx.commands.run("echo $FOO; pwd", envs={"FOO": "bar"}, cwd="/tmp")
    check(r.stdout == "bar\n/tmp\n", "commands.run envs cwd", r.stdout)

    # background, streaming callbacks, list, connect, kill
    seen = []
    h = sbx.commands.run("for i in 1 2 3; do echo tick$i; sleep 0.2; done", background=True)
    res = h.wait(on_stdout=lambda s: seen.append(s))
    check("tick3" in "".join(seen) and res.exit_code == 0, "background wait on_stdout", seen)
    h = sbx.commands.run("sleep 600", background=True)
    pids = [p.pid for p in sbx.commands.list()]
    check(h.pid in pids, "commands.list", pids)
    h2 = sbx.commands.connect(h.pid)
    check(h2.pid == h.pid, "commands.connect")
    check(sbx.commands.kill(h.pid), "commands.kill")
    try:
        h2.wait()
        check(False, "killed command raises")
    except CommandExitException as e:
        ok("killed command ends")
    check(h.pid not in [p.pid for p in sbx.commands.list()], "killed command gone from list")

    # stdin
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello stdin\n")
    h.close_stdin() if hasattr(h, "close_stdin") else sbx.commands.close_stdin(h.pid)
    res = h.wait()
    check(res.stdout == "hello stdin\n", "send_stdin close_stdin", res.stdout)

    # pty: refused (Unimplemented), naming Roche's own terminals
    try:
        sbx.pty.create(PtySize(rows=24, cols=80))
        check(False, "pty.create raises")
    except SandboxException as e:
        check("pty" in str(e) and "roche shell" in str(e), "pty.create refused, naming roche shell", str(e))
    # get_host builds {port}-{id}.{domain}: the domain is roched's own listener, never E2B's
    listener = os.environ["E2B_API_URL"].split("://", 1)[1]
    host = sbx.get_host(8080)
    check(host == "8080-" + sbx.sandbox_id + "." + listener, "get_host names roched's domain", host)

    # files
    base = "/tmp/e2b-files"
    check(sbx.files.make_dir(base), "files.make_dir")
    check(not sbx.files.make_dir(base), "files.make_dir exists -> False")
    w = sbx.files.write(base + "/a.txt", "alpha")
    check(w.path == base + "/a.txt", "files.write", w)
    check(sbx.files.read(base + "/a.txt") == "alpha", "files.read")
    check(bytes(sbx.files.read(base + "/a.txt", format="bytes")) == b"alpha", "files.read bytes")
    sbx.files.write_files([{"path": base + "/b.bin", "data": b"\x00\x01\x02"},
                           {"path": base + "/c.txt", "data": "gamma"}])
    names = sorted(e.name for e in sbx.files.list(base))
    check(names == ["a.txt", "b.bin", "c.txt"], "files.list write_files", names)
    check(sbx.files.exists(base + "/a.txt") and not sbx.files.exists(base + "/nope"), "files.exists")
    e = sbx.files.rename(base + "/a.txt", base + "/d.txt")
    check(e.path == base + "/d.txt" and sbx.files.read(base + "/d.txt") == "alpha", "files.rename")
    st = sbx.files.get_info(base + "/d.txt")
    check(st.size == 5 and st.type.value == "file", "files.get_info", st)
    sbx.files.remove(base + "/d.txt")
    check(not sbx.files.exists(base + "/d.txt"), "files.remove")
    try:
        sbx.files.read(base + "/d.txt")
        check(False, "read of a removed file raises")
    except NotFoundException:
        ok("files.read NotFound")
    sbx.files.write(base + "/gz.txt", "zipped" * 1000, gzip=True)
    check(sbx.files.read(base + "/gz.txt", gzip=True) == "zipped" * 1000, "files gzip write/read")

    # watch
    handle = sbx.files.watch_dir(base)
    sbx.files.write(base + "/w.txt", "watched")
    deadline = time.time() + 20
    names = []
    while time.time() < deadline:
        evs = handle.get_new_events()
        names += [(e.name, e.type) for e in evs]
        if any(n == "w.txt" for n, _ in names):
            break
        time.sleep(0.2)
    handle.stop()
    check(any(n == "w.txt" for n, _ in names), "files.watch_dir", names)

    # list of sandboxes
    page = Sandbox.list()
    ids = [s.sandbox_id for s in page.next_items()]
    check(sbx.sandbox_id in ids, "Sandbox.list", ids)

    # connect from the id
    again = Sandbox.connect(sbx.sandbox_id)
    check(again.commands.run("echo again").stdout == "again\n", "Sandbox.connect")

    # the metadata filter: this run's sandbox alone, every pair must match
    got = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"run": run})).next_items()]
    check(got == [sbx.sandbox_id], "Sandbox.list metadata filter", got)
    got = Sandbox.list(query=SandboxQuery(metadata={"run": run, "purpose": "other"})).next_items()
    check(got == [], "Sandbox.list metadata filter, a pair not matching", got)

    # set_timeout: both sandboxes to end in 3 s, then this one extended; the short one
    # ends, this one survives it. Where the provider cannot extend a sandbox beyond the
    # lifetime it was made with (noextend: kubernetes), only the short one is shortened,
    # and extending this one is refused in E2B's error shape.
    noextend = "noextend" in sys.argv[1:]
    short = Sandbox.create(timeout=600, metadata={"run": run})
    short.set_timeout(3)
    ends_in(short, 3, "set_timeout shortens")
    if noextend:
        try:
            sbx.set_timeout(900)
            check(False, "set_timeout beyond the lifetime made with raises")
        except SandboxException as e:
            check("501" in str(e), "set_timeout beyond the lifetime made with refused in E2B's error shape", str(e))
    else:
        sbx.set_timeout(3)
        sbx.set_timeout(900)
        ends_in(sbx, 900, "set_timeout extends")
    deadline = time.time() + 90
    while short.is_running() and time.time() < deadline:
        time.sleep(0.5)
    check(not short.is_running(), "set_timeout: the sandbox ends at its new timeout")
    check(sbx.is_running() and sbx.commands.run("echo alive").stdout == "alive\n", "set_timeout: the other sandbox survives")
    got = [s.sandbox_id for s in Sandbox.list(query=SandboxQuery(metadata={"run": run})).next_items()]
    check(got == [sbx.sandbox_id], "the ended sandbox is gone from the list", got)
    if not noextend:
        Sandbox.connect(sbx.sandbox_id, timeout=1200)
        ends_in(sbx, 1200, "connect with timeout extends")

    if "pause" in sys.argv[1:]:  # where the provider can (Docker)
        check(sbx.pause(), "pause")
        check(sbx.get_info().state.value == "paused", "paused state")
        resumed = Sandbox.connect(sbx.sandbox_id)
        check(resumed.get_info().state.value == "running", "connect resumes")
        check(resumed.commands.run("echo resumed").stdout == "resumed\n", "resumed sandbox runs")
    elif "nopause" in sys.argv[1:]:  # a provider that cannot: E2B's error shape, 501
        try:
            sbx.pause()
            check(False, "pause where the provider cannot raises")
        except SandboxException as e:
            check("501" in str(e) and "pause" in str(e).lower(), "pause refused in E2B's error shape", str(e))
        check(sbx.is_running() and sbx.commands.run("echo still").stdout == "still\n", "the sandbox runs on after a refused pause")
finally:
    killed = sbx.kill()
check(killed, "kill")
check(not Sandbox.kill(sbx.sandbox_id), "kill of a killed sandbox -> False")
try:
    Sandbox.connect(sbx.sandbox_id)
    check(False, "connect to a killed sandbox raises")
except NotFoundException:
    ok("killed sandbox NotFound")

# code interpreter
if "nocode" in sys.argv[1:]:  # a provider without code contexts: E2B's error shape, 501
    with CodeSandbox.create() as cs:
        try:
            cs.run_code("1")
            check(False, "run_code where the provider has no code contexts raises")
        except SandboxException as e:
            check("501" in str(e) and "code contexts" in str(e), "run_code refused in E2B's error shape", str(e))
        check(cs.commands.run("echo still").stdout == "still\n", "the sandbox runs on after a refused run_code")
    print("all ok")
    sys.exit(0)
with CodeSandbox.create() as cs:
    cs.run_code("x = 1")
    ex = cs.run_code("x += 1; x")
    check(ex.text == "2", "run_code state", ex.text)
    ex = cs.run_code("print('hi')")
    check(ex.logs.stdout == ["hi\n"], "run_code stdout", ex.logs)
    ex = cs.run_code("1/0")
    check(ex.error is not None and ex.error.name == "ZeroDivisionError" and "Traceback" in ex.error.traceback or "ZeroDivision" in (ex.error.traceback if ex.error else ""), "run_code error traceback", ex.error)
    ex = cs.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
    pngs = [r.png for r in ex.results if r.png]
    check(pngs and pngs[0].startswith("iVBOR"), "run_code matplotlib png", [list(r.formats()) for r in ex.results])
    ctx = cs.create_code_context()
    cs.run_code("y = 41", context=ctx)
    check(cs.run_code("y + 1", context=ctx).text == "42", "context state")
    ex = cs.run_code("y", )
    check(ex.error is not None and ex.error.name == "NameError", "contexts are separate", ex.error)
    ctxs = [c.id for c in cs.list_code_contexts()]
    check(ctx.id in ctxs, "list_code_contexts", ctxs)
    cs.restart_code_context(ctx)
    check(cs.run_code("'y' in dir()", context=ctx).text == "False", "restart_code_context")
    cs.remove_code_context(ctx)
    check(ctx.id not in [c.id for c in cs.list_code_contexts()], "remove_code_context")
print("all ok")
