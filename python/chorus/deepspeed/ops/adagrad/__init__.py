"""deepspeed.ops.adagrad: DeepSpeedCPUAdagrad, stepped by chorus's SIMD CPU Adagrad
on CPU tensors (in torch ops on CUDA tensors); the ZeRO engine steps its fp32
partition with the same kernel."""
from chorus import _core
from chorus.deepspeed.ops._flat import FlatOptimizer, on_cpu


def adagrad_update(p, g, sums, lr, eps, weight_decay):
    """DeepSpeed's (and torch's) Adagrad in torch ops: g' = g + wd p; sums += g'^2; p -= lr g' / (sqrt(sums) + eps)."""
    g = g.add(p, alpha=weight_decay) if weight_decay else g
    sums.addcmul_(g, g)
    p.addcdiv_(g, sums.sqrt().add_(eps), value=-lr)


class DeepSpeedCPUAdagrad(FlatOptimizer):
    optimizer_id = 0
    state_names = ("exp_avg_sq",)

    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False, fp32_optimizer_states=True):
        if amsgrad:
            raise ValueError("DeepSpeedCPUAdagrad: amsgrad is not an Adagrad option (as in DeepSpeed)")
        super().__init__(model_params, dict(lr=lr, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))
        self.fp32_optimizer_states = fp32_optimizer_states
        self.opt_id = DeepSpeedCPUAdagrad.optimizer_id
        DeepSpeedCPUAdagrad.optimizer_id += 1

    def _update(self, group, state, p, g):
        lr, eps, wd = float(group["lr"]), float(group["eps"]), float(group["weight_decay"])
        s = state["exp_avg_sq"]
        if on_cpu(p):
            _core.cpu_adagrad_step(p.data_ptr(), g.data_ptr(), s.data_ptr(), p.numel(), lr, eps, wd)
            return
        adagrad_update(p, g, s, lr, eps, wd)


__all__ = ["DeepSpeedCPUAdagrad", "adagrad_update"]
