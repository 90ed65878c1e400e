#!/usr/bin/env python3
"""Installs the Python binding as a user would and runs its tests against it (meson test
python-package; python3 stdlib only, no network).

    run_tests.py SOURCE_ROOT

1. copies client/python to a temporary folder (pip builds in the source folder it is given; the
   source tree stays untouched),
2. python3 -m venv --system-site-packages (numpy, and torch where installed, come from the system),
3. pip install --no-build-isolation --no-index: the build backend is the system's setuptools
   (Debian: python3-setuptools), nothing is downloaded,
4. runs client/python/tests/test_*.py with the venv's python (unittest) from outside the source
   tree, so they import the installed copy.

The environment passes through: DQUANT_LIB_DIR (the libraries), DQUANTD (the daemon the tests
start), DQUANT_LAYOUT_PROBE, DQ_CHUNK_VECTORS, DQUANT_FAKENCCL_LIB and DQUANTD_FAKENCCL (the
emulated NCCL data path). Exit status: unittest's (skips are not failures)."""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    src = pathlib.Path(sys.argv[1]).resolve()
    pkg, tests = src / "client" / "python", src / "client" / "python" / "tests"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="dquant-pyinstall-"))
    try:
        copy = tmp / "src"
        shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests"))
        venv = tmp / "venv"
        r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                           capture_output=True, text=True)
        if r.returncode:
            print(f"python3 -m venv failed (Debian: apt-get install python3-venv; scripts/setup.sh does):\n"
                  f"{r.stdout}{r.stderr}", file=sys.stderr)
            return 1
        py = venv / "bin" / "python"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_INDEX_URL")}
        env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1", PYTHONDONTWRITEBYTECODE="1")
        cmd = [str(py), "-m", "pip", "install", "--no-build-isolation", "--no-index", str(copy)]
        print("$", " ".join(cmd), flush=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        print(r.stdout[-2000:], r.stderr[-4000:], sep="", flush=True)
        if r.returncode:
            print("pip install failed (Debian: apt-get install python3-pip python3-setuptools)", file=sys.stderr)
            return 1
        env["DQUANT_EXPECT_PREFIX"] = str(venv)
        cmd = [str(py), "-m", "unittest", "discover", "-v", "-s", str(tests), "-t", str(tests), "-p", "test_*.py"]
        print("$", " ".join(cmd), flush=True)
        return subprocess.run(cmd, env=env, cwd=tmp).returncode
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
