"""deepspeed.ops.adam.cpu_adam: DeepSpeedCPUAdam. Passed to deepspeed.initialize, the
ZeRO engine steps it with chorus's SIMD CPU Adam on its fp32 partition (as DeepSpeed
runs its own kernel); used on its own, it is a torch optimizer running that kernel
on CPU tensors."""
from chorus import _core
from chorus.deepspeed.ops._flat import FlatOptimizer, on_cpu


class DeepSpeedCPUAdam(FlatOptimizer):
    optimizer_id = 0
    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        if amsgrad:
            raise ValueError("DeepSpeedCPUAdam: amsgrad is not supported (as in DeepSpeed)")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
                        amsgrad=amsgrad)
        super().__init__(model_params, defaults)
        self.adam_w_mode = adamw_mode
        self.opt_id = DeepSpeedCPUAdam.optimizer_id
        DeepSpeedCPUAdam.optimizer_id += 1

    def _update(self, group, state, p, g):
        if not on_cpu(p):
            raise ValueError(f"DeepSpeedCPUAdam: parameter on {p.device}; it steps CPU tensors")
        b1, b2 = group["betas"]
        _core.cpu_adam_step(p.data_ptr(), g.data_ptr(), state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr(),
                            p.numel(), float(group["lr"]), float(b1), float(b2), float(group["eps"]),
                            float(group["weight_decay"]), state["step"], bool(self.adam_w_mode),
                            bias_correction=bool(group.get("bias_correction", True)))
