"""The package installs offline with pip and setuptools alone, and works installed."""

from __future__ import annotations

import os
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


if __name__ == "__main__":
    unittest.main()
