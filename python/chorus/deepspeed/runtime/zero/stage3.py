"""ZeRO stage 3 on torch modules: a module's own parameters are gathered before its
forward (the next modules' are prefetched), released after it, gathered again before
its backward and released once their gradients are in."""
import torch

from chorus.deepspeed.runtime.views import view as _view
from chorus.deepspeed.runtime.zero.partition_parameters import external_parameters

_EMPTY = {}


def _empty(dtype, device):
    if (dtype, device) not in _EMPTY:
        _EMPTY[dtype, device] = torch.empty(0, dtype=dtype, device=device)
    return _EMPTY[dtype, device]




class _PreBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hooks, module, *outputs):
        ctx.hooks, ctx.module = hooks, module
        return outputs if len(outputs) > 1 else outputs[0]

    @staticmethod
    def backward(ctx, *grads):
        ctx.hooks.before_backward(ctx.module)
        return (None, None) + grads


class Stage3Hooks:
    def __init__(self, engine):
        self.engine = engine
        self.core = engine.core
        self.params = engine._params
        index = {id(p): i for i, p in enumerate(self.params)}
        self.owned = {}  # module -> indices of its own trainable parameters
        self.handles = []
        # A ZeRO-3 leaf (deepspeed.utils.set_z3_leaf_modules) owns its whole subtree's
        # parameters: its forward may read a child's without calling the child
        # (nn.MultiheadAttention reads out_proj.weight).
        inside_leaf = {id(sub) for m in engine.module.modules() if getattr(m, "_z3_leaf", False)
                       for sub in m.modules() if sub is not m}
        for m in engine.module.modules():
            if id(m) in inside_leaf:
                continue
            leaf = getattr(m, "_z3_leaf", False)
            own = [index[id(p)] for p in m.parameters(recurse=leaf) if id(p) in index]
            # Parameters another module owns that this one's forward uses (register_external_parameter).
            own += [index[id(p)] for p in external_parameters(m) if id(p) in index and index[id(p)] not in own]
            if own:
                self.owned[m] = own
                self.handles.append(m.register_forward_pre_hook(self._pre_forward))
                self.handles.append(m.register_forward_hook(self._post_forward))
        self.handles.append(engine.module.register_forward_hook(self._end_trace))
        self.module_of = {i: m for m, own in self.owned.items() for i in own}
        self.pending = {m: len(own) for m, own in self.owned.items()}
        self.trace, self.traced = [], False
        self.prefetched = 0  # parameters gathered ahead of their module (for tests and tuning)
        self.prefetch_elems = engine._cfg["prefetch_bucket_size"]
        self.max_live_elems = engine._cfg["max_live_parameters"]
        self.esize = torch.empty(0, dtype=engine.dtype).element_size()
        for i, p in enumerate(self.params):
            self._point(i, p)

    def detach(self):
        """Removes the module hooks (the engine is being rebuilt)."""
        for h in self.handles:
            h.remove()
        self.handles = []

    def _point(self, i, p):
        if self.core.persistent(i):
            p.data = _view(self.core.gathered(i), p.dtype, self._shape(i))
        else:
            p.data = _empty(p.dtype, self.engine.device)

    def _shape(self, i):
        return self.engine._shapes[i]

    def fetch(self, module):
        own = self.owned[module]
        self.core.gather_async(own)
        for i in own:
            p = self.params[i]
            if p.numel() == 0 or self.core.persistent(i):
                p.data = _view(self.core.gathered(i), p.dtype, self._shape(i))

    def release(self, module):
        for i in self.owned[module]:
            if not self.core.persistent(i):
                self.params[i].data = _empty(self.params[i].dtype, self.engine.device)
                self.core.release(i)

    def _prefetch(self, position, direction):
        budget, ahead = self.prefetch_elems, []
        live = self.core.live_bytes // self.esize
        k = position + direction
        while 0 <= k < len(self.trace) and budget > 0:
            for i in self.owned[self.trace[k]]:
                n = self.params[i].numel() or self._numel(i)
                if live + n > self.max_live_elems:
                    budget = 0
                    break
                ahead.append(i)
                budget -= n
                live += n
            k += direction
        if ahead:
            self.core.gather_async(ahead)
            self.prefetched += len(ahead)

    def _numel(self, i):
        n = 1
        for d in self._shape(i):
            n *= d
        return n

    def _pre_forward(self, module, inputs):
        if not self.traced:
            self.trace.append(module)
        else:
            try:
                self._prefetch(self.trace.index(module), +1)
            except ValueError:
                pass
        self.fetch(module)

    def _end_trace(self, module, inputs, output):
        self.traced = True  # the first forward recorded the order in which modules run

    def _post_forward(self, module, inputs, output):
        if torch.is_grad_enabled():
            wrapped = self._wrap(module, output)
            if wrapped is None:
                return None  # nothing to hang the re-gather on: keep the parameters until backward ends
            output = wrapped
        self.release(module)
        return output

    def _wrap(self, module, output):
        if torch.is_tensor(output):
            return _PreBackward.apply(self, module, output) if output.requires_grad else None
        if isinstance(output, (tuple, list)):
            idx = [k for k, o in enumerate(output) if torch.is_tensor(o) and o.requires_grad]
            if not idx:
                return None
            wrapped = _PreBackward.apply(self, module, *[output[k] for k in idx])
            wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
            out = list(output)
            for k, w in zip(idx, wrapped):
                out[k] = w
            return type(output)(out) if isinstance(output, tuple) else out
        return None

    def before_backward(self, module):
        try:
            self._prefetch(self.trace.index(module), -1)
        except ValueError:
            pass
        self.fetch(module)

    def grad_done(self, i):
        m = self.module_of[i]
        self.pending[m] -= 1
        if self.pending[m] == 0:
            self.release(m)

    def end_backward(self):
        for m, own in self.owned.items():
            self.pending[m] = len(own)
            self.release(m)
