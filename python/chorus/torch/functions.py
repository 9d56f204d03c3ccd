"""Broadcasting model and optimizer state, and Python objects, from one rank."""
import torch

from chorus.common import objects
from chorus.common.basics import rank
from chorus.common.process_sets import _set_id, global_process_set
from chorus.torch.mpi_ops import broadcast_async_, synchronize


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


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's obj on every rank (serialized with pickle)."""
    return objects.broadcast_object(obj, root_rank, name or type(obj).__name__, _set_id(process_set))


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's obj, in rank order."""
    return objects.allgather_object(obj, name or type(obj).__name__, _set_id(process_set))


def broadcast_optimizer_state(optimizer, root_rank, process_set=global_process_set):
    """Makes every rank's optimizer state (step counts, moments, hyperparameters) root_rank's."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state does not support LBFGS")
    if not optimizer.state_dict()["state"]:
        # As Horovod: an optimizer that has not stepped gets its state from one step
        # on zero gradients (which stay, zeros rather than None): every gradient is
        # zeroed first, or a gradient left from an earlier step (a plain SGD's after an
        # elastic reset) would move this rank's weights alone. A DistributedOptimizer
        # takes it with its wrapped class's step, without collectives.
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
                    if isinstance(optimizer, torch.optim.SparseAdam):
                        p.grad = p.grad.to_sparse()
        distributed = type(optimizer).__module__ == "chorus.torch.optimizer" or hasattr(optimizer, "_handles")
        if distributed:
            super(type(optimizer), optimizer).step()
        else:
            optimizer.step()
    state = broadcast_object(optimizer.state_dict(), root_rank, name="optimizer_state",
                             process_set=process_set)
    if rank() != root_rank:
        optimizer.load_state_dict(state)
