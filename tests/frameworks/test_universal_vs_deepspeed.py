"""DeepSpeed's universal checkpoints, both ways, on the cases of workers/ds_checkpoint_resume.py
(saved at 2 ranks): the folders the real DeepSpeed's ds_to_universal makes of its own saves load
in chorus at 1 rank (checkpoint.load_universal) and train on as DeepSpeed's resumed run;
`python -m chorus.deepspeed.checkpoint universal` of chorus's saves loads in the real DeepSpeed
at 1 rank and in chorus at 1 rank, and both train on as chorus went on. (Tensor-parallel
resharding through universal checkpoints: tests/python/workers/universal_tp.py.)"""
import json

from conftest import PYTHON, chorusrun, deepspeed_env, real_deepspeed, run

TOL = {"fp32": 1e-5, "bf16": 1e-4}  # (1 rank against 2: the gradients are summed in another order)


def tol(key):
    return TOL["bf16" if "bf16" in key else "fp32"]


def folder(key):
    return key.replace("stage ", "z").replace(" ", "_")


def check(results, want, field, skip=()):
    for key, result in results.items():
        if key in skip:
            continue
        assert "resumed" in result, (key, result)
        assert result["client"] == 5 and result["global_steps"] == 6, (key, result)
        worst = max(abs(a - b) for a, b in zip(result["resumed"], want[key][field]))
        assert worst <= tol(key), (key, worst)


# (a few of the worker's cases: ZeRO 1-3, bf16, offload, frozen and sub-groups; the rest in the other files)
FROM_DEEPSPEED = "z1_fp32,z2_bf16_frozen,z3_bf16_offload,z3_fp32_subgroups"
FROM_CHORUS = "z0_fp32,z1_bf16,z2_fp32_Lion_offload,z3_fp32,z3_fp32_Lion_offload,z2_bf16_frozen"


def test_deepspeeds_universal_checkpoints_load_in_chorus(tmp_path):
    real_deepspeed(2, "ds_checkpoint_resume.py", "save", tmp_path / "ds", env_extra={"CASES": FROM_DEEPSPEED})
    want = json.loads((tmp_path / "ds" / "saved.json").read_text())["results"]
    # ds_to_universal takes ZeRO 1-3 checkpoints of Adam's state (its own limits)
    cases = list(want)
    assert len(cases) == 4 and not any(k.startswith("stage 0") or "Lion" in k or "Adagrad" in k for k in cases)
    for key in cases:
        run([PYTHON, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
             str(tmp_path / "ds" / folder(key) / "global_step3"), "--output_folder",
             str(tmp_path / "uni" / folder(key) / "global_step3_universal"), "--inject_missing_state"],
            **deepspeed_env())
    chorusrun(1, "ds_checkpoint_resume.py", "load", tmp_path / "uni", tmp_path / "chorus1.json", UNIVERSAL="1",
              CASES=FROM_DEEPSPEED)
    check(json.loads((tmp_path / "chorus1.json").read_text())["results"], want, "resumed")


def test_chorus_universal_checkpoints_load_in_deepspeed_and_chorus(tmp_path):
    src = tmp_path / "src"
    chorusrun(2, "ds_checkpoint_resume.py", "save", src, CKPT_FORMAT="chorus", CASES=FROM_CHORUS)
    want = json.loads((src / "saved.json").read_text())["results"]
    keys = list(want)
    assert len(keys) == 6
    out = run([PYTHON, "-m", "chorus.deepspeed.checkpoint", "universal", src / folder(keys[0]),
               tmp_path / "uni" / folder(keys[0])])
    assert "universal layout" in out, out
    run([PYTHON, "-c", "import sys; from chorus.deepspeed.checkpoint.__main__ import to_universal\n"
         "for case in sys.argv[3:]:\n    to_universal(f'{sys.argv[1]}/{case}', f'{sys.argv[2]}/{case}')",
         str(src), str(tmp_path / "uni"), *[folder(k) for k in keys[1:]]])
    chorusrun(1, "ds_checkpoint_resume.py", "load", tmp_path / "uni", tmp_path / "chorus1.json", UNIVERSAL="1",
              CASES=FROM_CHORUS)
    check(json.loads((tmp_path / "chorus1.json").read_text())["results"], want, "continued")
    real_deepspeed(1, "ds_checkpoint_resume.py", "load", tmp_path / "uni", tmp_path / "deepspeed1.json",
                   env_extra={"UNIVERSAL": "1", "CASES": FROM_CHORUS})
    got = json.loads((tmp_path / "deepspeed1.json").read_text())["results"]
    # DeepSpeed's universal loading needs ZeRO, and at stage 3 Adam's two moments
    skip = [k for k in got if k.startswith("stage 0") or (k.startswith("stage 3") and "Lion" in k)]
    assert all("error" in got[k] for k in skip), {k: got[k] for k in skip}
    check(got, want, "continued", skip)
