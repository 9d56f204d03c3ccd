"""The CPU optimizers' common part: each parameter stepped as one flat fp32 tensor
by chorus's SIMD kernels (CPU tensors), or by the same update in torch ops
(CUDA tensors, where chorus has no kernel of its own for it)."""
import torch


class FlatOptimizer(torch.optim.Optimizer):
    """step() hands each parameter with a gradient to the subclass's _update(group,
    state, param fp32 flat, grad fp32 flat) and writes the result back."""

    state_names = ()

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
                if p.grad.is_sparse:
                    raise ValueError(f"{type(self).__name__}: sparse gradients are not supported")
                state = self.state[p]
                direct = p.dtype == torch.float32 and p.is_contiguous()
                work = p.data.view(-1) if direct else p.data.float().contiguous().view(-1)
                if not state:
                    state["step"] = 0
                    for name in self.state_names:
                        state[name] = self._initial_state(group, name, work)
                state["step"] += 1
                grad = p.grad.float().contiguous().view(-1)
                self._update(group, state, work, grad)
                if not direct:
                    p.data.copy_(work.view_as(p))
        return loss

    def _initial_state(self, group, name, work):
        return torch.zeros_like(work)


def on_cpu(t):
    return t.device.type == "cpu"
