"""The optimizer that deepspeed.initialize returns: param_groups that the engine
reads every step (schedulers and users may edit them); the state lives in C++."""
import warnings

import torch

_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov")


def translate(client, config_opt, offload):
    """(kind, groups, client_to_run) for the engine: kind is adam, adamw or sgd when
    chorus's kernels step it, or None when the client optimizer must run as given."""
    if client is not None:
        if config_opt is not None:
            warnings.warn("deepspeed.initialize: both a client optimizer and an 'optimizer' config section were "
                          "given; the client optimizer takes precedence, as in DeepSpeed")
        kind = None
        from chorus.deepspeed.ops.adam import DeepSpeedCPUAdam, FusedAdam
        if type(client) in (DeepSpeedCPUAdam, FusedAdam):  # DeepSpeed's own: chorus's kernels are the equivalent
            return ("adamw" if client.adam_w_mode else "adam"), client.param_groups, None
        if type(client) is torch.optim.Adam and not any(g.get("amsgrad") for g in client.param_groups):
            kind = "adam"
        elif type(client) is torch.optim.AdamW and not any(g.get("amsgrad") for g in client.param_groups):
            kind = "adamw"
        elif type(client) is torch.optim.SGD:
            kind = "sgd"
        if kind in ("adam", "adamw"):
            where = "with CPU offload " if offload else ""
            warnings.warn(f"chorus: stepping the client torch.optim.{type(client).__name__} {where}with chorus's "
                          "SIMD CPU Adam and the client's hyperparameters (DeepSpeed would refuse a client "
                          "optimizer with offload unless zero_force_ds_cpu_optimizer is false)")
        elif kind is None:
            warnings.warn(f"chorus: {type(client).__name__} cannot be translated to chorus's kernels; it runs as "
                          "given on the fp32 partition, which is slower than chorus's CPU Adam")
        return kind, client.param_groups, (client if kind is None else None)
    if config_opt is None:
        raise ValueError("deepspeed.initialize: no optimizer; pass optimizer= or add an 'optimizer' section "
                         "to the config")
    group = {"lr": config_opt["lr"], "betas": tuple(config_opt["betas"]), "eps": config_opt["eps"],
             "weight_decay": config_opt["weight_decay"], "momentum": config_opt["momentum"]}
    return config_opt["type"], [group], None


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
