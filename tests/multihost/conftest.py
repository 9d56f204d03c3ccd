import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("CHORUS_BUILD_DIR", os.path.join(REPO, "build"))
WORKERS = os.path.join(HERE, "workers")
sys.path.insert(0, HERE)

import testbed  # noqa: E402

PYTHON = "/usr/bin/python3"  # Debian's, with torch


def chorusrun():
    return os.path.join(BUILD, "chorusrun")


@pytest.fixture(scope="session")
def bed():
    why = testbed.unavailable()
    if why:
        # A failure, not a skip: CI would report skipped multi-host tests as passed.
        pytest.fail(f"the multi-host tests cannot run here: {why}")
    with testbed.TestBed(2) as b:
        yield b


@pytest.fixture(scope="session")
def env(bed):
    """The environment a user on node1 has: `python` is an interpreter that has
    torch and chorus (a wrapper around Debian's here, a venv on a real cluster)."""
    bindir = os.path.join(bed.work, "bin")
    os.makedirs(bindir, exist_ok=True)
    with open(os.path.join(bindir, "python"), "w") as f:
        f.write(f"#!/bin/sh\nexport PYTHONPATH={os.path.join(BUILD, 'python')}${{PYTHONPATH:+:$PYTHONPATH}}\n"
                f"exec {PYTHON} \"$@\"\n")
    os.chmod(os.path.join(bindir, "python"), 0o755)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("CHORUS_", "HOROVOD_", "OMPI_", "PMIX_"))}
    e["PATH"] = bindir + os.pathsep + e.get("PATH", "/usr/bin:/bin")
    e["PYTHONPATH"] = os.path.join(BUILD, "python")
    e["CHORUS_PYTHON"] = os.path.join(bindir, "python")  # what the chorusrun console script sets
    e["OMP_NUM_THREADS"] = "1"
    return e
