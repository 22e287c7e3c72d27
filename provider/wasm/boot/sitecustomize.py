# Roche's wasm provider mounts this at /.roche and names it in PYTHONPATH so that Python
# imports it at start-up. WASI has no working directory to inherit (every module starts
# in /), so this moves Python into the sandbox's working directory before the program
# runs, then removes every trace of itself from sys.path and the environment.
def _roche_start():
    import os, sys

    workdir = os.environ.pop("ROCHE_WASM_WORKDIR", None)
    pythonpath = os.environ.pop("ROCHE_WASM_PYTHONPATH", None)
    if pythonpath is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = pythonpath
    while "/.roche" in sys.path:
        sys.path.remove("/.roche")
    if workdir:
        os.chdir(workdir)


def _roche_preinit():
    # Roche's wasm provider makes a pre-initialised interpreter (preinit.go) by starting
    # `python3 -` with ROCHE_WASM_PREINIT set: warm.py is loaded here, while the
    # interpreter starts, and tells the provider where its entry is; the provider copies
    # the interpreter when it then reads its program from stdin.
    import os

    preload = os.environ.pop("ROCHE_WASM_PREINIT", None)
    if preload is None:
        return
    with open("/.roche/warm.py", "rb") as f:
        source = f.read()
    # Its value names the modules imported before the copy (a code context's kernel's).
    namespace = {"__name__": "__roche_warm__", "_roche_preinit": True, "_roche_preload": preload.split()}
    exec(compile(source, "<roche-warm>", "exec"), namespace)


_roche_start()
_roche_preinit()
del _roche_start, _roche_preinit
