"""Committed training state: saved at commit(), restored after a failure, and
synchronized from rank 0 after every reset."""
import copy

from chorus.common.basics import rank
from chorus.common.elastic import HostsUpdatedInterrupt, ObjectState, State  # noqa: F401 (re-exported)
from chorus.torch.functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters


class _ModelHandler:
    def __init__(self, model):
        self.value = model
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)

    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_ModelHandler):
    def restore(self):
        # The step the failure cut short may have left gradient allreduces pending.
        clear = getattr(self.value, "_clear_pending", None)
        if clear is not None:
            clear()
        super().restore()

    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_ModelHandler):
    def sync(self):
        # The most any worker counts as processed, then rank 0's epoch for all.
        processed = max(allgather_object(self.value.processed_num))
        state = self.value.state_dict()
        state["processed_num"] = processed
        self.value.load_state_dict(broadcast_object(state))


def _handler(value):
    import torch

    from chorus.torch.elastic.sampler import ElasticSampler
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """A model, an optimizer, ElasticSamplers and plain values (epoch=..., batch=...)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for k, v in kwargs.items():
            h = _handler(v) if v is not None else None
            if h is not None:
                handlers[k] = h
            elif v is not None or k not in ("model", "optimizer"):
                plain[k] = v
        object.__setattr__(self, "_handlers", handlers)
        for k, h in handlers.items():
            object.__setattr__(self, k, h.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        for h in self._handlers.values():
            h.save()
        super().save()

    def restore(self):
        for h in self._handlers.values():
            h.restore()
        super().restore()

    def sync(self):
        for h in self._handlers.values():
            h.sync()
        super().sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
        object.__setattr__(self, name, value)
