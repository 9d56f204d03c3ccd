"""deepspeed.runtime.lr_schedules with DeepSpeed's signatures, against the
schedules written out here from DeepSpeed's documented definitions."""
import math
import sys

import pytest
import torch

from conftest import BUILD  # noqa: F401  (puts build/python on sys.path)

from chorus.deepspeed.runtime import lr_schedules as ls  # noqa: E402


def opt(lr=0.1):
    return torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)


def run(s, steps):
    out = []
    for _ in range(steps):
        s.step()
        out.append(s.get_last_lr()[0])
    return out


def test_warmup_decay_linear():
    got = run(ls.WarmupDecayLR(opt(), total_num_steps=10, warmup_min_lr=0.0, warmup_max_lr=1.0,
                               warmup_num_steps=4, warmup_type="linear"), 10)
    want = [it / 4 if it < 4 else (10 - it) / (10 - 4) for it in range(10)]
    assert got == pytest.approx(want)


def test_warmup_log_then_flat():
    got = run(ls.WarmupLR(opt(), warmup_min_lr=0.1, warmup_max_lr=0.5, warmup_num_steps=8), 12)
    want = [0.1 + 0.4 * (math.log(it + 1) / math.log(8) if it < 8 else 1.0) for it in range(12)]
    assert got == pytest.approx(want)


def test_warmup_cosine():
    o = opt(2.0)
    got = run(ls.WarmupCosineLR(o, total_num_steps=20, warmup_min_ratio=0.1, warmup_num_steps=5,
                                cos_min_ratio=0.01, warmup_type="linear"), 20)
    want = []
    for it in range(20):
        if it < 5:
            ratio = 0.1 + 0.9 * it / 5
        else:
            ratio = 0.01 + 0.99 * (1 + math.cos(math.pi * (it - 5) / 15)) / 2
        want.append(2.0 * ratio)
    assert got == pytest.approx(want)
    with pytest.raises(ValueError):
        ls.WarmupCosineLR(opt(), total_num_steps=3, warmup_num_steps=5)


def test_lr_range_test_staircase():
    got = run(ls.LRRangeTest(opt(), lr_range_test_min_lr=0.01, lr_range_test_step_size=3,
                             lr_range_test_step_rate=2.0, lr_range_test_staircase=True), 7)
    want = [0.01 * (1 + 2.0 * math.floor(it / 3)) for it in range(7)]
    assert got == pytest.approx(want)


def test_one_cycle_lr_and_momentum():
    o = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=0.1)
    s = ls.OneCycle(o, cycle_min_lr=0.1, cycle_max_lr=1.0, cycle_first_step_size=4, decay_lr_rate=0.5,
                    decay_step_size=2, cycle_min_mom=0.8, cycle_max_mom=0.9)
    got, moms = [], []
    for _ in range(12):
        s.step()
        got.append(s.get_last_lr()[0])
        moms.append(o.param_groups[0]["betas"][0])
    want, want_mom = [], []
    for it in range(12):
        if it <= 8:  # up over 4 steps, down over 4
            x = it / 8
            scale = x / 0.5 if x <= 0.5 else (x - 1) / (0.5 - 1)
            want.append(0.1 + 0.9 * scale)
            want_mom.append(0.9 - 0.1 * scale)
        else:
            want.append(0.1 * (1 + 0.5 * (it - 8) / 2))
            want_mom.append(0.9)
    assert got == pytest.approx(want) and moms == pytest.approx(want_mom)


def test_valid_and_from_config():
    assert set(ls.VALID_LR_SCHEDULES) == {"LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}
    s = ls.from_config(opt(), {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 2}})
    assert isinstance(s, ls.WarmupCosineLR)
    with pytest.raises(ValueError, match="scheduler.params"):
        ls.from_config(opt(), {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "bogus": 1, "cycle_max_lr": 1}})
