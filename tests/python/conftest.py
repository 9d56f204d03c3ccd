import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CHORUS_BUILD_DIR", os.path.join(REPO, "build"))
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
sys.path.insert(0, os.path.join(BUILD, "python"))  # for checks made in the test process itself


class Ranks:
    """Runs a Python script on N ranks under chorusrun."""

    def __call__(self, n, script, *args, env=None, timeout=240, keep_going=False, mpirun=False):
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = os.path.join(BUILD, "python") + os.pathsep + full_env.get("PYTHONPATH", "")
        full_env.setdefault("OMP_NUM_THREADS", "1")
        if env:
            full_env.update(env)
        path = script if os.path.isabs(script) else os.path.join(WORKERS, script)
        if mpirun:
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(n),
                   "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"]
            for key in (env or {}):
                cmd += ["-x", key]
        else:
            cmd = [os.path.join(BUILD, "chorusrun"), "-np", str(n)]
        if keep_going:
            cmd.append("--keep-going")
        cmd += [sys.executable, path, *args]
        proc = subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, text=True)
        return proc


@pytest.fixture
def ranks():
    return Ranks()


def discovery_script(tmp_path, *hosts):
    """An elastic job's host discovery script that lists hosts ("localhost:3")."""
    listing = tmp_path / "hosts"
    listing.write_text("".join(f"{h}\n" for h in hosts))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listing}\n")
    script.chmod(0o755)
    return script


def ok(proc):
    assert proc.returncode == 0, proc.stdout
    return proc.stdout


def have_mpi():
    import shutil
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    import chorus._core as core
    return shutil.which("mpirun") is not None and core.mpi_built()
