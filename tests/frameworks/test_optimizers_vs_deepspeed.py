"""The config's Lion, Adagrad and LAMB under every ZeRO stage, fp32 and bf16, with and
without offload_optimizer, on 2 ranks for 20 steps (workers/optimizer_matrix.py):
chorus against the real DeepSpeed 0.19.8 run of the same script.

Where DeepSpeed trains a case on this CPU, chorus's losses equal its own. DeepSpeed's
FusedLion and FusedLamb are GPU kernels ("not implemented on CPU backend"), and its bf16
optimizer breaks torch's Adagrad at stage 0 (KeyError 'sum'): there chorus still trains,
and Lion is held to DeepSpeed's CPU Lion run of the same dtype (the update does not depend
on the ZeRO stage), LAMB to a float64 reference of FusedLamb's update.

Muon (its default Newton-Schulz, "gram", which runs in fp32 on this CPU, and "standard",
in bf16) at stages 0-2 equals DeepSpeed's; DeepSpeed refuses it at stage 3 ("Muon and
reduce scatter cannot be used together"), where chorus's, which orthogonalizes each
matrix's whole gradient as at stages 1-2, is held to DeepSpeed's stage 2."""
import json

from conftest import WORKERS, chorusrun, real_deepspeed, single

FP32_TOL, BF16_TOL = 1e-5, 1e-3


def close(got, want, tol):
    assert len(got) == len(want) == 20
    worst = max(abs(a - b) / max(1.0, abs(b)) for a, b in zip(got, want))
    return worst <= tol, worst


def test_optimizers_equal_deepspeeds(tmp_path):
    real_deepspeed(2, "optimizer_matrix.py", tmp_path / "deepspeed.json", "Lion", "Adagrad")
    chorusrun(2, "optimizer_matrix.py", tmp_path / "chorus.json", "Lion", "Adagrad", "Lamb")
    single("optimizer_matrix.py", tmp_path / "lamb.json", "--lamb-reference", chorus=False)
    want = json.loads((tmp_path / "deepspeed.json").read_text())
    got = json.loads((tmp_path / "chorus.json").read_text())
    assert "/overlays/deepspeed/" in want["deepspeed"] and "chorus" in got["deepspeed"]
    want, got = want["results"], got["results"]
    lamb = json.loads((tmp_path / "lamb.json").read_text())["losses"]

    trained_by_deepspeed = [k for k, v in want.items() if "losses" in v]
    # What DeepSpeed trains here: Lion with offload (its CPU Lion), Adagrad but bf16 at stage 0.
    assert len(trained_by_deepspeed) == 6 + 13, sorted(want)
    bad = []
    for key, result in got.items():
        assert "losses" in result, (key, result)
        tol = BF16_TOL if "bf16" in key else FP32_TOL
        if key in trained_by_deepspeed:
            ref = want[key]["losses"]
        elif key.startswith("Lion"):  # DeepSpeed's CPU Lion of the same dtype at stage 1
            ref = want[f"Lion stage 1 {'bf16' if 'bf16' in key else 'fp32'} offload"]["losses"]
        elif key.startswith("Adagrad"):  # bf16 at stage 0: DeepSpeed's bf16 Adagrad at stage 1
            ref = want["Adagrad stage 1 bf16"]["losses"]
        else:
            ref, tol = lamb, (2e-3 if "bf16" in key else FP32_TOL)
        ok, worst = close(result["losses"], ref, tol)
        if not ok:
            bad.append((key, worst))
    assert not bad, f"{len(bad)} cases differ: {bad}"
    assert len(got) == 3 * 14


MUON_TOL = 3e-3  # bf16 models, and "standard"'s bf16 iteration: DeepSpeed's own stages differ by 1e-4


def test_muon_equals_deepspeeds(tmp_path):
    real_deepspeed(2, "optimizer_matrix.py", tmp_path / "deepspeed.json", "Muon", "Muon-standard")
    chorusrun(2, "optimizer_matrix.py", tmp_path / "chorus.json", "Muon", "Muon-standard")
    want = json.loads((tmp_path / "deepspeed.json").read_text())["results"]
    got = json.loads((tmp_path / "chorus.json").read_text())["results"]
    assert len(got) == len(want) == 2 * 14
    bad = []
    for key, result in got.items():
        assert "losses" in result, (key, result)
        if " stage 3 " in key:
            assert "reduce scatter" in want[key]["error"], want[key]
            key_ref = key.replace("stage 3", "stage 2")
        else:
            key_ref = key
        tol = FP32_TOL if key.startswith("Muon stage") and "fp32" in key else MUON_TOL
        ok, worst = close(result["losses"], want[key_ref]["losses"], tol)
        if not ok:
            bad.append((key, worst))
    assert not bad, f"{len(bad)} cases differ: {bad}"
