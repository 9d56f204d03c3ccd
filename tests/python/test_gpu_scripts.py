"""The GPU suite's workers (tests/gpu/workers) run here on CPU tensors, so that
the scripts the lent GPU machine runs stay correct between its loans. This is
not a GPU test: tests/gpu/run.sh is, on a GPU."""
import os

from conftest import REPO, ok

GPU_WORKERS = os.path.join(REPO, "tests", "gpu", "workers")
CPU = {"CHORUS_TEST_DEVICE": "cpu"}


def test_gpu_collectives_script_on_cpu(ranks):
    for n in (1, 3):
        assert f"collectives on cpu OK on {n} ranks" in ok(ranks(n, os.path.join(GPU_WORKERS, "collectives.py"),
                                                               env=CPU))


def test_gpu_collectives_script_with_static_sets_on_cpu(ranks):
    out = ok(ranks(3, os.path.join(GPU_WORKERS, "collectives.py"), env={**CPU, "CHORUS_TEST_STATIC_SETS": "1"}))
    assert "collectives on cpu OK on 3 ranks" in out


def test_gpu_optimizer_script_on_cpu(ranks):
    assert "optimizer on cpu equals cpu" in ok(ranks(2, os.path.join(GPU_WORKERS, "optimizer_equal.py"), env=CPU))


def test_gpu_peer_death_script_on_cpu(ranks):
    proc = ranks(3, os.path.join(GPU_WORKERS, "peer_death.py"), env={**CPU, "CHORUS_TIMEOUT_SECONDS": "10"},
                 keep_going=True)
    assert proc.stdout.count("HorovodInternalError caught") == 2, proc.stdout


def test_gpu_zero_scripts_on_cpu(ranks, tmp_path):
    """zero_device.py with both engines in host memory, then its checkpoint loaded by one rank."""
    out = ok(ranks(2, os.path.join(GPU_WORKERS, "zero_device.py"), "--quick", "--ckpt", str(tmp_path)))
    assert out.count("zero device ok") == 2, out
    out = ok(ranks(1, os.path.join(GPU_WORKERS, "zero_device_load.py"), str(tmp_path), env={"DS_ACCELERATOR": "cpu"}))
    assert "zero device load ok" in out, out


def test_gpu_suite_scripts_parse():
    import subprocess
    for script in ("run.sh", "bundle.sh"):
        subprocess.run(["bash", "-n", os.path.join(REPO, "tests", "gpu", script)], check=True)
