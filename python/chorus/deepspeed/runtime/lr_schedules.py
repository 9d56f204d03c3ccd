"""deepspeed.runtime.lr_schedules: DeepSpeed's learning-rate schedules, with their
signatures. WarmupLR and WarmupDecayLR are computed by chorus's C++ core (the same
function the engine uses for a config's scheduler section)."""
import json
import math

from chorus import _core

LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]


def _per_group(optimizer, value, name):
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{name}: expected {len(optimizer.param_groups)} values (one per param group), "
                             f"got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


class _Schedule:
    """step() / get_lr() / get_last_lr() / state_dict() as DeepSpeed's schedules have them."""

    def __init__(self, optimizer, last_batch_iteration):
        self.optimizer = optimizer
        self.last_batch_iteration = last_batch_iteration

    def step(self, last_batch_iteration=None):
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None \
            else last_batch_iteration
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def get_last_lr(self):
        if not hasattr(self, "_last_lr"):
            raise RuntimeError("get_last_lr: call step() first")
        return list(self._last_lr)

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd):
        self.last_batch_iteration = sd["last_batch_iteration"]
        if self.last_batch_iteration >= 0:
            for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
                group["lr"] = lr
            self._last_lr = [g["lr"] for g in self.optimizer.param_groups]


class WarmupLR(_Schedule):
    """From warmup_min_lr to warmup_max_lr over warmup_num_steps (log or linear), then flat."""
    _type = WARMUP_LR

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps=1000,
                 warmup_type="log", last_batch_iteration=-1, total_num_steps=0):
        super().__init__(optimizer, last_batch_iteration)
        self._params = dict(warmup_min_lr=warmup_min_lr, warmup_max_lr=warmup_max_lr,
                            warmup_num_steps=warmup_num_steps, warmup_type=warmup_type)
        if self._type == WARMUP_DECAY_LR:
            self._params["total_num_steps"] = total_num_steps
        self._config = json.dumps({"train_batch_size": 1, "scheduler": {"type": self._type, "params": self._params}})
        if last_batch_iteration == -1:
            for g in optimizer.param_groups:
                g["lr"] = warmup_min_lr

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return [0.0]
        lr = _core.scheduled_lr(self._config, 1, self.last_batch_iteration)
        return [lr] * len(self.optimizer.param_groups)


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then a linear decay to 0 at total_num_steps."""
    _type = WARMUP_DECAY_LR

    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps=1000,
                 warmup_type="log", last_batch_iteration=-1):
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration, total_num_steps=total_num_steps)


class WarmupCosineLR(_Schedule):
    """A ratio of each group's starting lr: from warmup_min_ratio to 1 over
    warmup_num_steps (log or linear), then a cosine down to cos_min_ratio at total_num_steps."""

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                 cos_min_ratio=0.0001, warmup_type="log", last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        if total_num_steps < warmup_num_steps:
            raise ValueError(f"WarmupCosineLR: total_num_steps {total_num_steps} is less than warmup_num_steps "
                             f"{warmup_num_steps}")
        if warmup_type not in ("log", "linear"):
            raise ValueError(f"WarmupCosineLR: warmup_type '{warmup_type}' is not log or linear")
        self.total_num_steps, self.warmup_num_steps = total_num_steps, max(2, warmup_num_steps)
        self.warmup_min_ratio, self.cos_min_ratio, self.warmup_type = warmup_min_ratio, cos_min_ratio, warmup_type
        self.org_lrs = [g["lr"] for g in optimizer.param_groups]

    def _ratio(self):
        it = self.last_batch_iteration
        if it < 0:
            return 0.0
        if it < self.warmup_num_steps:
            gamma = (math.log(it + 1) / math.log(self.warmup_num_steps) if self.warmup_type == "log"
                     else it / self.warmup_num_steps)
            return self.warmup_min_ratio + (1.0 - self.warmup_min_ratio) * gamma
        span = max(1, self.total_num_steps - self.warmup_num_steps)
        cosine = (1 + math.cos(math.pi * min(1.0, (it - self.warmup_num_steps) / span))) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self):
        return [lr * self._ratio() for lr in self.org_lrs]


class LRRangeTest(_Schedule):
    """lr = min_lr * (1 + step_rate * interval), the interval continuous or in stairs of step_size."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False, last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        self.min_lr = _per_group(optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        self.step_size, self.step_rate, self.staircase = lr_range_test_step_size, lr_range_test_step_rate, \
            lr_range_test_staircase
        if last_batch_iteration == -1:
            for g, lr in zip(optimizer.param_groups, self.min_lr):
                g["lr"] = lr

    def get_lr(self):
        interval = self.last_batch_iteration / self.step_size
        if self.staircase:
            interval = math.floor(interval)
        return [lr * (1 + self.step_rate * interval) for lr in self.min_lr]


class OneCycle(_Schedule):
    """One triangle from cycle_min_lr up to cycle_max_lr (first step size) and back
    (second step size), momentum (beta1) moving the other way, then lr decaying by
    decay_lr_rate per decay_step_size."""

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0, cycle_first_step_size=2000,
                 cycle_second_step_size=None, cycle_first_stair_count=0, cycle_second_stair_count=None,
                 decay_step_size=0, cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.0,
                 last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        self.total_size, self.step_ratio = first + second, first / (first + second)
        self.decay_step_size = decay_step_size
        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.decay_lr_rate = decay_lr_rate
        self.cycle_momentum = cycle_momentum and all("betas" in g for g in optimizer.param_groups)
        self.min_mom, self.max_mom, self.decay_mom_rate = cycle_min_mom, cycle_max_mom, decay_mom_rate
        if last_batch_iteration == -1:
            for g, lr in zip(optimizer.param_groups, self.min_lrs):
                g["lr"] = lr
                if self.cycle_momentum:
                    g["betas"] = (cycle_min_mom, g["betas"][1])

    def _set_momentum(self, beta1):
        if self.cycle_momentum:
            for g in self.optimizer.param_groups:
                g["betas"] = (beta1, g["betas"][1])

    def get_lr(self):
        it = self.last_batch_iteration
        if it <= self.total_size:
            x = it / self.total_size - math.floor(it / self.total_size) if it < self.total_size else 1.0
            scale = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
            self._set_momentum(self.max_mom - (self.max_mom - self.min_mom) * scale)
            return [lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs)]
        interval = (it - self.total_size) / self.decay_step_size if self.decay_step_size else 0.0
        self._set_momentum(self.max_mom * (1 + self.decay_mom_rate * interval))
        return [lo * (1 + self.decay_lr_rate * interval) for lo in self.min_lrs]


_BY_NAME = {c.__name__: c for c in (WarmupLR, WarmupDecayLR, WarmupCosineLR, LRRangeTest, OneCycle)}


def from_config(optimizer, section):
    """The schedule a config's "scheduler" section names."""
    kind = section.get("type")
    if kind not in _BY_NAME:
        raise ValueError(f"DeepSpeed config: 'scheduler.type' {kind!r} is not one of {VALID_LR_SCHEDULES}")
    try:
        return _BY_NAME[kind](optimizer, **section.get("params", {}))
    except TypeError as e:
        raise ValueError(f"DeepSpeed config: 'scheduler.params' for {kind}: {e}") from None
