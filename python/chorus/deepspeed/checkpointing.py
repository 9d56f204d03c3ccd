"""Activation checkpointing as ``deepspeed.checkpointing``: checkpoint(function, *args)
recomputes function's activations in the backward pass instead of keeping them."""
import torch
import torch.utils.checkpoint


def checkpoint(function, *args):
    """function(*args), with its inner activations dropped after the forward pass and
    recomputed (with the same RNG state) when the backward pass needs them."""
    if not torch.is_grad_enabled() or not any(torch.is_tensor(a) and a.requires_grad for a in args):
        return function(*args)
    return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=True)
