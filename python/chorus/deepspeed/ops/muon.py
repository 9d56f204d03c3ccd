"""Muon's update (DeepSpeed 0.19.8's optimizer type Muon): SGD momentum with Nesterov,
orthogonalized by a quintic Newton-Schulz iteration, scaled by the matrix's aspect
ratio. Two iterations, as DeepSpeed has them: "standard" on X itself (in bf16), and
"gram" (the default) on the small Gram matrix X X^T with one restart (in fp16 where
the device computes it, else fp32). The compute dtypes follow DeepSpeed's accelerator
rules so that the same config trains to the same numbers."""
import math

import torch

A, B, C = 3.4445, -4.7750, 2.0315  # the quintic's coefficients (slope at zero maximized)
NS_METHODS = ("standard", "gram")


def ns_compute_dtype(ns_method, device):
    if device.type == "cpu":
        fp16 = getattr(torch.ops.mkldnn, "_is_mkldnn_fp16_supported", None)
        fp16_ok = bool(fp16 and fp16())
        return (torch.float16 if fp16_ok else torch.float32) if ns_method == "gram" else torch.bfloat16
    return torch.float16 if ns_method == "gram" else torch.bfloat16


def _quintic(x, steps):
    for _ in range(steps):
        a = x @ x.mT
        x = A * x + (B * a + C * a @ a) @ x
    return x


def orthogonalize(g, steps=5, ns_method="gram"):
    """The zeroth power of g (a matrix, or a batch of them) by Newton-Schulz."""
    tall = g.size(-2) > g.size(-1)
    dtype = ns_compute_dtype(ns_method, g.device)
    if ns_method == "standard":
        x = g.to(dtype)
        x = x.mT if tall else x
        x = _quintic(x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7), steps)
        return x.mT if tall else x
    # gram: normalized before the cast, in a dtype with fp32's range (an fp16 input would overflow it)
    x = g.to(torch.float32 if g.dtype == torch.float16 else g.dtype)
    x = x.mT if tall else x
    x = (x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)).to(dtype)
    if x.size(-1) <= x.size(-2):  # square: the Gram matrix saves nothing
        x = _quintic(x, steps)
        return x.mT if tall else x
    # X_k = Q_k X with Q a polynomial in R = X X^T, so the iteration runs on R (n x n) and Q;
    # at step 2 Q is applied once and R recomputed, which keeps half precision stable.
    r, q, restart = x @ x.mT, None, 2
    for i in range(steps):
        if i == restart:
            x = q @ x
            r, q = x @ x.mT, None
        z = B * r + C * r @ r
        if q is None:
            q = z.clone()
            q.diagonal(dim1=-2, dim2=-1).add_(A)
        else:
            q = A * q + z @ q
        if i < steps - 1 and i + 1 != restart:
            rz = A * r + z @ r
            r = A * rz + z @ rz
    return (x.mT @ q.mT) if tall else q @ x


def aspect_scale(rows, cols):
    return math.sqrt(rows / cols) if rows > cols else 1.0


def muon_update(grad, momentum, beta=0.95, ns_steps=5, nesterov=True, ns_method="gram", num_heads=None):
    """The update for one matrix (grad is changed in place); momentum is advanced only when
    grad is finite, and a non-finite grad comes back as it is, so that the step is skipped.
    num_heads: the matrix's rows are that many heads, each orthogonalized on its own
    (per_head_muon), scaled by one head's aspect ratio."""
    finite = torch.isfinite(grad).all()
    momentum.copy_(torch.where(finite, momentum.lerp(grad, 1 - beta), momentum))
    update = grad.lerp_(momentum, beta) if nesterov else momentum
    if num_heads is not None:
        rows, cols = update.shape
        if num_heads < 1 or rows % num_heads:
            raise ValueError(f"per-head Muon: {rows} rows do not split into {num_heads} heads")
        heads = orthogonalize(update.reshape(num_heads, rows // num_heads, cols), ns_steps, ns_method)
        return (heads * aspect_scale(rows // num_heads, cols)).reshape(rows, cols).to(grad.dtype)
    shaped = update.view(len(update), -1) if update.ndim > 2 else update
    out = orthogonalize(shaped, ns_steps, ns_method) * aspect_scale(grad.size(-2), grad.size(-1))
    out = out.to(grad.dtype)
    return torch.where(finite, out, grad)
