"""DistributedOptimizer(op=Adasum): Horovod's delta optimizer.

Each rank applies its own optimizer step to a parameter as soon as that
parameter's gradient is ready, and the ranks combine the resulting updates
(new - old) with Adasum rather than averaging gradients: the wrapped optimizer's
own logic (momentum, Adam's moments) runs on local gradients, and the combined
update is applied to the parameter saved before the step.
"""
import contextlib

import torch

from chorus.torch.mpi_ops import Adasum, allreduce_async_, synchronize
from chorus.torch.optimizer_common import _live, last_pass, parameter_names


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        all_params = [p for g in self.param_groups for p in g["params"]]
        self._names = parameter_names(named_parameters, all_params)
        self._delay = {p: backward_passes_per_step for p in all_params}
        self._start = {p: torch.zeros_like(p, requires_grad=False) for p in all_params}
        self._handles = {}
        self._grad_accs = []
        self._requires_update = set()
        _live.add(self)
        for p in all_params:
            if p.requires_grad:
                self._requires_update.add(p)
                grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
                grad_acc.register_hook(self._make_hook(p))
                self._grad_accs.append(grad_acc)

    def _reset_in_flight(self):
        """Forgets the updates of a step that failed (an elastic reset follows)."""
        self._handles.clear()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def _make_hook(self, p):
        def hook(*_):
            self._handles[p] = self._step_and_reduce(p) if last_pass(self, p) else (None, None)
        return hook

    def _step_and_reduce(self, p):
        """Steps the wrapped optimizer on p alone, turns p into its update and starts
        the update's Adasum allreduce (in place, in p's own memory)."""
        start = self._start[p]
        start.data.copy_(p.data)
        saved = [g["params"] for g in self.param_groups]
        for g in self.param_groups:
            g["params"] = [p] if any(p is q for q in g["params"]) else []
        try:
            super(self.__class__, self).step()
        finally:
            for g, ps in zip(self.param_groups, saved):
                g["params"] = ps
        p.data.sub_(start)  # the update: zero where this rank had no gradient
        compressed, ctx = self._compression.compress(p.data)
        handle = allreduce_async_(compressed, name=self._names[p], op=Adasum, process_set=self._process_set)
        return handle, (compressed, ctx)

    def synchronize(self):
        """Nothing to wait for ahead of step(): the updates are combined there."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        raise AssertionError("skip_synchronize() does not apply to op=Adasum: step() combines the updates")

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        # Every parameter is reduced on every rank, so all issue the same collectives:
        # one this rank's loss did not reach has a zero update (Adasum's identity).
        for p in self._requires_update:
            if self._handles.get(p, (None, None))[0] is None:
                self._handles[p] = self._step_and_reduce(p)
        for p, (handle, (compressed, ctx)) in self._handles.items():
            update = self._compression.decompress(synchronize(handle), ctx)
            start = self._start[p]
            start.data.add_(update.data)
            p.data.copy_(start)
            self._delay[p] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step(); that races with the update allreduces")
        return super(self.__class__, self).zero_grad(*args, **kwargs)
