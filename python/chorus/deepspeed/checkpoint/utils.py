"""deepspeed.checkpoint.utils"""
import torch


def clone_tensors_for_torch_save(item, device=torch.device("cpu")):
    """A copy of item (tensors, and lists, tuples and dicts of them) whose tensors
    own their storage on device, so torch.save writes only what they hold, not the
    flat buffers their views come from."""
    if torch.is_tensor(item):
        if type(device) is str:
            device = torch.device(device)
        if device == item.device:
            return item.detach().clone()
        return item.detach().to(device)
    if isinstance(item, list):
        return [clone_tensors_for_torch_save(v, device) for v in item]
    if isinstance(item, tuple):
        return tuple(clone_tensors_for_torch_save(v, device) for v in item)
    if isinstance(item, dict):
        return type(item)({k: clone_tensors_for_torch_save(v, device) for k, v in item.items()})
    return item
