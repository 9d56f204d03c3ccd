"""Broadcasting model and optimizer state, and Python objects, from one rank."""
import pickle

import torch

from chorus.common.basics import global_process_set, rank
from chorus.torch.mpi_ops import allgather, broadcast_, broadcast_async_, synchronize


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites params in place with root_rank's values.

    params: a state_dict, a dict of tensors, a list of (name, tensor) or of tensors.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or hasattr(params, "__iter__"):
        items = list(params)
        if items and not isinstance(items[0], tuple):
            items = [(f"param.{i}", p) for i, p in enumerate(items)]
    else:
        raise ValueError(f"broadcast_parameters: unsupported params type {type(params).__name__}")
    handles = []
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            continue
        handles.append(broadcast_async_(p, root_rank, name=f"broadcast.parameter.{name}",
                                        process_set=process_set))
    for h in handles:
        synchronize(h)


def _dumps(obj):
    # Plain pickle (tensors pickle natively): torch.load's weights_only default in
    # torch >= 2.6 would refuse arbitrary objects.
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _loads(data):
    return pickle.loads(data)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's obj on every rank (serialized with pickle)."""
    name = name or type(obj).__name__
    if rank() == root_rank:
        payload = torch.frombuffer(bytearray(_dumps(obj)), dtype=torch.uint8)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
    else:
        size = torch.zeros(1, dtype=torch.int64)
    broadcast_(size, root_rank, name=f"broadcast_object.{name}.size", process_set=process_set)
    if rank() != root_rank:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"broadcast_object.{name}.data", process_set=process_set)
    return obj if rank() == root_rank else _loads(payload.numpy().tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's obj, in rank order."""
    name = name or type(obj).__name__
    payload = torch.frombuffer(bytearray(_dumps(obj)), dtype=torch.uint8)
    sizes = allgather(torch.tensor([payload.numel()], dtype=torch.int64),
                      name=f"allgather_object.{name}.size", process_set=process_set)
    data = allgather(payload, name=f"allgather_object.{name}.data", process_set=process_set)
    out, off = [], 0
    for s in sizes.tolist():
        out.append(_loads(data[off:off + s].numpy().tobytes()))
        off += s
    return out


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Makes every rank's optimizer state (step counts, moments, hyperparameters) root_rank's."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS")
    state = broadcast_object(optimizer.state_dict(), root_rank, name="optimizer_state",
                             process_set=process_set)
    if rank() != root_rank:
        optimizer.load_state_dict(state)
