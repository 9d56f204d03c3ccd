"""Transformers' Trainer with a DeepSpeed config at ZeRO-2 and ZeRO-3, under
Transformers 4.48 (with Accelerate 1.3, as many projects still pin them) and 5.x:
the same script under the real DeepSpeed 0.19.8 (torchrun, 2 ranks), under chorus
(chorusrun, 2 ranks) and as one plain torch process on the global batch. chorus
starts from DeepSpeed's very weights (under ZeRO-3 built inside zero.Init, where
Transformers 4.x initializes through Module.apply: not the plain process's weights,
GPT-2's scaled c_proj init does not reach partitioned children under DeepSpeed
either), the plain process from the seed's at ZeRO-2 and from DeepSpeed's at
ZeRO-3; all log the same losses. Under Transformers 5 at ZeRO-2, the Trainer under chorus
also resumes from the checkpoint the real DeepSpeed saved at step 10, to DeepSpeed's losses,
and the real DeepSpeed's Trainer from the one chorus saved in DeepSpeed's layout
(checkpoint.format), to chorus's (the other stages: test_checkpoint_vs_deepspeed.py)."""
import shutil

import pytest

from conftest import PYTHON, chorusrun, losses, real_deepspeed, run, same_weights, single

# The Trainer logs losses rounded to 4 decimals.
TOL = 1.5e-4
STEPS = list(range(1, 21))


@pytest.mark.parametrize("mode", ["z2", "z3"])
@pytest.mark.parametrize("transformers", ["4.48", "5"])
def test_trainer_follows_deepspeed(transformers, mode, tmp_path):
    overlays = ("hf4",) if transformers == "4.48" else ()
    version = run([PYTHON, "-c", "import transformers; print(transformers.__version__)"], overlays=overlays)
    assert version.strip().startswith(transformers), version
    real = real_deepspeed(2, "hf_trainer.py", mode, tmp_path / "deepspeed", overlays=overlays)
    both_ways = transformers == "5" and mode == "z2"  # (checkpoints in DeepSpeed's layout, both ways)
    ours = chorusrun(2, "hf_trainer.py", mode, tmp_path / "chorus", *(["--ds-layout"] if both_ways else []),
                     overlays=overlays)
    init = ["--init", tmp_path / "deepspeed" / "init.pt"] if mode == "z3" else []
    plain = single("hf_trainer.py", mode, tmp_path / "plain", "--reference", *init, overlays=overlays)
    if mode == "z3":
        assert "zero.Init partitioned" in real and "[0]<stdout>:zero.Init partitioned" in ours, ours[-3000:]
    same_weights(tmp_path / "chorus" / "init.pt", tmp_path / "deepspeed" / "init.pt")
    same_weights(tmp_path / "plain" / "init.pt", tmp_path / "deepspeed" / "init.pt")
    want, got, alone = losses(real), losses(ours), losses(plain)
    assert sorted(want) == STEPS and sorted(got) == STEPS and sorted(alone) == STEPS, (want, got, alone)
    for step in STEPS:
        assert abs(got[step] - want[step]) <= TOL, (step, got[step], want[step])
        assert abs(alone[step] - want[step]) <= TOL, (step, alone[step], want[step])
    if both_ways:
        # The Trainer under chorus resumes from the checkpoint the real DeepSpeed wrote at step 10
        # (DeepSpeed's own layout: global_step10/, its .pt files) and goes on as DeepSpeed did;
        # the Trainer under the real DeepSpeed resumes from the one chorus wrote in that layout.
        shutil.copytree(tmp_path / "chorus" / "checkpoint-10", tmp_path / "from_chorus" / "checkpoint-10")
        back = losses(real_deepspeed(2, "hf_trainer.py", mode, tmp_path / "from_chorus", "--resume",
                                     overlays=overlays))
        assert sorted(back) == STEPS[10:], back
        for step in STEPS[10:]:
            assert abs(back[step] - got[step]) <= TOL, (step, back[step], got[step])
        shutil.copytree(tmp_path / "deepspeed" / "checkpoint-10", tmp_path / "from_deepspeed" / "checkpoint-10")
        resumed = losses(chorusrun(2, "hf_trainer.py", mode, tmp_path / "from_deepspeed", "--resume"))
        assert sorted(resumed) == STEPS[10:], resumed
        for step in STEPS[10:]:
            assert abs(resumed[step] - want[step]) <= TOL, (step, resumed[step], want[step])
