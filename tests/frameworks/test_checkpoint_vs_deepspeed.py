"""A checkpoint the real DeepSpeed 0.19.8 saved (2 ranks; ZeRO 0-3, fp32 and bf16, AdamW
with WarmupLR) loads in chorus at 2 ranks and at 1 (workers/ds_checkpoint_resume.py): the
losses of the next 3 steps equal DeepSpeed's own resumed run's (which equal its
uninterrupted run's), the client state and the step counters come back. And the reverse:
chorus saves in DeepSpeed's layout, DeepSpeed loads it."""
import json
import shutil
import subprocess

import torch

from conftest import OVERLAYS, PYTHON, chorusrun, deepspeed_env, env, real_deepspeed, run


def test_deepspeed_checkpoints_resume_in_chorus(tmp_path):
    real_deepspeed(2, "ds_checkpoint_resume.py", "save", tmp_path)
    want = json.loads((tmp_path / "saved.json").read_text())
    assert "/overlays/deepspeed/" in want["deepspeed"]
    want = want["results"]
    assert len(want) == 8
    for n in (2, 1):
        chorusrun(n, "ds_checkpoint_resume.py", "load", tmp_path, tmp_path / f"chorus{n}.json")
        got = json.loads((tmp_path / f"chorus{n}.json").read_text())
        assert "chorus" in got["deepspeed"]
        for key, result in got["results"].items():
            assert "resumed" in result, (n, key, result)
            ds = want[key]
            assert ds["resumed"] == ds["continued"]  # (DeepSpeed resumes exactly)
            # bf16 at another size: the gradients are summed in another order
            tol = 1e-4 if "bf16" in key and n != 2 else 1e-5
            worst = max(abs(a - b) for a, b in zip(result["resumed"], ds["resumed"]))
            assert worst <= tol, (n, key, worst, result["resumed"], ds["resumed"])
            assert result["client"] == 5 and result["global_steps"] == 6, (n, key, result)


def test_chorus_saves_in_deepspeeds_layout(tmp_path):
    """checkpoint.format "deepspeed": chorus (2 ranks) saves each case in DeepSpeed's layout and
    goes on 3 steps; the real DeepSpeed loads the save (2 ranks: its ZeRO refuses another size)
    and its 3 steps equal chorus's; chorus resumes from it too (at 2 and at 1 rank); DeepSpeed's
    own zero_to_fp32.py consolidates it into the module chorus had at the save."""
    chorusrun(2, "ds_checkpoint_resume.py", "save", tmp_path)
    saved = json.loads((tmp_path / "saved.json").read_text())
    assert "chorus" in saved["deepspeed"]
    saved = saved["results"]
    assert len(saved) == 8
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
    chorusrun(2, "ds_checkpoint_resume.py", "save", src, CKPT_FORMAT="chorus")
    saved = json.loads((src / "saved.json").read_text())["results"]
    assert all((src / "z1_fp32" / "global_step3" / f).exists()
               for f in ("model_states.chorus", "zero_rank_00001_optim_states.chorus"))
    for world in (2, 1):
        dst = tmp_path / f"converted{world}"
        for stage in range(4):
            for dtype in ("fp32", "bf16"):
                out = run([PYTHON, "-m", "chorus.deepspeed.checkpoint", "convert", src / f"z{stage}_{dtype}",
                           dst / f"z{stage}_{dtype}", "--world", str(world)])
                assert "in DeepSpeed's layout" in out, out
        real_deepspeed(world, "ds_checkpoint_resume.py", "load", dst, tmp_path / f"deepspeed{world}.json")
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
