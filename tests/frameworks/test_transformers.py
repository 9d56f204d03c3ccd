"""Transformers' Trainer with a DeepSpeed config, `import deepspeed` resolving to
chorus.deepspeed: 2 ranks, a tiny GPT-2 from a config, 20 steps saving at step 10.
Losses equal one torch process on the global batch, which starts from weights
chorus had no part in: the seed's at ZeRO-2, and at ZeRO-3 the ones the real
DeepSpeed's zero.Init gives (chorus must start from those very weights); a fresh
run resumed from step 10 reproduces steps 11-20; the saved checkpoint consolidates
offline with its zero_to_fp32.py."""
import shutil

import pytest

from conftest import PYTHON, chorusrun, losses, real_deepspeed, run, same_weights, single

TOL = 2e-5


@pytest.mark.parametrize("mode", ["z2", "z3", "z2_offload", "z3_offload"])
def test_trainer_matches_one_process_and_resumes(mode, tmp_path):
    out = tmp_path / mode
    trained = chorusrun(2, "hf_trainer.py", mode, out)
    got = losses(trained)
    assert sorted(got) == list(range(1, 21)), trained[-5000:]
    if mode.startswith("z3"):
        assert "[0]<stdout>:zero.Init partitioned" in trained, trained[-5000:]
    init = []
    if mode.startswith("z3"):  # DeepSpeed's own weights for this model, built under its zero.Init
        real_deepspeed(2, "hf_trainer.py", "z3", tmp_path / "deepspeed", "--init-only")
        init = ["--init", tmp_path / "deepspeed" / "init.pt"]
    ref_out = single("hf_trainer.py", "ref", tmp_path / "ref", "--reference", *init)
    same_weights(out / "init.pt", tmp_path / "ref" / "init.pt")
    want = losses(ref_out)
    for step in range(1, 21):
        assert abs(got[step] - want[step]) < TOL, (step, got[step], want[step])

    # A fresh job resumes from the checkpoint at step 10.
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(out / "checkpoint-10", resumed_dir / "checkpoint-10")
    resumed = losses(chorusrun(2, "hf_trainer.py", mode, resumed_dir, "--resume"))
    assert sorted(resumed) == list(range(11, 21)), resumed
    for step in range(11, 21):
        assert abs(resumed[step] - got[step]) < TOL, (step, resumed[step], got[step])

    # Offline consolidation, as DeepSpeed's checkpoints offer it, gives the one process's weights.
    ckpt = out / "checkpoint-20"
    assert (ckpt / "zero_to_fp32.py").exists() and (ckpt / "latest").read_text().strip() == "global_step20"
    run([PYTHON, "zero_to_fp32.py", ".", str(tmp_path / "fp32.bin")], cwd=ckpt)
    code = (f"import torch; a = torch.load({str(tmp_path / 'fp32.bin')!r}); "
            f"b = torch.load({str(tmp_path / 'ref' / 'final.pt')!r}); "
            "bad = [k for k in b if k in a and not torch.allclose(a[k].float(), b[k].float(), atol=1e-4)]; "
            "missing = [k for k in b if k not in a and 'lm_head' not in k and 'masked_bias' not in k]; "
            "assert not bad and not missing, (bad, missing); print('weights equal', len(a))")
    assert "weights equal" in run([PYTHON, "-c", code])
