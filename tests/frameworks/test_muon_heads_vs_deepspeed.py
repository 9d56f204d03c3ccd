"""per_head_muon (workers/muon_heads.py, 2 ranks): at ZeRO stages 1-2 chorus trains to
DeepSpeed 0.19.8's losses with it on and off, and it changes the training in both. Without
ZeRO, DeepSpeed 0.19.8's Muon (MuonWithAuxAdam) never passes the head counts on, so its
losses are the same with and without the option; chorus splits the heads there too, and
its whole-matrix run is DeepSpeed's. A per-head update is each head's block orthogonalized
on its own, with one head's aspect ratio. A model with no attention to split is refused."""
import json

from conftest import chorusrun, real_deepspeed

FP32_TOL, BF16_TOL = 1e-6, 3e-3


def worst(a, b):
    assert len(a) == len(b) == 12
    return max(abs(x - y) / max(1.0, abs(y)) for x, y in zip(a, b))


def test_per_head_muon_equals_deepspeeds(tmp_path):
    real_deepspeed(2, "muon_heads.py", tmp_path / "ds.json")
    chorusrun(2, "muon_heads.py", tmp_path / "ch.json")
    want, got = (json.loads((tmp_path / f).read_text()) for f in ("ds.json", "ch.json"))
    assert "/overlays/deepspeed/" in want["deepspeed"] and "chorus" in got["deepspeed"]
    want, got = want["results"], got["results"]
    for key in got:
        if key == "untaggable" or key.startswith("stage 0 ") and "per_head=True" in key:
            continue
        tol = FP32_TOL if " fp32 " in key else BF16_TOL
        assert worst(got[key]["losses"], want[key]["losses"]) <= tol, (key, got[key], want[key])
    for results in (want, got):
        assert worst(results["stage 1 fp32 per_head=True"]["losses"],
                     results["stage 1 fp32 per_head=False"]["losses"]) > 1e-6
    on, off = "stage 0 fp32 per_head=True", "stage 0 fp32 per_head=False"
    assert want[on]["losses"] == want[off]["losses"]  # (DeepSpeed's stage 0 drops the option)
    assert worst(got[on]["losses"], got[off]["losses"]) > 1e-6
    for results in (want, got):
        assert "per_head_muon" in results["untaggable"]["error"]

