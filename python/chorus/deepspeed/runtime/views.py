"""Tensors over the ZeRO engine's memory, in place (below the engine and its hooks, which
both use them)."""
import torch

from chorus import _core


def view(block, dtype, shape=None):
    """A tensor over engine memory: a numpy array (host memory) or a DeviceBlock (device
    memory, through __cuda_array_interface__)."""
    if isinstance(block, _core.DeviceBlock):
        t = torch.as_tensor(block, device=torch.device("cuda", block.device))
    else:
        t = torch.from_numpy(block)
    t = t.view(dtype)
    return t if shape is None else t.view(shape)
