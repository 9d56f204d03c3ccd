"""chorus's SIMD CPU Adam/AdamW on torch tensors (fp32 state, in place)."""
import torch

from chorus import _core


class CPUAdamState:
    """Adam moments for one flat fp32 parameter buffer."""

    def __init__(self, param):
        _check(param, "param")
        self.exp_avg = torch.zeros_like(param)
        self.exp_avg_sq = torch.zeros_like(param)
        self.step = 0


def _check(t, what):
    if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError(f"cpu_adam: {what} must be a contiguous float32 CPU tensor, got {t.dtype} on {t.device}")


def adam_step(param, grad, state, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, adamw=False,
              low_precision=None):
    """One Adam (or AdamW) update of param in place, as torch.optim.Adam(W) computes it.
    low_precision: an optional bf16/fp16 tensor that receives the updated parameters."""
    _check(param, "param")
    _check(grad, "grad")
    if grad.numel() != param.numel():
        raise ValueError(f"cpu_adam: grad has {grad.numel()} elements, param {param.numel()}")
    state.step += 1
    low, low_dtype = 0, 5
    if low_precision is not None:
        if low_precision.dtype not in (torch.bfloat16, torch.float16) or low_precision.numel() != param.numel():
            raise ValueError("cpu_adam: low_precision must be a bf16 or fp16 tensor the size of param")
        low, low_dtype = low_precision.data_ptr(), 5 if low_precision.dtype == torch.bfloat16 else 4
    _core.cpu_adam_step(param.data_ptr(), grad.data_ptr(), state.exp_avg.data_ptr(), state.exp_avg_sq.data_ptr(),
                        param.numel(), float(lr), float(betas[0]), float(betas[1]), float(eps), float(weight_decay),
                        state.step, bool(adamw), low, low_dtype)
