"""The package installs offline with pip and setuptools alone, and works installed."""

from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import unittest
from typing import Optional

import harness


def installer() -> Optional[str]:
    """A python with pip, setuptools and wheel (setuptools < 70.1 builds wheels with it):
    this one, else Debian's."""
    for py in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
        probe = subprocess.run([py, "-c", "import setuptools, wheel, pip"], capture_output=True)
        if probe.returncode == 0:
            return py
    return None


class InstallTest(unittest.TestCase):
    def test_pip_install_offline(self) -> None:
        py = installer()
        if py is None:
            self.skipTest("no python3 here has pip, setuptools and wheel "
                          "(apt-get install python3-pip python3-setuptools python3-wheel)")
        with tempfile.TemporaryDirectory() as tmp:
            # Built from a copy: setuptools builds in the source tree.
            src = shutil.copytree(os.path.join(harness.REPO, "sdk", "python"), os.path.join(tmp, "src"),
                                  ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
            target = os.path.join(tmp, "site")
            build = subprocess.run(
                [py, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
                 "--no-cache-dir", "--target", target, src],
                capture_output=True, text=True, timeout=300,
                env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "TMPDIR": tmp})
            self.assertEqual(build.returncode, 0, build.stdout + build.stderr)
            check = subprocess.run(
                [py, "-c", "import roche_sandbox, os; "
                 "print(os.path.dirname(roche_sandbox.__file__)); print(roche_sandbox.__version__)"],
                capture_output=True, text=True, cwd=tmp,
                env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": target})
            self.assertEqual(check.returncode, 0, check.stderr)
            where, version = check.stdout.split()
            self.assertTrue(where.startswith(target), where)
            self.assertTrue(os.path.exists(os.path.join(where, "py.typed")))
            self.assertEqual(version, "0.1.0")


# The seeds' hello, run as written but for the image, and an example's tool function.
HELLO = """
from roche_sandbox import Roche
with Roche().create(image=IMAGE) as sandbox:
    result = sandbox.exec(["python3", "-c", "print('hello')"])
    print(result.stdout)
"""

EXAMPLE_TOOL = """
import importlib.util, roche_sandbox._discovery as d
spec = importlib.util.spec_from_file_location("example", EXAMPLE)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
print(repr(m.execute_python("print(6 * 7)")), m.roche.transport, d.find_cli())
"""


class WheelTest(harness.SandboxTestCase):
    """`make dist`'s wheel, installed with pip into a fresh venv, is all a user needs:
    no roche on PATH, no roched, no ROCHE_CLI."""

    def test_wheel_in_a_fresh_venv(self) -> None:
        arch = {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()]
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "dist")
            build = subprocess.run(["go", "run", "./scripts/dist", "-out", out, "-arch", arch],
                                   cwd=harness.REPO, capture_output=True, text=True, timeout=900,
                                   env={**os.environ, "CGO_ENABLED": "0"})
            self.assertEqual(build.returncode, 0, build.stderr)
            plat = {"amd64": "x86_64", "arm64": "aarch64"}[arch]
            wheel = os.path.join(out, f"roche_sandbox-0.1.0-py3-none-manylinux_2_17_{plat}.whl")
            self.assertEqual(sorted(glob.glob(os.path.join(out, "*"))), sorted([wheel, os.path.join(out, "roche_sandbox-0.1.0.tar.gz")]))

            venv = os.path.join(tmp, "venv")
            made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True, timeout=300)
            self.assertEqual(made.returncode, 0, made.stderr)
            py = os.path.join(venv, "bin", "python")
            pip = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir", wheel],
                                 capture_output=True, text=True, timeout=300,
                                 env={"PATH": "/usr/bin:/bin", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "HOME": tmp})
            self.assertEqual(pip.returncode, 0, pip.stdout + pip.stderr)

            # Only what the venv has: no roche on PATH, no roched answering, no ROCHE_CLI.
            env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "ROCHE_SOCKET": harness.dead_socket()}
            if "DOCKER_HOST" in os.environ:
                env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
            hello = subprocess.run([py, "-c", f"IMAGE = {harness.image()!r}\n" + HELLO],
                                   capture_output=True, text=True, timeout=300, cwd=tmp, env=env)
            self.assertEqual((hello.returncode, hello.stdout), (0, "hello\n\n"), hello.stderr)

            example = os.path.join(harness.REPO, "examples", "openai_agents_tool.py")
            tool = subprocess.run([py, "-c", f"EXAMPLE = {example!r}\n" + EXAMPLE_TOOL], capture_output=True, text=True,
                                  timeout=300, cwd=tmp, env={**env, "ROCHE_IMAGE": harness.image()})
            self.assertEqual(tool.returncode, 0, tool.stderr)
            bundled = os.path.join(venv, "lib", f"python{sys.version_info.major}.{sys.version_info.minor}",
                                   "site-packages", "roche_sandbox", "_bin", "roche")
            self.assertEqual(tool.stdout, f"'42\\n' cli {bundled}\n")


if __name__ == "__main__":
    unittest.main()
