"""chorus's checkpoints in DeepSpeed 0.19.8's layout, for the real DeepSpeed: saved so
(checkpoint.format "deepspeed") or converted so (python -m chorus.deepspeed.checkpoint
convert), on the cases of workers/ds_checkpoint_resume.py (ZeRO 0-3, fp32 and bf16, AdamW,
offloaded AdamW, Lion, Adagrad)."""
import json
import os
import shutil
import subprocess

import torch

from conftest import OVERLAYS, PYTHON, REPO, chorusrun, deepspeed_env, env, real_deepspeed, run


def test_chorus_saves_in_deepspeeds_layout(tmp_path):
    """checkpoint.format "deepspeed": chorus (2 ranks) saves each case in DeepSpeed's layout and
    goes on 3 steps; the real DeepSpeed loads the save (2 ranks: its ZeRO refuses another size)
    and its 3 steps equal chorus's; chorus resumes from it too (at 2 and at 1 rank); DeepSpeed's
    own zero_to_fp32.py consolidates it into the module chorus had at the save."""
    chorusrun(2, "ds_checkpoint_resume.py", "save", tmp_path)
    saved = json.loads((tmp_path / "saved.json").read_text())
    assert "chorus" in saved["deepspeed"]
    saved = saved["results"]
    assert len(saved) == 16
    for key, result in saved.items():
        assert "resumed" in result, (key, result)
        worst = max(abs(a - b) for a, b in zip(result["resumed"], result["continued"]))
        assert worst <= 1e-6, (key, worst)
    real_deepspeed(2, "ds_checkpoint_resume.py", "load", tmp_path, tmp_path / "deepspeed.json")
    back = json.loads((tmp_path / "deepspeed.json").read_text())
    assert "/overlays/deepspeed/" in back["deepspeed"]
    chorusrun(1, "ds_checkpoint_resume.py", "load", tmp_path, tmp_path / "chorus1.json")
    at1 = json.loads((tmp_path / "chorus1.json").read_text())["results"]
    for key, result in back["results"].items():
        assert "resumed" in result, (key, result)
        assert result["client"] == 5 and result["global_steps"] == 6, (key, result)
        worst = max(abs(a - b) for a, b in zip(result["resumed"], saved[key]["continued"]))
        assert worst <= 1e-6, (key, worst, result["resumed"], saved[key]["continued"])
        tol = 1e-4 if "bf16" in key else 1e-5  # (another size: the gradients are summed in another order)
        worst = max(abs(a - b) for a, b in zip(at1[key]["resumed"], saved[key]["continued"]))
        assert worst <= tol, (key, worst)
    # DeepSpeed leaves its zero_to_fp32.py beside its checkpoints; run as its users run it.
    script = tmp_path / "zero_to_fp32.py"
    shutil.copy(f"{OVERLAYS}/deepspeed/deepspeed/utils/zero_to_fp32.py", script)
    for stage in (1, 2, 3):
        for dtype in ("fp32", "bf16"):
            case = tmp_path / f"z{stage}_{dtype}"
            run([PYTHON, str(script), str(case), str(tmp_path / f"fp32_{stage}_{dtype}")], **deepspeed_env())
            got = torch.load(tmp_path / f"fp32_{stage}_{dtype}" / "pytorch_model.bin")
            module = torch.load(case / "module_at_save.pt")
            assert sorted(got) == sorted(module), (stage, dtype, sorted(got))
            for name, value in got.items():
                assert value.dtype == torch.float32
                want = module[name]
                # the fp32 master rounds to the bf16 module (equal to it in fp32)
                have = value.to(torch.bfloat16).float() if dtype == "bf16" else value
                assert torch.equal(have, want), (stage, dtype, name, (have - want).abs().max())


def test_converter_writes_deepspeeds_layout(tmp_path):
    """python -m chorus.deepspeed.checkpoint convert: chorus's own checkpoints (2 ranks) written
    in DeepSpeed's layout for 2 ranks and for 1, which the real DeepSpeed loads at those sizes
    and trains on as chorus went on (at 1 rank within the other summation order's rounding)."""
    src = tmp_path / "chorus_format"
    some = "z0_bf16,z1_fp32,z2_bf16_frozen,z3_bf16,z3_fp32_subgroups,z1_fp32_Adagrad_offload"
    chorusrun(2, "ds_checkpoint_resume.py", "save", src, CKPT_FORMAT="chorus", CASES=some)
    saved = json.loads((src / "saved.json").read_text())["results"]
    assert len(saved) == 6
    assert all((src / "z1_fp32" / "global_step3" / f).exists()
               for f in ("model_states.chorus", "zero_rank_00001_optim_states.chorus"))
    cases = [key.replace("stage ", "z").replace(" ", "_") for key in saved]
    out = run([PYTHON, "-m", "chorus.deepspeed.checkpoint", "convert", src / cases[0], tmp_path / "converted2" /
               cases[0], "--world", "2"])  # the command line, once; the rest in one process
    assert "in DeepSpeed's layout" in out, out
    run([PYTHON, "-c", "import sys; from chorus.deepspeed.checkpoint.__main__ import convert\n"
         "for case in sys.argv[3:]:\n"
         "    for world in (2, 1):\n"
         "        if (case, world) != (sys.argv[3], 2):\n"
         "            convert(f'{sys.argv[1]}/{case}', f'{sys.argv[2]}{world}/{case}', world=world)",
         str(src), str(tmp_path / "converted"), *cases])
    for world in (2, 1):
        dst = tmp_path / f"converted{world}"
        real_deepspeed(world, "ds_checkpoint_resume.py", "load", dst, tmp_path / f"deepspeed{world}.json",
                       env_extra={"CASES": some})
        got = json.loads((tmp_path / f"deepspeed{world}.json").read_text())["results"]
        for key, result in got.items():
            assert "resumed" in result, (world, key, result)
            assert result["client"] == 5 and result["global_steps"] == 6, (world, key, result)
            tol = 1e-6 if world == 2 else (1e-4 if "bf16" in key else 1e-5)
            worst = max(abs(a - b) for a, b in zip(result["resumed"], saved[key]["continued"]))
            assert worst <= tol, (world, key, worst)
    # Into a folder that is not empty: refused, nothing overwritten.
    again = subprocess.run([PYTHON, "-m", "chorus.deepspeed.checkpoint", "convert", str(src / "z1_fp32"),
                            str(tmp_path / "converted2" / "z1_fp32")], env=env(), capture_output=True, text=True)
    assert again.returncode == 2 and "not empty" in again.stderr, again.stderr


def test_fp16_loss_scale_travels_in_deepspeeds_layout(tmp_path):
    """fp16 (torch 2 runs it on the CPU; DeepSpeed does not, so chorus alone): the dynamic loss
    scale, started high so that the first steps overflow, comes back from DeepSpeed's layout
    with its hysteresis, and the resumed engine skips and steps as the saving one did
    (tests/python/workers/zero_ds_layout.py, which tests/python runs at fp32 and bf16)."""
    worker = os.path.join(REPO, "tests", "python", "workers", "zero_ds_layout.py")
    out = chorusrun(2, worker, tmp_path, "fp16")
    for stage in range(4):
        assert out.count(f"ds layout z{stage} fp16 ok") == 2, out[-3000:]
    assert "skipped)" in out and ", 0 skipped" not in out, out[-3000:]
