"""What the binding's tests share: a dquantd started on a private Unix socket, numpy helpers and
skips. The tests import the installed dquant package (tests/python/run_tests.py installs it into a
fresh venv); run by hand from a source tree with PYTHONPATH=client/python.

The daemon comes from $DQUANTD, else the source tree's build*/daemon/dquantd; without one the
tests that need it skip."""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
import unittest
from typing import Optional

import dquant

try:
    import numpy as np
except ImportError:  # CI has numpy; the tests that need it skip without it
    np = None

try:
    import torch
except ImportError:
    torch = None

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent.parent


def need_numpy() -> None:
    if np is None:
        raise unittest.SkipTest("numpy not installed")


def need_torch() -> None:
    if torch is None:
        raise unittest.SkipTest("torch not installed (it is only on the GPU host)")


def need_symbols(*names: str) -> None:
    """Skips when the loaded libdquant-client lacks a C function of the shared KV tier."""
    missing = [n for n in names if not dquant.has_symbols(n)]
    if missing:
        raise unittest.SkipTest(f"libdquant-client lacks {', '.join(missing)} (the shared KV tier's C calls "
                                "are not in this build)")


def find_daemon() -> Optional[str]:
    env = os.environ.get("DQUANTD")
    if env:
        return env if os.access(env, os.X_OK) else None
    builds = sorted(map(pathlib.Path, glob.glob(str(REPO / "build*/daemon/dquantd"))))
    for p in [REPO / "build" / "daemon" / "dquantd"] + builds:
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def nmse(x, xh) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(((x - np.asarray(xh, dtype=np.float64)) ** 2).sum() / (x ** 2).sum())


class Daemon:
    """A dquantd child on a private Unix socket (--metrics off), stopped with SIGTERM."""

    def __init__(self, *extra: str, binary: Optional[str] = None) -> None:
        binary = binary or find_daemon()
        if not binary:
            raise unittest.SkipTest("no dquantd binary (set DQUANTD or build daemon/dquantd)")
        self.tmp = tempfile.mkdtemp(prefix="dquant-pytest-")
        self.sock = os.path.join(self.tmp, "d.sock")
        self.addr = f"unix:{self.sock}"
        self.log_path = os.path.join(self.tmp, "daemon.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([binary, "--listen", self.addr, "--metrics", "off", "--log-level", "warn",
                                      *extra], stdout=self._log, stderr=self._log, stdin=subprocess.DEVNULL)
        deadline = time.time() + 15
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"dquantd exited with {self.proc.returncode} at start")
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(self.sock)
                break
            except OSError:
                if time.time() > deadline:
                    self.stop()
                    raise AssertionError("dquantd did not listen within 15 s")
                time.sleep(0.02)

    def client(self, **kw) -> dquant.Client:
        kw.setdefault("timeout_ms", 20000)
        return dquant.Client(self.addr, **kw)

    def stop(self) -> Optional[int]:
        """Stops the daemon; its exit status (0: a clean exit)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        return self.proc.returncode


class DaemonTest(unittest.TestCase):
    """One dquantd for the test class."""

    daemon: Daemon

    @classmethod
    def setUpClass(cls) -> None:
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.daemon.stop()
