"""Megatron-style tensor-parallel layers. Each rank holds a slice of the weight; the
full weight is made on every rank with the same init (and RNG state) and sliced,
so a model built with the same seed equals its one-process twin. Sliced
parameters carry model_parallel = True (DeepSpeed's mark), for norms and checkpoints."""
import torch
import torch.nn.functional as F

import chorus.torch as hvd
from chorus.parallel import mpu
from chorus.parallel.mappings import (copy_to_model_parallel_region, gather_from_model_parallel_region,
                                      reduce_from_model_parallel_region, scatter_to_model_parallel_region)


def _shard(full, dim):
    n, r = mpu.get_model_parallel_world_size(), mpu.get_model_parallel_rank()
    if full.shape[dim] % n:
        raise ValueError(f"tensor parallelism: dimension {full.shape[dim]} does not split into {n} parts")
    return full.chunk(n, dim=dim)[r].contiguous()


def _full_linear(input_size, output_size, bias, init_method, dtype):
    """The whole layer, made alike on every rank (same init, same RNG state)."""
    full = torch.nn.Linear(input_size, output_size, bias=bias, dtype=dtype)
    if init_method is not None:
        init_method(full.weight)
        if bias:
            torch.nn.init.zeros_(full.bias)
    return full


def _mark(p, dim):
    p.model_parallel = True
    p.tensor_model_parallel = True
    p.partition_dim = dim  # Megatron's name: where zero_to_fp32 joins the slices
    return p


class ColumnParallelLinear(torch.nn.Module):
    """Y = XA + b with A split by columns: rank r computes Y's r-th slice. With
    gather_output the slices are joined (else the next layer takes them as they are)."""

    def __init__(self, input_size, output_size, bias=True, gather_output=True, init_method=None,
                 skip_bias_add=False, dtype=None):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add
        full = _full_linear(input_size, output_size, bias, init_method, dtype)
        self.weight = _mark(torch.nn.Parameter(_shard(full.weight.data, 0)), 0)
        self.bias = _mark(torch.nn.Parameter(_shard(full.bias.data, 0)), 0) if bias else None

    def forward(self, x):
        x = copy_to_model_parallel_region(x)
        y = F.linear(x, self.weight, None if self.skip_bias_add else self.bias)
        if self.gather_output:
            y = gather_from_model_parallel_region(y)
        return (y, self.bias) if self.skip_bias_add else y


class RowParallelLinear(torch.nn.Module):
    """Y = XA + b with A split by rows: rank r multiplies its slice of X by its rows,
    and the partial products are summed. input_is_parallel: X arrives sliced (as a
    ColumnParallelLinear without gather_output leaves it)."""

    def __init__(self, input_size, output_size, bias=True, input_is_parallel=False, init_method=None,
                 skip_bias_add=False, dtype=None):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.input_is_parallel, self.skip_bias_add = input_is_parallel, skip_bias_add
        full = _full_linear(input_size, output_size, bias, init_method, dtype)
        self.weight = _mark(torch.nn.Parameter(_shard(full.weight.data, 1)), 1)
        self.bias = torch.nn.Parameter(full.bias.data.clone()) if bias else None  # the same on every rank

    def forward(self, x):
        if not self.input_is_parallel:
            x = scatter_to_model_parallel_region(x)
        y = reduce_from_model_parallel_region(F.linear(x, self.weight))
        if self.skip_bias_add:
            return y, self.bias
        return y + self.bias if self.bias is not None else y


class VocabParallelEmbedding(torch.nn.Module):
    """An embedding table split by rows (the vocabulary): each rank looks up the ids
    in its range, zeros elsewhere, and the partial results are summed."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, init_method=None, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        full = torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx, dtype=dtype)
        if init_method is not None:
            init_method(full.weight)
        n, r = mpu.get_model_parallel_world_size(), mpu.get_model_parallel_rank()
        if num_embeddings % n:
            raise ValueError(f"VocabParallelEmbedding: a vocabulary of {num_embeddings} does not split into {n} parts")
        per = num_embeddings // n
        self.vocab_start_index, self.vocab_end_index = r * per, (r + 1) * per
        self.padding_idx = padding_idx
        self.weight = _mark(torch.nn.Parameter(_shard(full.weight.data, 0)), 0)

    def forward(self, ids):
        outside = (ids < self.vocab_start_index) | (ids >= self.vocab_end_index)
        local = (ids - self.vocab_start_index).masked_fill(outside, 0)
        out = F.embedding(local, self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_model_parallel_region(out)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target):
        group = mpu.get_model_parallel_group()
        n, r = mpu.get_model_parallel_world_size(), mpu.get_model_parallel_rank()
        per = logits.shape[-1]
        start = r * per
        logits = logits.float()
        top = logits.max(dim=-1).values
        if group is not None:
            top = hvd.allreduce(top.contiguous(), op=hvd.Max, process_set=group)
        shifted = logits - top.unsqueeze(-1)
        outside = (target < start) | (target >= start + per)
        local = (target - start).masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        if group is not None:
            both = hvd.allreduce(torch.stack([picked, total]).contiguous(), op=hvd.Sum, process_set=group)
            picked, total = both[0], both[1]
        loss = total.log() - picked
        ctx.save_for_backward(exp / total.unsqueeze(-1), outside, local)
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, outside, local = ctx.saved_tensors
        g = softmax.clone()
        flat = g.view(-1, g.shape[-1])
        rows = torch.arange(flat.shape[0])
        flat[rows, local.view(-1)] -= (~outside).view(-1).float()
        return g * grad.unsqueeze(-1), None


def vocab_parallel_cross_entropy(vocab_parallel_logits, target):
    """Per-token cross-entropy of logits split over the vocabulary (each rank holds
    its slice of the last dimension), without gathering the logits."""
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target)
