"""Faults found by probing (issue 44): settings the launcher must not override,
a /dev/shm too small, NaN in Max/Min."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import BUILD, WORKERS, discovery_script, ok


def test_start_timeout_from_the_environment_is_obeyed(ranks):
    for var in ("CHORUS_START_TIMEOUT", "HOROVOD_START_TIMEOUT"):
        out = subprocess.run([os.path.join(BUILD, "chorusrun"), "-np", "1", "sh", "-c", "echo t=$CHORUS_START_TIMEOUT"],
                             env=dict(os.environ, **{var: "7"}), stdout=subprocess.PIPE, text=True).stdout
        assert "t=7.0" in out, (var, out)
    out = subprocess.run([os.path.join(BUILD, "chorusrun"), "--start-timeout", "5", "-np", "1", "sh", "-c",
                          "echo t=$CHORUS_START_TIMEOUT"], env=dict(os.environ, CHORUS_START_TIMEOUT="7"),
                         stdout=subprocess.PIPE, text=True).stdout
    assert "t=5.0" in out, out  # the flag, given, wins


@pytest.mark.parametrize("n", [2, 3])
def test_nan_propagates_through_max_and_min(ranks, n):
    out = ok(ranks(n, "nan_minmax.py"))
    assert out.count("nan ok") == n, out


def can_mount_tmpfs():
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not can_mount_tmpfs(), reason="needs root and mount namespaces (unshare -m)")
@pytest.mark.parametrize("size", ["4k", "2m"])
def test_small_dev_shm_is_an_error_on_every_rank_not_sigbus(size):
    """/dev/shm replaced, in a mount namespace of the test's own, by a tmpfs of 4 KiB or 2 MiB."""
    script = ("import torch, chorus.torch as hvd\n"
              "try:\n"
              "    hvd.init(); hvd.allreduce(torch.ones(4))\n"
              "except Exception as e:\n"
              "    print('init failed:', e, flush=True); raise SystemExit(3)\n")
    cmd = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm && "
           f"exec {os.path.join(BUILD, 'chorusrun')} --keep-going -np 2 {sys.executable} -c \"$SCRIPT\"")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], env=dict(os.environ, SCRIPT=script,
                          PYTHONPATH=os.path.join(BUILD, "python")), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout
    assert "signal 7" not in proc.stdout and "Bus error" not in proc.stdout, proc.stdout
    assert proc.stdout.count("do not fit in /dev/shm") == 2, proc.stdout  # both ranks say what is wrong
    assert "CHORUS_SHM_DISABLE=1" in proc.stdout, proc.stdout


def test_a_stopped_rank_is_named_by_its_global_rank(ranks):
    out = ranks(3, "stopped_rank.py", keep_going=True,
                env={"CHORUS_CPU_OPERATIONS": "tcp", "CHORUS_TIMEOUT_SECONDS": "3"}).stdout
    assert "error: rank 0 timed out after 3000 ms waiting for rank(s) 2 " in out, out


def test_duplicate_process_sets_are_refused(ranks):
    out = ok(ranks(3, "dup_sets.py"))
    assert out.count("dup sets ok") == 3, out


@pytest.mark.parametrize("n", [2, 3])
def test_sparse_gradients_and_optimizer_state(ranks, n):
    out = ok(ranks(n, "sparse_and_state.py"))
    assert out.count("sparse and state ok") == n, out


def test_errors_of_horovods_types(ranks):
    out = ok(ranks(2, "horovod_errors.py"))
    assert out.count("horovod errors ok") == 2, out


def test_a_worker_killed_on_one_host_is_a_worker_failure(tmp_path):
    script = discovery_script(tmp_path, "localhost:3")
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"), OMP_NUM_THREADS="1")
    proc = subprocess.run([os.path.join(BUILD, "chorusrun"), "--min-np", "2", "--max-np", "3",
                           "--host-discovery-script", str(script), "--elastic-timeout", "30",
                           sys.executable, os.path.join(WORKERS, "elastic_one_host.py"), str(tmp_path / "killed")],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout
    assert "was killed by signal 9" in proc.stdout, proc.stdout
    assert "host localhost stays (failure 1 of 3" in proc.stdout, proc.stdout
    assert "host localhost is blacklisted" not in proc.stdout, proc.stdout
    assert proc.stdout.count("done at step 12") >= 2, proc.stdout
