"""deepspeed.ops.lion: DeepSpeedCPULion and FusedLion, stepped by chorus's SIMD CPU
Lion on CPU tensors (in torch ops on CUDA tensors). Passed to deepspeed.initialize,
the ZeRO engine steps its fp32 partition with the same kernel."""
import torch

from chorus import _core
from chorus.deepspeed.ops._flat import FlatOptimizer, on_cpu


def lion_update(p, g, exp_avg, lr, beta1, beta2, weight_decay):
    """DeepSpeed's Lion in torch ops: p = p (1 - lr wd) - lr sign(beta1 m + (1 - beta1) g)
    (a zero blend counts as positive, as its kernels' copysign); m = beta2 m + (1 - beta2) g."""
    blend = exp_avg.mul(beta1).add_(g, alpha=1 - beta1)
    if weight_decay:
        p.mul_(1 - lr * weight_decay)
    p.sub_(torch.copysign(torch.full_like(blend, lr), blend))
    exp_avg.mul_(beta2).add_(g, alpha=1 - beta2)


class DeepSpeedCPULion(FlatOptimizer):
    optimizer_id = 0
    state_names = ("exp_avg",)

    def __init__(self, model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0, fp32_optimizer_states=True):
        super().__init__(model_params, dict(lr=lr, betas=betas, weight_decay=weight_decay))
        self.fp32_optimizer_states = fp32_optimizer_states
        self.opt_id = DeepSpeedCPULion.optimizer_id
        DeepSpeedCPULion.optimizer_id += 1

    def _update(self, group, state, p, g):
        b1, b2 = group["betas"]
        if on_cpu(p):
            _core.cpu_lion_step(p.data_ptr(), g.data_ptr(), state["exp_avg"].data_ptr(), p.numel(), float(group["lr"]),
                                float(b1), float(b2), float(group["weight_decay"]))
        else:
            lion_update(p, g, state["exp_avg"], group["lr"], b1, b2, group["weight_decay"])


class FusedLion(DeepSpeedCPULion):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0., set_grad_none=True):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
        self.set_grad_none = set_grad_none


__all__ = ["DeepSpeedCPULion", "FusedLion"]
