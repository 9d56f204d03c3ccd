"""communication_data_type under every ZeRO stage on 2 ranks (workers/comm_dtype.py):
chorus against the real DeepSpeed 0.19.8 run of the same script.

An fp32 model reduced in bf16 or fp16 gives DeepSpeed's losses (stages 0-1 round the
accumulated gradient once per step, stages 2-3 each micro-batch's), and differs from
the fp32 reduction, so the rounding is really there; a bf16 model reduced in fp32 gives
DeepSpeed's losses. In both the bytes the reductions send follow the dtype. DeepSpeed's
bf16 model without ZeRO (its FP16_Optimizer in bf16) trains to other losses than its own
ZeRO-1 from the first step, at 1 rank as at 2 and with or without clipping, where
chorus's stage 0 and ZeRO-1 agree: that case is held to DeepSpeed's ZeRO-1."""
import json

from conftest import chorusrun, real_deepspeed

FP32_TOL, BF16_TOL = 1e-5, 1e-3


def worst(got, want):
    assert len(got) == len(want) == 24
    return max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, want))


def test_communication_dtype_equals_deepspeeds(tmp_path):
    real_deepspeed(2, "comm_dtype.py", tmp_path / "deepspeed.json")
    chorusrun(2, "comm_dtype.py", tmp_path / "chorus.json")
    want = json.loads((tmp_path / "deepspeed.json").read_text())
    got = json.loads((tmp_path / "chorus.json").read_text())
    assert "/overlays/deepspeed/" in want["deepspeed"] and "chorus" in got["deepspeed"]
    want, got = want["results"], got["results"]
    assert len(got) == len(want) == 20 and all("losses" in r for r in want.values()), want
    bad = []
    for key, result in got.items():
        assert "losses" in result, (key, result)
        ref_key = key.replace("stage 0", "stage 1") if key.startswith("stage 0 bf16") else key
        tol = BF16_TOL if " bf16 comm" in key else FP32_TOL
        if worst(result["losses"], want[ref_key]["losses"]) > tol:
            bad.append((key, worst(result["losses"], want[ref_key]["losses"])))
    assert not bad, f"{len(bad)} cases differ from DeepSpeed's: {bad}"

    for stage in range(4):
        base = f"stage {stage} fp32 comm model"
        for results in (want, got):
            # The rounding to bf16 changes the training, as DeepSpeed's does.
            assert worst(results[f"stage {stage} fp32 comm bf16"]["losses"], results[base]["losses"]) > 1e-4
            # Half the bytes in a 16-bit dtype, twice in fp32 for a bf16 model.
            full = results[base]["reduced_bytes"]
            assert full > 0
            for comm in ("bf16", "fp16"):
                assert results[f"stage {stage} fp32 comm {comm}"]["reduced_bytes"] * 2 == full, (stage, comm)
            assert results[f"stage {stage} bf16 comm model"]["reduced_bytes"] * 2 == full
            assert results[f"stage {stage} bf16 comm fp32"]["reduced_bytes"] == full
