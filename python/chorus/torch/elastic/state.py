"""Committed training state: saved at commit(), restored after a failure, and
synchronized from rank 0 after every reset."""
import copy

from chorus import _core
from chorus.torch.basics import rank
from chorus.torch.functions import allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by commit()/check_host_updates() on every rank at once when the
    driver's host set changed; skip_sync: hosts were only removed, so the state
    every survivor holds is already the same."""

    def __init__(self, skip_sync):
        super().__init__("the job's hosts changed" + (" (removed only)" if skip_sync else ""))
        self.skip_sync = skip_sync


class State:
    def __init__(self, bcast_object=broadcast_object, get_rank=rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._last_updated = 0
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called after every reset (the world size may have changed)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._last_updated = 0  # the new round includes every change so far
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state (the point a failure rolls back to), then checks for new hosts."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt, on every rank at once, when hosts were added
        or removed since the last check. Rank 0's view decides for all."""
        count, removed_only = _core.elastic_host_updates()
        prev, last, removed_only = self._bcast_object((self._last_updated, count, removed_only))
        self._last_updated = last
        if last > prev:
            raise HostsUpdatedInterrupt(bool(removed_only))

    def save(self):
        raise NotImplementedError()

    def restore(self):
        raise NotImplementedError()

    def sync(self):
        raise NotImplementedError()

    def reset(self):
        pass


class ObjectState(State):
    """State made of attributes given as keyword arguments (epoch=0, batch=0, ...)."""

    def __init__(self, bcast_object=broadcast_object, get_rank=rank, **kwargs):
        self._saved_state = copy.deepcopy(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {k: copy.deepcopy(getattr(self, k)) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, copy.deepcopy(v))


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
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_ModelHandler):
    def sync(self):
        # Indices any worker processed count as processed, then rank 0's view for all.
        processed = set()
        for s in allgather_object(self.value.processed_indices):
            processed |= s
        state = self.value.state_dict()
        state["processed_indices"] = processed
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
