"""pytest setup for the spool package's tests (python/tests).

meson's `python` test sets SPOOL_LIBRARY (the build's libspool.so.0), PYTHONPATH (this
source tree's python/), SPOOL_CLI (the `spool` binary) and SPOOL_C_WORKER (the C example,
examples/worker.c). Run by hand:

    SPOOL_LIBRARY=build/libspool.so.0 SPOOL_CLI=build/tools/spool \\
    SPOOL_C_WORKER=build/examples/spool-c-worker PYTHONPATH=python python3 -m pytest python/tests
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


@pytest.fixture
def qdir(tmp_path):
    """A fresh queue directory path (not created yet)."""
    return str(tmp_path / "q")


def _tool(var: str) -> str:
    path = os.environ.get(var)
    if not path or not os.access(path, os.X_OK):
        pytest.skip(f"{var} is not set to an executable (meson test sets it)")
    return path


@pytest.fixture
def spool_cli() -> str:
    return _tool("SPOOL_CLI")


@pytest.fixture
def c_worker() -> str:
    return _tool("SPOOL_C_WORKER")
