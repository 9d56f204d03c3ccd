"""DistributedOptimizer: allreduces gradients as backward produces them."""
import contextlib
import warnings

import torch

from chorus import _core
from chorus.common.process_sets import _set_id, global_process_set
from chorus.torch.compression import Compression
from chorus.torch.handles import _abandon, _dtype_code
from chorus.torch.mpi_ops import (Adasum, Average, Sum, _set_rank_and_size, allreduce_async_,
                                  grouped_allreduce_async_, sparse_allreduce_async, synchronize)
from chorus.torch.optimizer_adasum import _DistributedAdasumOptimizer
from chorus.torch.optimizer_common import _live, last_pass, parameter_names


class _Direct:
    """An in-place gradient allreduce started straight through the core (the common
    case: no compression, a contiguous CPU gradient), without the generic handle path."""
    __slots__ = ("work", "grad")

    def __init__(self, work, grad):
        self.work, self.grad = work, grad  # grad stays alive until the op completes


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, groups, sparse_as_dense, process_set, gradient_priorities=None):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        self._op = op
        self._predivide = gradient_predivide_factor
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step

        all_params = [p for g in self.param_groups for p in g["params"]]
        self._names = parameter_names(named_parameters, all_params)  # ops are "allreduce.<name>"
        self._priority = _priorities(gradient_priorities, all_params, self._names)

        self._groups = self._resolve_groups(groups, all_params)
        self._handles = {}
        self._delay = {p: backward_passes_per_step for p in all_params}
        self._group_ready = {}
        self._synchronized = False
        self._should_synchronize = True
        self._grad_accs = []
        _live.add(self)
        if _set_rank_and_size(process_set)[1] > 1:
            self._register_hooks()

    def _reset_in_flight(self):
        """Forgets the reductions of a step that failed (an elastic reset follows)."""
        self._handles.clear()
        self._group_ready.clear()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        self._synchronized = False

    @staticmethod
    def _resolve_groups(groups, all_params):
        if groups is None or groups == 0:
            return None
        if isinstance(groups, int):
            n = max(1, min(groups, len(all_params)))
            per = (len(all_params) + n - 1) // n
            return [all_params[i:i + per] for i in range(0, len(all_params), per)]
        resolved = [list(g) for g in groups]
        grouped = {id(p) for g in resolved for p in g}
        # Parameters in no group are reduced on their own.
        resolved += [[p] for p in all_params if id(p) not in grouped]
        return resolved

    def _register_hooks(self):
        self._group_of = {}
        if self._groups is not None:
            for gi, g in enumerate(self._groups):
                for p in g:
                    self._group_of[p] = gi
        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                # The hook sits on the gradient accumulator, so it fires when p's
                # gradient is final for this backward pass (works in torch 1.x and 2.x).
                p_tmp = p.expand_as(p)
                grad_acc = p_tmp.grad_fn.next_functions[0][0]
                grad_acc.register_hook(self._make_hook(p))
                self._grad_accs.append(grad_acc)

    def _make_hook(self, p):
        def hook(*_):
            handle, ctx = None, None
            if last_pass(self, p):
                if self._groups is None:
                    handle, ctx = self._allreduce_grad_async(p)
                else:
                    self._group_grad_ready(p)
                    return
            self._handles[p] = (handle, ctx)
        return hook

    def _scales(self):
        if self._op == Average and self._predivide != 1.0:
            return 1.0 / self._predivide, self._predivide
        return 1.0, 1.0

    def _grad_for_comm(self, p, grouped=False):
        g = p.grad
        if g.is_sparse:
            if grouped and not self._sparse_as_dense:
                raise ValueError(f"parameter {self._names[p]} has a sparse gradient, which groups cannot "
                                 "carry; pass sparse_as_dense=True to reduce it as a dense tensor")
            if self._sparse_as_dense:
                p.grad = g = g.to_dense()
        return g

    def _allreduce_grad_async(self, p):
        pre, post = self._scales()
        g = self._grad_for_comm(p)
        if g.is_sparse:  # gathered indices and values, as Horovod does
            return sparse_allreduce_async(g, self._names[p], self._op, self._process_set), (None, None)
        if self._compression is Compression.none and g.device.type == "cpu" and g.is_contiguous():
            ptr = g.data_ptr()
            work = _core.grouped_allreduce_async([ptr], [ptr], [_dtype_code(g, "allreduce")], [list(g.shape)],
                                                 "allreduce." + self._names[p], self._op, float(pre), float(post),
                                                 _set_id(self._process_set), self._priority[p], False)
            return _Direct(work, g), (g, None)
        compressed, ctx = self._compression.compress(g)
        handle = allreduce_async_(compressed, name=self._names[p], op=self._op, prescale_factor=pre,
                                  postscale_factor=post, process_set=self._process_set, priority=self._priority[p])
        return handle, (compressed, ctx)

    def _group_grad_ready(self, p):
        gi = self._group_of[p]
        ready = self._group_ready.setdefault(gi, [])
        ready.append(p)
        self._handles[p] = (None, None)
        if len(ready) < len(self._groups[gi]):
            return
        members = self._groups[gi]
        pre, post = self._scales()
        pairs = [self._compression.compress(self._grad_for_comm(q, grouped=True)) for q in members]
        handle = grouped_allreduce_async_([c for c, _ in pairs], name=self._names[members[0]] + ".group",
                                          op=self._op, prescale_factor=pre, postscale_factor=post,
                                          process_set=self._process_set,
                                          priority=max(self._priority[q] for q in members))
        for q, pair in zip(members, pairs):
            self._handles[q] = (handle, pair)
        del self._group_ready[gi]

    def synchronize(self):
        """Waits for every gradient allreduce and writes the results into p.grad."""
        if _set_rank_and_size(self._process_set)[1] <= 1 and not self._handles:
            self._synchronized = True
            return
        # Parameters whose hook did not fire this step are reduced now, so that all
        # ranks issue the same collectives; one this rank's loss never reached
        # contributes zeros, as another rank may have a gradient for it.
        for p in self._delay:
            if p.requires_grad and p not in self._handles:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                if self._groups is None:
                    self._handles[p] = self._allreduce_grad_async(p)
                else:
                    self._group_grad_ready(p)
        try:
            self._wait_for_handles()
        except BaseException:
            self._clear_pending()
            raise

    def _clear_pending(self):
        """Forgets the gradient allreduces in flight: after a failed or interrupted
        step (an elastic rollback), the next step starts afresh."""
        self._handles.clear()
        self._group_ready.clear()
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    def _wait_for_handles(self):
        done = {}
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                continue
            if isinstance(handle, _Direct):
                try:
                    handle.work.wait()
                except BaseException:
                    if not handle.work.poll():  # interrupted: the op still uses the gradient
                        _abandon(handle.work, handle)
                    raise
            elif callable(handle):  # a sparse gradient's gather
                p.grad = handle()
                self._delay[p] = self.backward_passes_per_step
                continue
            elif handle not in done:
                done[handle] = synchronize(handle)
            compressed, cctx = ctx
            if cctx is not None or compressed is not p.grad:
                p.grad.copy_(self._compression.decompress(compressed, cctx))
            self._delay[p] = self.backward_passes_per_step
        pending = [self._names[p] for p, (h, _) in self._handles.items() if h is None]
        self._handles.clear()
        if pending:
            raise AssertionError("gradients of a parameter group were not all ready: "
                                 + ", ".join(pending[:5]))
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside this block step() does not synchronize (call synchronize() yourself first)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # Starts with the phrase Horovod's warning has, which programs and tests match on.
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(): the gradients were reduced once already and are "
                              "not reduced again; wrap the step in `with optimizer.skip_synchronize():`")
            else:
                self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(); that races with the "
                                 "gradient allreduces")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def _priorities(spec, params, names):
    """Each parameter's gradient priority (higher goes first: ahead of lower ones
    ready in the same cycle, and between the chunks of a large one in flight)."""
    if spec is None:
        return {p: 0 for p in params}
    if spec == "layer_order":  # the first layers' gradients, which the next forward pass needs first
        return {p: len(params) - i for i, p in enumerate(params)}
    if isinstance(spec, dict):
        by_name = {names[p]: p for p in params}
        out = {p: 0 for p in params}
        for key, value in spec.items():
            p = by_name.get(key) if isinstance(key, str) else key
            if p is None or p not in out:
                raise ValueError(f"gradient_priorities: {key!r} is not a parameter of this optimizer")
            out[p] = int(value)
        return out
    raise ValueError(f"gradient_priorities must be None, 'layer_order' or a dict of parameter (or name) -> int, "
                     f"not {spec!r}")


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step=1, op=Average, gradient_predivide_factor=1.0,
                         num_groups=0, groups=None, sparse_as_dense=False,
                         process_set=global_process_set, gradient_priorities=None):
    """Wraps optimizer so that gradients are averaged across ranks before each step,
    with allreduces started from gradient hooks while backward is still running.
    gradient_priorities (chorus's own): 'layer_order' gives the parameters listed
    first (the first layers) the highest priority; or a dict parameter/name -> int."""
    if op not in (Average, Sum, Adasum):
        raise ValueError("DistributedOptimizer supports op=Average, op=Sum and op=Adasum")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    if num_groups and groups is not None:
        raise ValueError("give num_groups or groups, not both")
    if backward_passes_per_step < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    if op == Adasum:
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
                   dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, process_set)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups if groups is not None else num_groups,
               sparse_as_dense, process_set, gradient_priorities)
