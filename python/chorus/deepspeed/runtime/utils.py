"""deepspeed.runtime.utils"""
import torch


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
