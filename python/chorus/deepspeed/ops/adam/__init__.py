"""deepspeed.ops.adam: DeepSpeedCPUAdam and FusedAdam. Passed to deepspeed.initialize,
the ZeRO engine steps them with chorus's SIMD CPU Adam on its fp32 partition (as
DeepSpeed runs its own kernels); used on their own, they are torch optimizers
(DeepSpeedCPUAdam runs chorus's SIMD kernel on CPU tensors)."""
import torch

from chorus.cpu_adam import CPUAdamState, adam_step


class DeepSpeedCPUAdam(torch.optim.Optimizer):
    optimizer_id = 0

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        if amsgrad:
            raise ValueError("DeepSpeedCPUAdam: amsgrad is not supported (as in DeepSpeed)")
        if not bias_correction:
            raise ValueError("DeepSpeedCPUAdam: chorus's CPU Adam always applies bias correction")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
                        amsgrad=amsgrad)
        super().__init__(model_params, defaults)
        self.adam_w_mode = adamw_mode
        self.opt_id = DeepSpeedCPUAdam.optimizer_id
        DeepSpeedCPUAdam.optimizer_id += 1

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.device.type != "cpu":
                    raise ValueError(f"DeepSpeedCPUAdam: parameter on {p.device}; it steps CPU tensors")
                state = self.state[p]
                if "chorus" not in state:
                    state["chorus"] = CPUAdamState(p.data.float().contiguous().view(-1)
                                                   if p.dtype != torch.float32 else p.data.view(-1))
                    state["step"] = 0
                cs = state["chorus"]
                master = p.data.view(-1) if p.dtype == torch.float32 and p.is_contiguous() else None
                work = master if master is not None else p.data.float().contiguous().view(-1)
                grad = p.grad.float().contiguous().view(-1)
                adam_step(work, grad, cs, lr=group["lr"], betas=group["betas"], eps=group["eps"],
                          weight_decay=group["weight_decay"], adamw=self.adam_w_mode)
                if master is None:
                    p.data.copy_(work.view_as(p))
                state["step"] = cs.step
                state["exp_avg"], state["exp_avg_sq"] = cs.exp_avg, cs.exp_avg_sq
        return loss


class FusedAdam(torch.optim.AdamW):
    """DeepSpeed's FusedAdam: Adam, or AdamW with adam_w_mode (the default)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True):
        if amsgrad:
            raise ValueError("FusedAdam: amsgrad is not supported (as in DeepSpeed)")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.adam_w_mode = adam_w_mode
        if not adam_w_mode:  # decay added to the gradient, as torch's Adam
            for g in self.param_groups:
                g["_l2"] = True

    @torch.no_grad()
    def step(self, closure=None):
        if self.adam_w_mode:
            return super().step(closure)
        for g in self.param_groups:  # Adam's L2: the decay goes into the gradient
            wd = g["weight_decay"]
            if wd:
                for p in g["params"]:
                    if p.grad is not None:
                        p.grad.add_(p.data, alpha=wd)
        saved = [g["weight_decay"] for g in self.param_groups]
        for g in self.param_groups:
            g["weight_decay"] = 0.0
        try:
            return super().step(closure)
        finally:
            for g, wd in zip(self.param_groups, saved):
                g["weight_decay"] = wd
