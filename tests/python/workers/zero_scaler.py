"""fp16 dynamic loss scaling in the engine against DeepSpeed's documented schedule:
an overflow on one rank skips the step on every rank (parameters unchanged),
hysteresis absorbs overflows, the scale grows after a window of clean steps, and
an overflow at the minimum scale is an error on every rank."""
import json

import numpy as np

import chorus.torch as hvd
from chorus import _core

hvd.init()
world, rank = hvd.size(), hvd.rank()
POWER, WINDOW, HYST, MIN = 5, 3, 2, 4.0


class Expected:
    """DeepSpeed's DynamicLossScaler, written out independently of the C++ one."""

    def __init__(self):
        self.scale, self.iter, self.last_overflow, self.hyst = 2.0 ** POWER, 0, -1, HYST

    def update(self, overflow):
        if overflow:
            if self.hyst == 1:
                if self.scale == MIN:
                    raise OverflowError
                self.scale = max(self.scale / 2, MIN)
            else:
                self.hyst -= 1
            self.last_overflow = self.iter
        elif (self.iter - self.last_overflow) % WINDOW == 0:
            self.hyst = HYST
            self.scale *= 2
        self.iter += 1


for stage in (1, 2):
    cfg = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
           "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": POWER, "loss_scale_window": WINDOW,
                    "hysteresis": HYST, "min_loss_scale": MIN},
           "zero_optimization": {"stage": stage, "reduce_bucket_size": 16}}
    numels = [10, 7, 33]
    core = _core.ZeroEngine(json.dumps(cfg), 0, 4, numels, [0, 0, 0], "adam")
    init = [np.linspace(-1, 1, n).astype(np.float16) for n in numels]
    for i, a in enumerate(init):
        core.load_param(i, a.ctypes.data)
    core.finish_init()
    views = [np.frombuffer(core.param_storage(i), dtype=np.float16) for i in range(len(numels))]
    exp = Expected()
    # Overflow pattern: which rank (if any) sees an inf gradient at each step.
    pattern = [None, 1 % world, None, 0, 0, None, None, None, None, 1 % world, None, None, None]
    for step, bad in enumerate(pattern):
        before = [v.copy() for v in views]
        assert core.loss_scale == exp.scale, (stage, step, core.loss_scale, exp.scale)
        for i in reversed(range(len(numels))):
            g = (np.full(numels[i], 0.01, dtype=np.float32) * core.loss_scale).astype(np.float16)
            if bad == rank and i == 1:
                g[3] = np.inf
            core.grad_ready(i, g.ctypes.data)
        skipped, _, _ = core.step([{"lr": 1e-2}])
        exp.update(bad is not None)
        assert skipped == (bad is not None), (stage, step, skipped)
        changed = any((a != b).any() for a, b in zip(before, views))
        assert changed == (not skipped), (stage, step, changed)
    assert core.loss_scale == exp.scale
    print(f"stage {stage}: schedule matches, final scale {core.loss_scale}", flush=True)

# Down to the minimum, then one more overflow: an error on every rank.
cfg["zero_optimization"]["stage"] = 2
core = _core.ZeroEngine(json.dumps(cfg), 0, 4, [16], [0], "adam")
z = np.zeros(16, dtype=np.float16)
core.load_param(0, z.ctypes.data)
core.finish_init()
exp = Expected()
raised = False
for step in range(40):
    g = np.zeros(16, dtype=np.float16)
    if rank == 0:
        g[0] = np.inf
    core.grad_ready(0, g.ctypes.data)
    try:
        exp.update(True)
        expect_error = False
    except OverflowError:
        expect_error = True
    try:
        core.step([{"lr": 1e-2}])
        assert not expect_error, "no error at the minimum scale"
    except RuntimeError as e:
        assert expect_error and "min_loss_scale" in str(e), str(e)
        raised = True
        break
assert raised
print("zero scaler ok", flush=True)
