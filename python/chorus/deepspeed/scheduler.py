"""DeepSpeed's WarmupLR and WarmupDecayLR over the engine optimizer's param_groups
(the schedule itself is computed by chorus's C++ core)."""
from chorus import _core


class WarmupLR:
    def __init__(self, optimizer, config_text, world, last_batch_iteration=-1):
        self.optimizer = optimizer
        self._config = config_text
        self._world = world
        self.last_batch_iteration = last_batch_iteration
        self._apply()

    def _apply(self):
        lr = _core.scheduled_lr(self._config, self._world, self.last_batch_iteration)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self._last_lr = [lr for _ in self.optimizer.param_groups]

    def get_lr(self):
        return list(self._last_lr)

    def get_last_lr(self):
        return list(self._last_lr)

    def step(self, last_batch_iteration=None):
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None \
            else last_batch_iteration
        self._apply()

    def state_dict(self):
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd):
        self.last_batch_iteration = sd["last_batch_iteration"]
        self._apply()


class WarmupDecayLR(WarmupLR):
    pass
