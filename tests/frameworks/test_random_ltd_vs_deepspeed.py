"""Random-LTD's schedule and an engine with the section on, under chorus and under the
real DeepSpeed 0.19.8 (workers/random_ltd.py): the same kept lengths and consumed layer
tokens step by step, the same losses, the same schedule state after training."""
import json

from conftest import chorusrun, real_deepspeed


def test_random_ltd_schedule_equals_deepspeeds(tmp_path):
    real_deepspeed(1, "random_ltd.py", tmp_path / "deepspeed.json")
    chorusrun(1, "random_ltd.py", tmp_path / "chorus.json")
    want = json.loads((tmp_path / "deepspeed.json").read_text())
    got = json.loads((tmp_path / "chorus.json").read_text())
    assert got["schedule"] == want["schedule"]
    assert want["schedule"]["seq"][0] == 128 and want["schedule"]["seq"][-1] == 2048
    assert got["engine_schedule"] == want["engine_schedule"] and want["engine_schedule"]["current_steps"] == 3
    assert max(abs(a - b) for a, b in zip(got["losses"], want["losses"])) <= 1e-6
