"""The optimizer that deepspeed.initialize returns: param_groups that the engine
reads every step (schedulers and users may edit them); the state lives in C++."""
import torch

_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "lr_decay",
               "initial_accumulator_value", "max_coeff", "min_coeff", "bias_correction", "eps_inside_sqrt")


class ZeroOptimizer:
    """What DeepSpeed returns as the optimizer: param_groups plus the loss scale."""

    def __init__(self, engine, param_groups):
        self._engine = engine
        self.param_groups = param_groups
        self._basic = None

    @property
    def loss_scale(self):
        return self._engine.core.loss_scale

    cur_scale = loss_scale

    @property
    def basic_optimizer(self):
        """A torch.optim.Optimizer over the same param_groups (the very dicts), for torch's
        LR schedulers, which want one: what they set, the engine steps with."""
        if self._basic is None:
            self._basic = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=self.param_groups[0]["lr"])
            self._basic.param_groups = self.param_groups
            self._basic.step = self.step
        return self._basic

    @property
    def overflow(self):
        """Whether the last step was skipped for an fp16 overflow (DeepSpeed's optimizer.overflow)."""
        return not self._engine._step_applied and self._engine.global_steps > 0

    @property
    def defaults(self):
        return dict(self.hypers()[0]) if self.param_groups else {}

    @property
    def state(self):
        """Per-parameter state as torch optimizers have it: empty here, the moments
        live in chorus's engine (partitioned) and travel in its checkpoints."""
        return {}

    def load_state_dict(self, state_dict):
        """Restores the hyperparameters state_dict() gave (the moments come back with load_checkpoint)."""
        groups = state_dict.get("param_groups", [])
        if len(groups) != len(self.param_groups):
            raise ValueError(f"load_state_dict: {len(groups)} param groups given, the optimizer has "
                             f"{len(self.param_groups)}")
        for g, saved in zip(self.param_groups, groups):
            g.update({k: tuple(v) if k == "betas" else v for k, v in saved.items() if k != "params"})

    def hypers(self):
        return [{k: g[k] for k in _GROUP_KEYS if k in g} for g in self.param_groups]

    def zero_grad(self, set_to_none=True):
        """Gradients live in the engine and are cleared at each step."""

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("the ZeRO optimizer does not take a closure; call model_engine.step()")
        self._engine.step()

    def state_dict(self):
        return {"param_groups": self.hypers(), "optimizer_steps": self._engine.core.optimizer_steps}

    def __repr__(self):
        return f"ZeroOptimizer(stage={self._engine.core.stage}, groups={self.hypers()})"


DeepSpeedOptimizer = ZeroOptimizer  # DeepSpeed's names for the optimizer type
ZeROOptimizer = ZeroOptimizer
