"""Frameworks that drive chorus from outside (torchrun, Transformers, Accelerate,
Lightning), in the torch 2 venv scripts/torch2-venv.sh makes (CHORUS_TORCH2_PYTHON)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CHORUS_BUILD_DIR", os.path.join(REPO, "build"))
WORKERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers")
PYTHON = os.environ.get("CHORUS_TORCH2_PYTHON", sys.executable)
# scripts/torch2-venv.sh's overlays: hf4 (Transformers 4.48, Accelerate 1.3), deepspeed (the real one).
OVERLAYS = os.path.join(os.path.dirname(os.path.dirname(PYTHON)), "overlays")


def overlay(name):
    """An overlay's folder; a test that needs a missing one fails, naming the script that makes it."""
    path = os.path.join(OVERLAYS, name)
    if not os.path.exists(os.path.join(path, ".pins")):
        pytest.fail(f"overlay {name!r} is missing at {path}: run scripts/torch2-venv.sh (CHORUS_TORCH2_PYTHON "
                    f"must be that venv's python)")
    return path


def env(overlays=(), chorus=True, **extra):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("CHORUS_RANK", "CHORUS_SIZE", "OMPI_", "PMI", "SLURM_"))
         and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    e["PYTHONPATH"] = os.pathsep.join([overlay(o) for o in overlays] + ([os.path.join(BUILD, "python")] if chorus
                                                                          else []))
    e.setdefault("OMP_NUM_THREADS", "1")
    e["TRANSFORMERS_VERBOSITY"] = "error"
    e["HF_HUB_OFFLINE"] = "1"
    e.update(extra)
    return e


def run(cmd, timeout=300, cwd=None, overlays=(), chorus=True, **extra):
    proc = subprocess.run(cmd, env=env(overlays, chorus, **extra), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-20000:]
    return proc.stdout


def chorusrun(n, script, *args, timeout=300, **extra):
    return run([os.path.join(BUILD, "chorusrun"), "-np", str(n), "--python", PYTHON, os.path.join(WORKERS, script),
                *map(str, args)], timeout=timeout, **extra)


def single(script, *args, timeout=300, **extra):
    return run([PYTHON, os.path.join(WORKERS, script), *map(str, args)], timeout=timeout, **extra)


def deepspeed_env(overlays=()):
    """The real DeepSpeed on the CPU, without chorus: its overlay first on the path
    (before the venv's `deepspeed` alias), its CPU ops built once per build folder
    (scripts/deepspeed-ops.sh builds them ahead, with the same compiler command)."""
    return dict(overlays=("deepspeed",) + tuple(overlays), chorus=False, DS_ACCELERATOR="cpu",
                TORCH_EXTENSIONS_DIR=os.path.join(BUILD, "torch_extensions"),
                CXX=os.path.join(REPO, "scripts", "cxx-nodebug"))


# The real DeepSpeed (with torch's gloo) sometimes aborts the interpreter's exit after
# the script has finished: a comm thread still joinable at teardown. Not what the tests
# measure: such a run is repeated, at most twice; any other failure fails the test.
EXIT_ABORT = "terminate called without an active exception"


def real_deepspeed(n, script, *args, timeout=600, overlays=(), env_extra=None):
    """script under the real DeepSpeed on n ranks, started by torchrun as DeepSpeed's users start it."""
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
           os.path.join(WORKERS, script), *map(str, args)]
    for attempt in range(3):
        proc = subprocess.run(cmd, env=env(**deepspeed_env(overlays), **(env_extra or {})), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if proc.returncode == 0 or EXIT_ABORT not in proc.stdout:
            break
    assert proc.returncode == 0, proc.stdout[-20000:]
    return proc.stdout


def losses(out):
    """{step: loss} from 'step N loss X' (rank 0's, or the single process's). Not anchored to a line:
    torchrun's children write unbuffered, so print's text and its newline are two writes, and another
    rank's line can land between them or before them."""
    found = {}
    for m in re.finditer(r"step (\d+) loss (-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)", out):
        prefix = re.search(r"\[\d+\]<std(?:out|err)>:$", out[max(0, m.start() - 24):m.start()])
        if prefix is None or prefix.group(0) == "[0]<stdout>:":  # chorusrun's prefix: rank 0's stdout only
            found[int(m.group(1))] = float(m.group(2))
    return found


@pytest.fixture(scope="session", autouse=True)
def deepspeed_alias():
    """`import deepspeed` is chorus.deepspeed in the venv (the documented one line)."""
    out = run([PYTHON, "-m", "chorus.deepspeed.alias", "install"])
    assert "installed" in out, out
    yield


def same_weights(a, b, atol=0.0):
    """The state dicts saved in files a and b hold the same keys and values (within atol)."""
    code = (f"import torch; a = torch.load({str(a)!r}); b = torch.load({str(b)!r}); "
            "assert sorted(a) == sorted(b), (sorted(a), sorted(b)); "
            f"bad = [k for k in a if not torch.allclose(a[k].float(), b[k].float(), rtol=0, atol={atol!r})]; "
            "assert not bad, bad; print('same', len(a))")
    assert "same" in run([PYTHON, "-c", code])


def have(module):
    return subprocess.run([PYTHON, "-c", f"import {module}"], env=env(), capture_output=True).returncode == 0


__all__ = ["BUILD", "PYTHON", "WORKERS", "chorusrun", "single", "losses", "run", "env", "have", "shutil", "overlay",
           "deepspeed_env", "real_deepspeed", "same_weights"]


def under_both(n, script, tmp_path, *args):
    """script on n ranks under the real DeepSpeed and under chorus, each given its own
    folder (tmp_path/deepspeed, tmp_path/chorus) first; returns the folders and outputs."""
    folders, outs = {}, {}
    for who, start in (("deepspeed", real_deepspeed), ("chorus", chorusrun)):
        folders[who] = tmp_path / who
        folders[who].mkdir()
        outs[who] = start(n, script, folders[who], *args)
    return folders, outs
