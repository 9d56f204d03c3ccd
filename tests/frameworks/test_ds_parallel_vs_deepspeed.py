"""Tensor- and pipeline-parallel checkpoints in DeepSpeed 0.19.8's layout, both ways, against
the real DeepSpeed (workers/ds_parallel_checkpoint.py): DeepSpeed saves at tp 2 x dp 2 (mp_rank_00
and mp_rank_01 files) or pp 2 x dp 2 (also layer_XX files); chorus loads each at that layout and
at others (tp 1 and 4, pp 1 and 4: slices joined and re-cut, stages re-cut by layer) and its next
3 losses equal DeepSpeed's own resumed run's. chorus saves in that layout (checkpoint.format
"deepspeed"); DeepSpeed loads it and goes on as chorus went on."""
import json

import pytest

from conftest import chorusrun, real_deepspeed


def _worst(got, want):
    return max(abs(a - b) for a, b in zip(got, want))


def _loads(kind, folder, out, n, size, want, cases=None, tol=1e-6, bf16_tol=1e-6):
    chorusrun(n, "ds_parallel_checkpoint.py", kind, "load", folder, out, size,
              **({"CASES": ",".join(cases)} if cases else {}))
    got = json.loads(out.read_text())
    assert "chorus" in got["deepspeed"]
    got = got["results"]
    assert sorted(got) == sorted(cases or want), (sorted(got), n, size)
    for key, result in got.items():
        assert "resumed" in result, (kind, n, size, key, result)
        assert result["client"] == 5 and result["global_steps"] == 6, (key, result)
        worst = _worst(result["resumed"], want[key]["continued"])
        assert worst <= (bf16_tol if "bf16" in key else tol), (kind, n, size, key, worst, result, want[key])


@pytest.mark.parametrize("kind", ["tp", "pipe"])
def test_model_parallel_checkpoints_travel_both_ways(tmp_path, kind):
    real_deepspeed(4, "ds_parallel_checkpoint.py", kind, "save", tmp_path / "ds")
    want = json.loads((tmp_path / "ds" / "saved.json").read_text())
    assert "/overlays/deepspeed/" in want["deepspeed"]
    want = want["results"]
    for key, result in want.items():
        assert result["resumed"] == result["continued"], key  # (DeepSpeed resumes exactly)
    files = sorted(p.name for p in (tmp_path / "ds" / "z1_bf16" / "global_step3").iterdir())
    assert "mp_rank_01_model_states.pt" in files and "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt" in files
    assert (kind == "pipe") == ("layer_06-model_states.pt" in files), files
    # chorus's ZeRO-3 runs without tensor parallelism: DeepSpeed's tp 2 ZeRO-3 save is joined at tp 1
    sliced = [k for k in want if k != "z3_bf16"]
    # at the saved layout: equal; at another, the gradients are summed in another order
    _loads(kind, tmp_path / "ds", tmp_path / "same.json", 4, 2, want, sliced)
    _loads(kind, tmp_path / "ds", tmp_path / "one.json", 2, 1, want, tol=1e-5, bf16_tol=5e-4)
    _loads(kind, tmp_path / "ds", tmp_path / "four.json", 4, 4, want, sliced, tol=1e-5, bf16_tol=5e-4)
    # the reverse: chorus saves in DeepSpeed's layout, DeepSpeed goes on from it
    chorusrun(4, "ds_parallel_checkpoint.py", kind, "save", tmp_path / "chorus", CASES=",".join(sliced))
    saved = json.loads((tmp_path / "chorus" / "saved.json").read_text())["results"]
    assert sorted(saved) == sorted(sliced)
    for key, result in saved.items():
        assert _worst(result["resumed"], result["continued"]) <= 1e-6, (key, result)
        assert _worst(result["continued"], want[key]["continued"]) <= (5e-4 if "bf16" in key else 1e-5), key
    real_deepspeed(4, "ds_parallel_checkpoint.py", kind, "load", tmp_path / "chorus", tmp_path / "back.json", 2,
                   env_extra={"CASES": ",".join(sliced)})
    back = json.loads((tmp_path / "back.json").read_text())
    assert "/overlays/deepspeed/" in back["deepspeed"]
    for key, result in back["results"].items():
        assert "resumed" in result, (key, result)
        assert result["client"] == 5 and result["global_steps"] == 6, (key, result)
        assert _worst(result["resumed"], saved[key]["continued"]) <= 1e-6, (key, result, saved[key])
    # and chorus re-cuts its own save
    _loads(kind, tmp_path / "chorus", tmp_path / "own.json", 2, 1, saved, sliced, tol=1e-5, bf16_tol=5e-4)
