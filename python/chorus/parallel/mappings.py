"""The four collectives of Megatron-style tensor parallelism, as autograd
functions over the tensor-parallel process set (each one's backward is the other's forward)."""
import torch

import chorus.torch as hvd
from chorus.parallel import mpu


def _group():
    return mpu.get_model_parallel_group()


def _allreduce(x):
    group = _group()
    if group is None:
        return x
    return hvd.allreduce(x.contiguous(), op=hvd.Sum, process_set=group)


def _split_last(x):
    n = mpu.get_model_parallel_world_size()
    if n == 1:
        return x
    if x.shape[-1] % n:
        raise ValueError(f"tensor parallelism: the last dimension {x.shape[-1]} does not split into {n} parts")
    return x.chunk(n, dim=-1)[mpu.get_model_parallel_rank()].contiguous()


def _gather_last(x):
    group = _group()
    if group is None:
        return x
    moved = x.movedim(-1, 0).contiguous()  # allgather concatenates along the first dimension
    return hvd.allgather(moved, process_set=group).movedim(0, -1).contiguous()


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return _allreduce(grad)


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _allreduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _split_last(x)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last(grad)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _gather_last(x)

    @staticmethod
    def backward(ctx, grad):
        return _split_last(grad)


def copy_to_model_parallel_region(x):
    """Identity forward; the gradient is summed over the tensor-parallel ranks."""
    return _Copy.apply(x)


def reduce_from_model_parallel_region(x):
    """Sum over the tensor-parallel ranks; identity backward."""
    return _Reduce.apply(x)


def scatter_to_model_parallel_region(x):
    """This rank's slice of the last dimension; the gradient is gathered back."""
    return _Scatter.apply(x)


def gather_from_model_parallel_region(x):
    """The slices of every tensor-parallel rank joined along the last dimension."""
    return _Gather.apply(x)
