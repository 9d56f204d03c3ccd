"""deepspeed.runtime.utils"""
import torch


def is_model_parallel_parameter(p):
    """A tensor-parallel slice (DeepSpeed's and Megatron's marks), not a parameter the slices hold alike."""
    return bool(getattr(p, "model_parallel", False) or getattr(p, "tensor_model_parallel", False))


def partition_dim(p):
    """Where a parameter's tensor-parallel slices split it (-1: not said), None when not sliced."""
    return getattr(p, "partition_dim", -1) if is_model_parallel_parameter(p) else None


def move_to_device(item, device, criterion_func=None):
    """item's tensors (in lists, tuples and dicts too) on device."""
    if torch.is_tensor(item) and (criterion_func is None or criterion_func(item)):
        return item.to(device)
    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    return item


def see_memory_usage(message, force=False):
    """DeepSpeed prints memory here; chorus's engine has memory_report()."""
