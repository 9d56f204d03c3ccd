"""deepspeed.runtime.lr_schedules under Debian's torch 1.13: the errors and the
plumbing. Their values are checked against DeepSpeed itself, step for step, in
tests/frameworks/test_deepspeed_reference.py."""
import pytest
import torch

from conftest import BUILD  # noqa: F401  (puts build/python on sys.path)

from chorus.deepspeed.runtime import lr_schedules as ls  # noqa: E402


def opt(lr=0.1, groups=1):
    return torch.optim.SGD([{"params": [torch.zeros(1, requires_grad=True)]} for _ in range(groups)], lr=lr)


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="warmup_num_steps must be a positive integer"):
        ls.WarmupLR(opt(), warmup_num_steps=0)
    with pytest.raises(ValueError, match="lr_range_test_step_size must be a positive integer"):
        ls.LRRangeTest(opt(), lr_range_test_step_size=2.5)
    with pytest.raises(ValueError, match="cycle_first_step_size must be positive"):
        ls.OneCycle(opt(), 0.1, 1.0, cycle_first_step_size=0)
    with pytest.raises(ValueError, match=r"cycle_max_lr: expected 2 values \(one per param group\), got 3"):
        ls.OneCycle(opt(groups=2), 0.1, [1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="has no param_groups"):
        ls.WarmupLR(object())


def test_tensor_lrs_are_filled_in_place():
    o = opt()
    o.param_groups[0]["lr"] = torch.tensor(0.1)
    lr = o.param_groups[0]["lr"]
    s = ls.WarmupLR(o, warmup_min_lr=0.0, warmup_max_lr=1.0, warmup_num_steps=4, warmup_type="linear")
    s.step()
    s.step()
    assert o.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.25)


def test_valid_and_from_config():
    assert set(ls.VALID_LR_SCHEDULES) == {"LRRangeTest", "OneCycle", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"}
    s = ls.from_config(opt(), {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_num_steps": 2}})
    assert isinstance(s, ls.WarmupCosineLR)
    with pytest.raises(ValueError, match="scheduler.params"):
        ls.from_config(opt(), {"type": "OneCycle", "params": {"cycle_min_lr": 0.1, "bogus": 1, "cycle_max_lr": 1}})
    with pytest.raises(ValueError, match="'scheduler.type' 'Cosine'"):
        ls.from_config(opt(), {"type": "Cosine"})
