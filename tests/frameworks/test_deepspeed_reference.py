"""deepspeed.runtime.lr_schedules against the real DeepSpeed 0.19.8: every
schedule's lr (and OneCycle's betas) after construction and after each of 300
steps, a resumed copy, an explicit step(7), and the engine's lr under a config's
"scheduler" section, from the same script under both."""
import json
import math
import os

from conftest import PYTHON, WORKERS, real_deepspeed, run


def differences(a, b, path=()):
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str):
        return [] if a == b else [(path, a, b)]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) else [(path, a, b)]
    if isinstance(a, dict) and isinstance(b, dict):
        if sorted(a) != sorted(b):
            return [(path, sorted(a), sorted(b))]
        return [d for k in a for d in differences(a[k], b[k], path + (k,))]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [(path, len(a), len(b))]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, path + (i,))]
    return [(path, a, b)]


def test_lr_schedules_equal_deepspeeds(tmp_path):
    script = os.path.join(WORKERS, "lr_values.py")
    # One process each; torch.distributed's variables for the real DeepSpeed's engine.
    real_deepspeed(1, "lr_values.py", tmp_path / "deepspeed.json")
    run([PYTHON, script, tmp_path / "chorus.json"])
    want = json.loads((tmp_path / "deepspeed.json").read_text())
    got = json.loads((tmp_path / "chorus.json").read_text())
    assert "/overlays/deepspeed/" in want["deepspeed"], want["deepspeed"]
    assert "chorus" in got["deepspeed"], got["deepspeed"]
    assert len(want["schedules"]) == 16 and len(want["engine"]) == 6
    diffs = differences(want["schedules"], got["schedules"]) + differences(want["engine"], got["engine"], ("engine",))
    assert not diffs, f"{len(diffs)} values differ from DeepSpeed's, the first: {diffs[:5]}"
