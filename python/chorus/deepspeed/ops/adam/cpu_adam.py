"""deepspeed.ops.adam.cpu_adam: DeepSpeedCPUAdam. Passed to deepspeed.initialize, the
ZeRO engine steps it with chorus's SIMD CPU Adam on its fp32 partition (as DeepSpeed
runs its own kernel); used on its own, it is a torch optimizer running that kernel
on CPU tensors."""
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
