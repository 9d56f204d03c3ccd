"""chorus started by the real torchrun (no chorusrun), with torch.distributed's own
group beside it on MASTER_PORT; a chorus.deepspeed job under torchrun too."""
import os

import pytest

from conftest import PYTHON, WORKERS, losses, run, single

PY_WORKERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python", "workers")


@pytest.mark.parametrize("n", [2, 3])
def test_torchrun_standalone(n):
    torchrun = os.path.join(os.path.dirname(PYTHON), "torchrun")
    out = run([torchrun, "--standalone", f"--nproc_per_node={n}", os.path.join(PY_WORKERS, "launch_env.py"),
               "--dist"], EXPECT_RANK_FROM="RANK", EXPECT_SIZE=str(n))
    for r in range(n):
        assert f"ok rank {r} size {n} local_rank {r} local_size {n}" in out, out


def test_deepspeed_program_under_torchrun():
    """The seed's DeepSpeed program, started by torchrun as DeepSpeed users do."""
    torchrun = os.path.join(os.path.dirname(PYTHON), "torchrun")
    seed = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "examples", "deepspeed", "seed_simple.py")
    out = run([torchrun, "--standalone", "--nproc_per_node=2", seed], timeout=300)
    assert "Epoch [5/5]" in out, out


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_losses_under_torchrun(stage, tmp_path):
    """A DeepSpeed program (Accelerate's plugin) started by torchrun on chorus logs the
    losses one plain torch process gets on the global batch."""
    torchrun = os.path.join(os.path.dirname(PYTHON), "torchrun")
    got = losses(run([torchrun, "--standalone", "--nproc_per_node=2", os.path.join(WORKERS, "accelerate_ds.py"),
                      str(stage), "none", str(tmp_path / "run")], timeout=300))
    want = losses(single("accelerate_ds.py", stage, "none", tmp_path / "ref", "--reference"))
    assert sorted(got) == list(range(1, 11)) and sorted(want) == sorted(got), (got, want)
    for step in want:
        assert abs(got[step] - want[step]) <= 1e-5 * max(1.0, abs(want[step])), (step, got[step], want[step])
