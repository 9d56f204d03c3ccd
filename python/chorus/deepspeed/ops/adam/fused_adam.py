"""deepspeed.ops.adam.fused_adam: FusedAdam, torch's AdamW (or Adam with adam_w_mode=False)
under DeepSpeed's name and arguments."""
import torch


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
