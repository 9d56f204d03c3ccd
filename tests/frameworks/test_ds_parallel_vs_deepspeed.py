"""Tensor-parallel, pipeline and MoE checkpoints in DeepSpeed 0.19.8's layout, both ways, against
the real DeepSpeed (workers/ds_parallel_checkpoint.py): DeepSpeed saves at tp 2 x dp 2 (mp_rank_00
and mp_rank_01 files; ZeRO 0, 1 and 3), pp 2 x dp 2 (also layer_XX files) or ep 2 x dp 2 (layer_L_expert_E files,
expert groups in the ZeRO files, expp_rank_E without ZeRO); chorus loads each at that layout and
at others (tp 1 and 4, pp 1 and 4: slices joined and re-cut, stages re-cut by layer; ep 1 and 4 on
the same 4 ranks: experts re-placed) and its next 3 losses equal DeepSpeed's own resumed run's.
DeepSpeed's ds_to_universal output of its tp and pp saves loads in chorus at another layout too.
chorus saves in that layout (checkpoint.format "deepspeed"); DeepSpeed loads it and goes on as
chorus went on. (MoE at another rank count routes other batches: the function differs.)"""
import json

import pytest

from conftest import PYTHON, chorusrun, deepspeed_env, real_deepspeed, run


def _worst(got, want):
    return max(abs(a - b) for a, b in zip(got, want))


def _loads(kind, folder, out, n, size, want, cases=None, tol=1e-6, bf16_tol=1e-6, **extra):
    chorusrun(n, "ds_parallel_checkpoint.py", kind, "load", folder, out, size,
              **({"CASES": ",".join(cases)} if cases else {}), **extra)
    got = json.loads(out.read_text())
    assert "chorus" in got["deepspeed"]
    got = got["results"]
    assert sorted(got) == sorted(cases or want), (sorted(got), n, size)
    for key, result in got.items():
        assert "resumed" in result, (kind, n, size, key, result)
        assert result["client"] == 5 and result["global_steps"] == 6, (key, result)
        worst = _worst(result["resumed"], want[key]["continued"])
        assert worst <= (bf16_tol if "bf16" in key else tol), (kind, n, size, key, worst, result, want[key])


# (ranks, tensor-parallel / pipeline / expert-parallel size) to load at, the saved one first
LAYOUTS = {"tp": [(4, 2), (2, 1), (4, 4)], "pipe": [(4, 2), (2, 1), (4, 4)], "moe": [(4, 2), (4, 1), (4, 4)]}
FILES = {"tp": ("z1_bf16", ["mp_rank_01_model_states.pt", "bf16_zero_pp_rank_1_mp_rank_01_optim_states.pt"]),
         "pipe": ("z1_bf16", ["mp_rank_01_model_states.pt", "layer_06-model_states.pt"]),
         "moe": ("z0_fp32", ["expp_rank_1_mp_rank_00_optim_states.pt", "layer_0_expert_3_mp_rank_00_model_states.pt"])}


@pytest.mark.parametrize("kind", ["tp", "pipe", "moe"])
def test_model_parallel_checkpoints_travel_both_ways(tmp_path, kind):
    real_deepspeed(4, "ds_parallel_checkpoint.py", kind, "save", tmp_path / "ds")
    want = json.loads((tmp_path / "ds" / "saved.json").read_text())
    assert "/overlays/deepspeed/" in want["deepspeed"]
    want = want["results"]
    for key, result in want.items():
        assert result["resumed"] == result["continued"], key  # (DeepSpeed resumes exactly)
    case, names = FILES[kind]
    files = sorted(p.name for p in (tmp_path / "ds" / case / "global_step3").iterdir())
    assert all(n in files for n in names), files
    # chorus's ZeRO-3 runs without tensor parallelism: DeepSpeed's tp 2 ZeRO-3 save is joined at tp 1
    sliced = [k for k in want if k != "z3_bf16"]
    # at the saved layout: equal (but bf16 MoE's rounding); at another, gradients summed in another order
    (n, size), *others = LAYOUTS[kind]
    _loads(kind, tmp_path / "ds", tmp_path / "same.json", n, size, want, sliced, bf16_tol=1e-4)
    for n, size in others:
        _loads(kind, tmp_path / "ds", tmp_path / f"at{n}_{size}.json", n, size, want, sliced if size > 1 else None,
               tol=1e-5, bf16_tol=5e-4)
    if kind != "moe":  # DeepSpeed's ds_to_universal of its save (given Megatron's universal_checkpoint_info)
        run([PYTHON, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
             str(tmp_path / "ds" / "z1_bf16" / "global_step3"), "--output_folder",
             str(tmp_path / "uni" / "z1_bf16" / "global_step3_universal"), "--inject_missing_state"],
            **deepspeed_env())
        n, size = others[0]
        _loads(kind, tmp_path / "uni", tmp_path / "uni.json", n, size, want, ["z1_bf16"], bf16_tol=5e-4, UNIVERSAL="1")
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
        assert _worst(result["resumed"], saved[key]["continued"]) <= (5e-5 if "bf16" in key else 1e-6), \
            (key, result, saved[key])
