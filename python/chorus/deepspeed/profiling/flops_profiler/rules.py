"""What each torch call costs, as DeepSpeed 0.19.8's flops profiler counts it: while
profiling, the functionals, torch functions and Tensor methods below are wrapped; each
call adds its (flops, macs) to the innermost profiled module running its forward.
Everything else counts nothing (Python's * and + operators included, as DeepSpeed's)."""
import math
import re

import numpy as np
import torch
import torch.nn.functional as F

# One list per module whose forward is running (innermost last): (name, flops) and (name, macs).
flop_stack = []
mac_stack = []


def _arg(args, kwargs, i, name, default=None):
    if len(args) > i:
        return args[i]
    return kwargs.get(name, default)


def _numel(shape):
    return int(math.prod(shape))


def _linear(*a, **k):
    x, w = _arg(a, k, 0, "input"), _arg(a, k, 1, "weight")
    macs = x.numel() * w.shape[0]  # (the bias is not counted, as DeepSpeed's)
    return 2 * macs, macs


def _tuple(v, n):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * n


def _conv(*a, **k):
    x, w, bias = _arg(a, k, 0, "input"), _arg(a, k, 1, "weight"), _arg(a, k, 2, "bias")
    stride, padding = _arg(a, k, 3, "stride", 1), _arg(a, k, 4, "padding", 0)
    dilation, groups = _arg(a, k, 5, "dilation", 1), _arg(a, k, 6, "groups", 1)
    assert w.shape[1] * groups == x.shape[1]
    kernel, spatial = tuple(w.shape[2:]), tuple(x.shape[2:])
    n = len(kernel)
    stride, dilation = _tuple(stride, n), _tuple(dilation, n)
    if padding == "valid":
        padding = (0,) * n
    elif padding == "same":
        padding = tuple(d * (kk - 1) // 2 for d, kk in zip(dilation, kernel))
    else:
        padding = _tuple(padding, n)
    out = [(i + 2 * p - (d * (kk - 1) + 1)) // s + 1
           for i, p, d, kk, s in zip(spatial, padding, dilation, kernel, stride)]
    c_in, c_out, batch = x.shape[1], w.shape[0], x.shape[0]
    macs = int(_numel(kernel) * c_in * (c_out // groups) * batch * _numel(out))
    bias_flops = c_out * batch * _numel(out) if bias is not None else 0
    return int(2 * macs + bias_flops), macs


def _conv_transpose(*a, **k):
    x, w, bias = _arg(a, k, 0, "input"), _arg(a, k, 1, "weight"), _arg(a, k, 2, "bias")
    stride, padding = _arg(a, k, 3, "stride", 1), _arg(a, k, 4, "padding", 0)
    out_pad, groups = _arg(a, k, 5, "output_padding", 0), _arg(a, k, 6, "groups", 1)
    dilation = _arg(a, k, 7, "dilation", 1)
    kernel, spatial = tuple(w.shape[2:]), tuple(x.shape[2:])
    n = len(kernel)
    stride, padding, dilation, out_pad = (_tuple(v, n) for v in (stride, padding, dilation, out_pad))
    out = [(i - 1) * s - 2 * p + d * (kk - 1) + op + 1
           for i, s, p, d, kk, op in zip(spatial, stride, padding, dilation, kernel, out_pad)]
    c_in, batch = x.shape[1], x.shape[0]
    c_out = w.shape[1] * groups
    macs = int(_numel(kernel) * c_in * w.shape[1] * batch * _numel(spatial))  # each input scatters a kernel
    bias_flops = c_out * batch * _numel(out) if bias is not None else 0
    return int(2 * macs + bias_flops), macs


def _elementwise_input(*a, **k):
    return _arg(a, k, 0, "input").numel(), 0


def _norm(weight_index):
    def rule(*a, **k):
        x = _arg(a, k, 0, "input")
        weight = _arg(a, k, weight_index, "weight")
        return x.numel() * (5 if weight is not None else 4), 0
    return rule


def _batch_norm(*a, **k):
    x, weight = _arg(a, k, 0, "input"), _arg(a, k, 3, "weight")
    training = _arg(a, k, 5, "training", False)
    if training:
        return x.numel() * (5 if weight is not None else 4), 0
    return x.numel() * (2 if weight is not None else 1), 0


def _interpolate(*a, **k):
    x = _arg(a, k, 0, "input")
    size = _arg(a, k, 1, "size")
    if size is not None:  # (batch and channels left out, as DeepSpeed's)
        return (_numel(size) if isinstance(size, (tuple, list)) else int(size)), 0
    scale = _arg(a, k, 2, "scale_factor")
    assert scale is not None, "interpolate needs size or scale_factor"
    if isinstance(scale, (tuple, list)):
        assert len(scale) == x.dim() - 2
        return int(x.numel() * _numel(scale)), 0
    return int(x.numel() * scale ** (x.dim() - 2)), 0


def _free(*a, **k):
    return 0, 0


def _sdpa(*a, **k):
    q, key, v = _arg(a, k, 0, "query"), _arg(a, k, 1, "key"), _arg(a, k, 2, "value")
    macs = _numel(q.shape) * key.shape[-2] + _numel(q.shape[:-1]) * key.shape[-2] * v.shape[-1]
    return 2 * macs, macs


def _matmul(first, second):
    macs = _numel(first.shape) * second.shape[-1]
    return 2 * macs, macs


def _matmul_rule(*a, **k):
    return _matmul(_arg(a, k, 0, "input"), _arg(a, k, 1, "other", _arg(a, k, 1, "mat2")))


def _addmm_rule(*a, **k):
    added, m1, m2 = a[0], a[1], a[2]
    flops, macs = _matmul(m1, m2)
    return flops + _numel(added.shape), macs


def _elementwise_pair(*a, **k):
    x, y = _arg(a, k, 0, "input"), _arg(a, k, 1, "other")
    if torch.is_tensor(x) and torch.is_tensor(y):
        return _numel(torch.broadcast_shapes(x.shape, y.shape)), 0
    if torch.is_tensor(x):
        return _numel(x.shape), 0
    if torch.is_tensor(y):
        return _numel(y.shape), 0
    return 1, 0


def _einsum_cost(equation, operands):
    """numpy's optimal-path FLOP count for the contraction (what DeepSpeed reports)."""
    names = {}
    equation = "".join(names.setdefault(c, chr(97 + len(names))) if c.isalpha() else c for c in equation)
    arrays = [np.zeros(tuple(o.shape)) for o in operands]
    report = np.einsum_path(equation, *arrays, optimize="optimal")[1]
    for line in report.split("\n"):
        if "optimized flop" in line.lower():
            return int(float(line.split(":")[-1]))
    raise ValueError(f"einsum '{equation}': numpy reported no FLOP count")


def _einsum(*a, **k):
    return _einsum_cost(a[0].replace(" ", ""), a[1:]), 0


def _einops_einsum(*a, **k):
    return _einsum_cost(a[-1], a[:-1]), 0


_ACTIVATIONS = ("relu", "prelu", "elu", "leaky_relu", "relu6", "silu", "gelu")
_POOLS = [f"{kind}_pool{d}d" for kind in ("avg", "max", "adaptive_avg", "adaptive_max") for d in (1, 2, 3)]


def _targets():
    """(owner, attribute, rule) of every wrapped callable."""
    out = [(F, "linear", _linear)]
    out += [(F, f"conv{d}d", _conv) for d in (1, 2, 3)]
    out += [(F, f"conv_transpose{d}d", _conv_transpose) for d in (1, 2, 3)]
    out += [(F, name, _elementwise_input) for name in _ACTIVATIONS if hasattr(F, name)]
    out += [(F, "batch_norm", _batch_norm), (F, "layer_norm", _norm(2)), (F, "group_norm", _norm(2)),
            (F, "instance_norm", _norm(3))]
    out += [(F, name, _elementwise_input) for name in _POOLS]
    out += [(F, "upsample", _interpolate), (F, "interpolate", _interpolate), (F, "softmax", _elementwise_input),
            (F, "embedding", _free)]
    if hasattr(F, "scaled_dot_product_attention"):
        out.append((F, "scaled_dot_product_attention", _sdpa))
    for owner in (torch, torch.Tensor):
        out += [(owner, name, _matmul_rule) for name in ("matmul", "mm", "bmm")]
        out += [(owner, "addmm", _addmm_rule), (owner, "mul", _elementwise_pair), (owner, "add", _elementwise_pair)]
    out += [(torch.Tensor, "__matmul__", _matmul_rule), (torch, "baddbmm", _addmm_rule), (torch, "einsum", _einsum)]
    try:
        import einops
        if hasattr(einops, "einsum"):
            out.append((einops, "einsum", _einops_einsum))
    except ImportError:
        pass
    return out


_saved = []


def _wrap(name, original, rule):
    def counted(*args, **kwargs):
        flops, macs = rule(*args, **kwargs)
        if flop_stack:
            flop_stack[-1].append((name, flops))
        if mac_stack and macs:
            mac_stack[-1].append((name, macs))
        return original(*args, **kwargs)
    counted.__wrapped__ = original
    return counted


def patch():
    if _saved:
        return
    for owner, attr, rule in _targets():
        original = getattr(owner, attr)
        _saved.append((owner, attr, original))
        setattr(owner, attr, _wrap(attr, original, rule))


def unpatch():
    while _saved:
        owner, attr, original = _saved.pop()
        setattr(owner, attr, original)


_RNN_EXTRA = {"RNN": 1, "GRU": 7, "LSTM": 10}  # per hidden unit: the gates' own operations


def rnn_flops(module, inputs):
    """A recurrent module's flops, counted from its weights (DeepSpeed's module rule)."""
    kind = re.sub("Cell$", "", type(module).__name__)
    cell = type(module).__name__.endswith("Cell")
    layers = 1 if cell else module.num_layers
    total = 0
    for layer in range(layers):
        suffix = "" if cell else f"_l{layer}"
        w_ih, w_hh = getattr(module, "weight_ih" + suffix), getattr(module, "weight_hh" + suffix)
        gates = w_ih.shape[0]
        flops = 2 * gates * w_ih.shape[1] - gates + 2 * gates * w_hh.shape[1] - gates
        flops += _RNN_EXTRA[kind] * module.hidden_size
        if module.bias:
            flops += getattr(module, "bias_ih" + suffix).shape[0] + getattr(module, "bias_hh" + suffix).shape[0]
        total += flops
    x = inputs[0]
    if cell:
        return int(total * x.shape[0])
    total *= x.shape[0] * x.shape[1]
    return int(total * (2 if module.bidirectional else 1))
