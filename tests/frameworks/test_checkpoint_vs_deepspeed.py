"""A checkpoint the real DeepSpeed 0.19.8 saved (2 ranks; ZeRO 0-3, fp32 and bf16, AdamW
with WarmupLR; offloaded AdamW, Lion and Adagrad) loads in chorus at 2 ranks and at 1 (workers/ds_checkpoint_resume.py): the
losses of the next 3 steps equal DeepSpeed's own resumed run's (which equal its
uninterrupted run's), the client state and the step counters come back. (The reverse:
test_ds_layout_vs_deepspeed.py.)"""
import json

from conftest import chorusrun, real_deepspeed


def test_deepspeed_checkpoints_resume_in_chorus(tmp_path):
    real_deepspeed(2, "ds_checkpoint_resume.py", "save", tmp_path)
    want = json.loads((tmp_path / "saved.json").read_text())
    assert "/overlays/deepspeed/" in want["deepspeed"]
    want = want["results"]
    assert len(want) == 16
    # every case at DeepSpeed's 2 ranks; at 1 rank (another size: resharded) some of each kind
    at1 = "z0_bf16,z0_fp32_frozen,z1_fp32,z2_bf16,z3_fp32,z3_bf16_offload,z3_fp32_subgroups,z2_fp32_Lion_offload"
    for n in (2, 1):
        chorusrun(n, "ds_checkpoint_resume.py", "load", tmp_path, tmp_path / f"chorus{n}.json",
                  **({"CASES": at1} if n == 1 else {}))
        got = json.loads((tmp_path / f"chorus{n}.json").read_text())
        assert len(got["results"]) == (16 if n == 2 else 8), sorted(got["results"])
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

