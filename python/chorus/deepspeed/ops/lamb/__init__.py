"""deepspeed.ops.lamb: FusedLamb, DeepSpeed's LAMB (trust ratio per tensor, bias
correction on the step size), by chorus's SIMD CPU kernels on CPU tensors and in
torch ops on CUDA tensors; the ZeRO engine steps each parameter of its partition
with the same kernels, its trust ratio over the whole parameter."""
import torch

from chorus import _core
from chorus.deepspeed.ops._flat import FlatOptimizer, on_cpu


def lamb_trust(w_norm, u_norm, max_coeff, min_coeff):
    if w_norm == 0 or u_norm == 0:
        return 1.0
    return min(max(w_norm / u_norm, min_coeff), max_coeff)


def lamb_step_size(group, step):
    lr = group["lr"]
    if not group.get("bias_correction", True):
        return lr
    b1, b2 = group["betas"]
    return lr * (1 - b2 ** step) ** 0.5 / (1 - b1 ** step)


def lamb_moments(p, g, m, v, group, eps_inside_sqrt):
    """The moments, and the update m / denom + wd p (torch ops)."""
    b1, b2 = group["betas"]
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (v + group["eps"]).sqrt_() if eps_inside_sqrt else v.sqrt().add_(group["eps"])
    return (m / denom).add_(p, alpha=group["weight_decay"])


class FusedLamb(FlatOptimizer):
    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, eps_inside_sqrt=False,
                 weight_decay=0., max_grad_norm=0., max_coeff=10.0, min_coeff=0.01, amsgrad=False):
        if amsgrad:
            raise RuntimeError("FusedLamb does not support the AMSGrad variant.")
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                                      weight_decay=weight_decay, max_grad_norm=max_grad_norm, max_coeff=max_coeff,
                                      min_coeff=min_coeff))
        self.eps_inside_sqrt = eps_inside_sqrt
        self.eps_mode = 0 if eps_inside_sqrt else 1
        self.lamb_coeffs = []

    @torch.no_grad()
    def step(self, closure=None):
        del self.lamb_coeffs[:]
        return super().step(closure)

    def _update(self, group, state, p, g):
        if group["max_grad_norm"] > 0:  # FusedLamb's own clipping, by this tensor's norm
            norm = float(g.norm())
            clip = (norm + 1e-6) / group["max_grad_norm"]
            if clip > 1:
                g = g / clip
        m, v = state["exp_avg"], state["exp_avg_sq"]
        b1, b2 = group["betas"]
        if on_cpu(p):
            trust = _core.cpu_lamb_step(p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), p.numel(),
                                        float(group["lr"]), float(b1), float(b2), float(group["eps"]),
                                        float(group["weight_decay"]), state["step"],
                                        bool(group["bias_correction"]), bool(self.eps_inside_sqrt),
                                        float(group["max_coeff"]), float(group["min_coeff"]), 1.0)
        else:
            w_norm = float(p.norm())
            update = lamb_moments(p, g, m, v, group, self.eps_inside_sqrt)
            trust = lamb_trust(w_norm, float(update.norm()), group["max_coeff"], group["min_coeff"])
            p.sub_(update, alpha=lamb_step_size(group, state["step"]) * trust)
        self.lamb_coeffs.append(trust)

    def get_lamb_coeffs(self):
        return list(self.lamb_coeffs)


__all__ = ["FusedLamb"]
