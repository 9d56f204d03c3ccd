"""PyTorch's distributed checkpoint (DCP) both ways (workers/dcp_roundtrip.py): a plain torch
AdamW run saved with dcp.save as torchtitan/FSDP2 code saves it ({"model", "optimizer"}) loads
in chorus at 2 ranks (ZeRO 0, 2, 3; fp32 and bf16) and trains on to the plain run's losses; a
plain model's dcp.save(model.state_dict()) gives chorus its weights; chorus's own DCP saves
(checkpoint.format "dcp", 2 ranks) resume in chorus, and in one plain process torch's
dcp_to_torch_save and dcp.load give the module chorus had, and torch's AdamW, loaded from
them, trains on to chorus's losses."""
import json

from conftest import chorusrun, single

FP32_TOL, BF16_TOL = 1e-6, 3e-3  # (bf16: chorus computes in bf16, the plain process in fp32)


def close(a, b, key):
    tol = BF16_TOL if "bf16" in key else FP32_TOL
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert len(a) == len(b) == 3 and worst <= tol, (key, worst, a, b)


def test_torch_dcp_loads_in_chorus(tmp_path):
    single("dcp_roundtrip.py", "plain-save", tmp_path)
    want = json.loads((tmp_path / "plain.json").read_text())["continued"]
    chorusrun(2, "dcp_roundtrip.py", "chorus-load", tmp_path, tmp_path / "chorus.json")
    got = json.loads((tmp_path / "chorus.json").read_text())
    assert len(got) == 4
    for key, result in got.items():
        assert result["plain_weights_equal"], key
        assert result["optimizer_steps"] == 6, (key, result)  # torch's step 3, and 3 more
        close(result["resumed"], want, key)


def test_chorus_dcp_reads_in_torch(tmp_path):
    chorusrun(2, "dcp_roundtrip.py", "chorus-save", tmp_path)
    saved = json.loads((tmp_path / "chorus.json").read_text())
    for key, result in saved.items():
        assert result["client"] == 4 and result["global_steps"] == 6, (key, result)
        assert result["resumed"] == result["continued"], key
    single("dcp_roundtrip.py", "plain-read", tmp_path, chorus=False)
    read = json.loads((tmp_path / "plain_read.json").read_text())
    assert len(read) == 4
    for key, result in read.items():
        assert result["converted_equal"] and result["loaded_equal"], key
        close(result["continued"], result["chorus_continued"], key)
