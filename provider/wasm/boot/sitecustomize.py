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


_roche_start()
del _roche_start
