"""chorus's ZenFlow: a checkpoint resumes onto the same losses and parameters as a run
straight through (overlapped and sequential), and the configs it cannot run are refused
by name (workers/zenflow_resume.py, 2 ranks)."""
import json

from conftest import chorusrun


def test_zenflow_resumes_and_refuses(tmp_path):
    chorusrun(2, "zenflow_resume.py", tmp_path / "out.json", tmp_path / "ckpt")
    out = json.loads((tmp_path / "out.json").read_text())
    for variant in ("overlap=True", "overlap=False"):
        r = out[variant]
        assert len(r["resumed"]) == 20 and r["resumed"] == r["straight"], (variant, r)
        assert r["resumed_params"] == r["straight_params"], variant
    # The two schedules train differently (the overlapped result lands a boundary later).
    assert out["overlap=True"]["straight_params"] != out["overlap=False"]["straight_params"]
    refused = out["refused"]
    expect = {"auto": "zenflow.update_interval", "topk": "zenflow.topk_ratio", "select-short": "select_interval",
              "fp16": "fp16", "stage3": "stage 3", "no-offload": "offload_optimizer.device", "conv": "'0.weight'",
              "warm-up": "full_warm_up_rounds", "not-a-number": "update_interval"}
    for name, words in expect.items():
        assert refused[name] is not None and words in refused[name], (name, refused[name])
