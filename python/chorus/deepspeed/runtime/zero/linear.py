"""ZeRO-3's memory-efficient linear (zero_optimization.memory_efficient_linear, on by default):
torch.nn.functional.linear replaced, as DeepSpeed replaces it at stage 3, by a function that keeps
the weight parameter itself for backward. torch's linear keeps weight.t(), a view of the gathered
storage: the storage outlives the module's release, so every layer's gathered weight stayed in
memory from forward to backward. The parameter's data is released after forward and gathered again
before the module's backward (stage3.Stage3Hooks), so the saved parameter is whole when used."""
import torch
import torch.nn.functional as F

_ORIGINAL = F.linear


def _autocast_state(device_type):
    if hasattr(torch, "get_autocast_dtype"):  # (torch >= 2.4; the older calls warn there)
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    if device_type == "cuda":
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
    return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()


class LinearFunctionForZeroStage3(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weight, bias=None):
        ctx.device_type = "cuda" if input.is_cuda else "cpu"
        ctx.autocast = _autocast_state(ctx.device_type)
        ctx.save_for_backward(input, weight, bias)
        if input.dim() == 2 and bias is not None:
            return torch.addmm(bias, input, weight.t())
        out = input.matmul(weight.t())
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx, grad_output):
        enabled, dtype = ctx.autocast
        # (under the forward's autocast state, as torch.amp's custom_bwd runs a backward)
        with torch.autocast(device_type=ctx.device_type, enabled=enabled, dtype=dtype):
            input, weight, bias = ctx.saved_tensors
            grad_input = grad_weight = grad_bias = None
            dim = grad_output.dim()
            if ctx.needs_input_grad[0]:
                grad_input = grad_output.matmul(weight)
            if ctx.needs_input_grad[1]:
                if dim == 1:
                    grad_weight = grad_output.unsqueeze(-1) * input.unsqueeze(0)
                else:
                    grad_weight = grad_output.reshape(-1, grad_output.shape[-1]).t().matmul(
                        input.reshape(-1, input.shape[-1]))
            if bias is not None and ctx.needs_input_grad[2]:
                grad_bias = grad_output if dim == 1 else grad_output.sum(list(range(dim - 1)))
        return grad_input, grad_weight, grad_bias


def zero3_linear_wrap(input, weight, bias=None):
    return LinearFunctionForZeroStage3.apply(input, weight, bias)


def enable():
    """torch.nn.functional.linear becomes zero3_linear_wrap (and stays: DeepSpeed leaves it so too)."""
    if F.linear is _ORIGINAL:
        F.linear = zero3_linear_wrap
