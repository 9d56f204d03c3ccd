"""deepspeed.runtime.lr_schedules: DeepSpeed's learning-rate schedules with their
signatures and their numbers. Each schedule counts scheduler steps in
last_batch_iteration (-1 before the first step); step() advances it and writes the
new lr into every param group. Checked value for value against DeepSpeed 0.19.8
(tests/frameworks/test_deepspeed_reference.py)."""
import logging
import math

import torch

logger = logging.getLogger("chorus.deepspeed")

LR_RANGE_TEST = "LRRangeTest"
ONE_CYCLE = "OneCycle"
WARMUP_LR = "WarmupLR"
WARMUP_DECAY_LR = "WarmupDecayLR"
WARMUP_COSINE_LR = "WarmupCosineLR"
VALID_LR_SCHEDULES = [LR_RANGE_TEST, ONE_CYCLE, WARMUP_LR, WARMUP_DECAY_LR, WARMUP_COSINE_LR]
WARMUP_LOG_RATE = "log"
WARMUP_LINEAR_RATE = "linear"
# OneCycle writes its momentum as beta1 with this beta2, as DeepSpeed does.
_ONE_CYCLE_BETA2 = 0.99


def update_lr(param_groups, lrs):
    """Writes lrs into the groups (in place where a group's lr is a tensor); returns the groups' lrs."""
    for group, lr in zip(param_groups, lrs):
        if torch.is_tensor(group["lr"]):
            group["lr"].fill_(lr.squeeze() if torch.is_tensor(lr) else lr)
        else:
            group["lr"] = lr
    return [group["lr"] for group in param_groups]


def get_torch_optimizer(optimizer):
    """The optimizer whose param_groups a schedule drives: optimizer itself, or the
    one a wrapper holds in .optimizer."""
    if hasattr(optimizer, "param_groups"):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and hasattr(inner, "param_groups"):
        return inner
    raise TypeError(f"{type(optimizer).__name__} is not an optimizer (it has no param_groups)")


def _per_group(optimizer, value, name):
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{name}: expected {len(optimizer.param_groups)} values (one per param group), "
                             f"got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _warmup_type(kind):
    if kind not in (WARMUP_LOG_RATE, WARMUP_LINEAR_RATE):
        logger.warning(f"warmup_type {kind!r} is neither 'log' nor 'linear': using 'log'")
        return WARMUP_LOG_RATE
    return kind


def _warmup_fraction(it, warmup_steps, kind):
    """How far through the warmup step `it` is: log(it + 1) / log(W) or it / W."""
    return math.log(it + 1) / math.log(warmup_steps) if kind == WARMUP_LOG_RATE else it / warmup_steps


class _Schedule:
    """step() / get_last_lr() / state_dict() as DeepSpeed's schedules have them."""

    def __init__(self, optimizer, last_batch_iteration):
        self.optimizer = get_torch_optimizer(optimizer)
        self.last_batch_iteration = last_batch_iteration

    def step(self, last_batch_iteration=None):
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None \
            else last_batch_iteration
        self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())

    def get_last_lr(self):
        if getattr(self, "_last_lr", None) is None:
            raise RuntimeError(f"{type(self).__name__}.get_last_lr: call step() first")
        return self._last_lr

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd):
        # The groups' lrs come back with the optimizer's own state; the next step() sets them anew.
        self.last_batch_iteration = sd["last_batch_iteration"]


class WarmupLR(_Schedule):
    """From warmup_min_lr to warmup_max_lr (default: each group's lr) over
    warmup_num_steps (log or linear), then flat."""

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=None, warmup_num_steps=1000,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        _positive_int(warmup_num_steps, "warmup_num_steps")
        super().__init__(optimizer, last_batch_iteration)
        if warmup_max_lr is None:
            warmup_max_lr = [g["lr"] for g in self.optimizer.param_groups]
        self.min_lrs = _per_group(self.optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(self.optimizer, warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [hi - lo for hi, lo in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = _warmup_type(warmup_type)
        if last_batch_iteration == -1:
            self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())

    def _gamma(self):
        it = self.last_batch_iteration
        return _warmup_fraction(it, self.warmup_num_steps, self.warmup_type) if it < self.warmup_num_steps else 1.0

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)
        gamma = self._gamma()
        return [lo + delta * gamma for lo, delta in zip(self.min_lrs, self.delta_lrs)]


class WarmupDecayLR(WarmupLR):
    """WarmupLR, then a linear decay that reaches 0 at total_num_steps."""

    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps=1000,
                 warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)
        if total_num_steps < self.warmup_num_steps:
            logger.warning(f"WarmupDecayLR: total_num_steps {total_num_steps} is less than warmup_num_steps "
                           f"{warmup_num_steps}")

    def _gamma(self):
        it = self.last_batch_iteration
        if it < self.warmup_num_steps:
            return _warmup_fraction(it, self.warmup_num_steps, self.warmup_type)
        return max(0.0, (self.total_num_steps - it) / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(_Schedule):
    """A ratio of each group's starting lr: from warmup_min_ratio to 1 over
    warmup_num_steps (log or linear), then a cosine down to cos_min_ratio, reached
    total_num_steps - 1 steps after the start and held from then on."""

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                 cos_min_ratio=0.0001, warmup_type=WARMUP_LOG_RATE, last_batch_iteration=-1):
        _positive_int(warmup_num_steps, "warmup_num_steps")
        super().__init__(optimizer, last_batch_iteration)
        self.total_num_steps = total_num_steps
        self.cos_min_ratio, self.warmup_min_ratio = cos_min_ratio, warmup_min_ratio
        self.warmup_type = _warmup_type(warmup_type)
        self.warmup_num_steps = max(2, warmup_num_steps)
        if total_num_steps < self.warmup_num_steps:
            logger.warning(f"WarmupCosineLR: total_num_steps {total_num_steps} is less than warmup_num_steps "
                           f"{warmup_num_steps}")
        self.org_lrs = [g["lr"].clone() if torch.is_tensor(g["lr"]) else g["lr"] for g in self.optimizer.param_groups]
        if last_batch_iteration == -1:
            self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())

    def get_lr_ratio(self):
        it = self.last_batch_iteration
        if it < 0:
            return 0.0
        if it < self.warmup_num_steps:
            frac = _warmup_fraction(it, self.warmup_num_steps, self.warmup_type)
            return self.warmup_min_ratio + frac * (1.0 - self.warmup_min_ratio)
        # The first step after the warmup is already one step into the cosine.
        progress = min(1.0, (it - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps))
        cosine = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * cosine)

    def get_lr(self):
        if self.last_batch_iteration < 0:
            return [0.0] * len(self.org_lrs)
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]


class LRRangeTest(_Schedule):
    """lr = min_lr * (1 + step_rate * interval), interval = (steps taken) / step_size,
    continuous or floored to stairs."""

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False, last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        self.min_lr = _per_group(self.optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        _positive_int(lr_range_test_step_size, "lr_range_test_step_size")
        self.step_size, self.step_rate = lr_range_test_step_size, lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        if last_batch_iteration == -1:
            self._last_lr = update_lr(self.optimizer.param_groups, self.min_lr)

    def _interval(self):
        interval = (self.last_batch_iteration + 1) / self.step_size
        return math.floor(interval) if self.staircase else interval

    def get_lr(self):
        increase = 1 + self.step_rate * self._interval()
        return [lr * increase for lr in self.min_lr]


class OneCycle(_Schedule):
    """One cycle from cycle_min_lr up to cycle_max_lr over cycle_first_step_size steps
    and back over cycle_second_step_size (optionally in stairs), beta1 moving the
    other way between cycle_max_mom and cycle_min_mom; then lr = min_lr / (1 + rate *
    steps_since / decay_step_size) and beta1 = max_mom * (1 + mom_rate * ...)."""

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0, cycle_first_step_size=2000,
                 cycle_second_step_size=None, cycle_first_stair_count=0, cycle_second_stair_count=None,
                 decay_step_size=0, cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.0,
                 last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration)
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        if first <= 0:
            raise ValueError(f"cycle_first_step_size must be positive, got {cycle_first_step_size}")
        if second < 0:
            raise ValueError(f"cycle_second_step_size must be non-negative, got {cycle_second_step_size}")
        self.first_step_size, self.second_step_size = first, second
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_stair_count = cycle_first_stair_count
        self.second_stair_count = cycle_first_stair_count if cycle_second_stair_count is None \
            else cycle_second_stair_count
        self.decay_step_size = decay_step_size
        no_decay = math.isclose(decay_step_size, 0)
        groups = self.optimizer.param_groups
        self.min_lrs = _per_group(self.optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(self.optimizer, cycle_max_lr, "cycle_max_lr")
        if last_batch_iteration == -1:
            update_lr(groups, self.min_lrs)
        self.decay_lr_rate = decay_lr_rate
        self.skip_lr_decay = no_decay or math.isclose(decay_lr_rate, 0)
        self.skip_mom_decay = no_decay
        defaults = getattr(self.optimizer, "defaults", None) or {}
        self.cycle_momentum = cycle_momentum and "betas" in defaults
        if cycle_momentum and not self.cycle_momentum:
            logger.warning(f"OneCycle: cycle_momentum is off: {type(self.optimizer).__name__} has no betas")
        if self.cycle_momentum:
            self.decay_mom_rate = decay_mom_rate
            self.skip_mom_decay = self.skip_mom_decay or math.isclose(decay_mom_rate, 0)
            self.min_moms = [(m, _ONE_CYCLE_BETA2) for m in _per_group(self.optimizer, cycle_min_mom, "cycle_min_mom")]
            self.max_moms = [(m, _ONE_CYCLE_BETA2) for m in _per_group(self.optimizer, cycle_max_mom, "cycle_max_mom")]
            if last_batch_iteration == -1:
                for g, betas in zip(groups, self.min_moms):
                    g["betas"] = betas

    def _scale(self):
        """Where in the cycle the step after last_batch_iteration is: 0 at the ends, 1 at the peak."""
        n = self.last_batch_iteration + 1
        x = 1.0 + n / self.total_size - math.floor(1 + n / self.total_size)
        rising = x <= self.step_ratio
        scale = x / self.step_ratio if rising else (x - 1) / (self.step_ratio - 1)
        stairs = self.first_stair_count if rising else self.second_stair_count
        if stairs > 0:
            # Stairs from the integer offset in the cycle: the float scale can sit just below a stair.
            pos = n % self.total_size
            if pos <= self.first_step_size:
                place = pos * stairs / self.first_step_size
            else:
                place = (self.total_size - pos) * stairs / self.second_step_size
            scale = math.floor(place) / stairs
        return scale

    def get_lr(self):
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [lo + (hi - lo) * scale for lo, hi in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return list(self.min_lrs)
        factor = 1 + self.decay_lr_rate * (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
        return [lo / factor for lo in self.min_lrs]

    def get_mom(self):
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._scale()
            return [(hi[0] - (hi[0] - lo[0]) * scale, lo[1]) for lo, hi in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return list(self.max_moms)
        factor = 1 + self.decay_mom_rate * (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size
        return [(b1 * factor, b2) for b1, b2 in self.max_moms]

    def step(self, batch_iteration=None):
        super().step(batch_iteration)
        if self.cycle_momentum:
            for g, betas in zip(self.optimizer.param_groups, self.get_mom()):
                g["betas"] = betas


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
