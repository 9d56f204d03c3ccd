"""Accelerate's DeepSpeed plugin at ZeRO-2 and ZeRO-3, Accelerate 1.3 (with
Transformers 4.48) and the newest: the same script under the real DeepSpeed 0.19.8
(torchrun, 2 ranks) and under chorus (chorusrun, 2 ranks) logs the same losses at
every step and ends with the same weights (get_state_dict)."""
import pytest

from conftest import PYTHON, chorusrun, losses, real_deepspeed, run, same_weights

TOL = 1e-5


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("accelerate", ["1.3", "1.15"])
def test_accelerate_follows_deepspeed(accelerate, stage, tmp_path):
    overlays = ("hf4",) if accelerate == "1.3" else ()
    version = run([PYTHON, "-c", "import accelerate; print(accelerate.__version__)"], overlays=overlays)
    assert version.strip().startswith(accelerate), version
    want = losses(real_deepspeed(2, "accelerate_ds.py", stage, "none", tmp_path / "deepspeed", overlays=overlays))
    got = losses(chorusrun(2, "accelerate_ds.py", stage, "none", tmp_path / "chorus", overlays=overlays))
    assert sorted(want) == list(range(1, 11)) and sorted(got) == sorted(want), (want, got)
    for step in want:
        assert abs(got[step] - want[step]) <= TOL * max(1.0, abs(want[step])), (step, got[step], want[step])
    same_weights(tmp_path / "chorus" / "final.pt", tmp_path / "deepspeed" / "final.pt", atol=1e-5)
