"""PipelineModule as DeepSpeed spells it: a list of layers (LayerSpec, TiedLayerSpec,
modules or callables) cut into stages; each rank builds only its own stage's layers."""
import re

import torch

from chorus.deepspeed.runtime.pipe.topology import PipeDataParallelTopology


class LayerSpec:
    """A layer built later, on the stage that runs it: typename(*args, **kwargs)."""

    def __init__(self, typename, *module_args, **module_kwargs):
        if not issubclass(typename, torch.nn.Module):
            raise ValueError(f"LayerSpec: {typename!r} is not a torch.nn.Module class")
        self.typename, self.module_args, self.module_kwargs = typename, module_args, module_kwargs

    def build(self):
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self):
        return f"LayerSpec({self.typename.__name__})"


class TiedLayerSpec(LayerSpec):
    """A layer whose weight (tied_weight_attr) is shared by every layer with the same
    key, on whatever stages they fall: one module per stage, kept equal across stages.
    forward_fn(module, x), when given, replaces module(x) (an output layer that uses
    the embedding's weight)."""

    def __init__(self, key, typename, *module_args, forward_fn=None, tied_weight_attr="weight", **module_kwargs):
        super().__init__(typename, *module_args, **module_kwargs)
        self.key, self.forward_fn = key, forward_fn
        self.tied_weight_attr = [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)


def _count_params(layer):
    if isinstance(layer, LayerSpec):
        # Built on the meta device would be cheaper; torch 1.13 lacks it for every layer.
        layer = layer.build()
    if isinstance(layer, torch.nn.Module):
        return sum(p.numel() for p in layer.parameters() if p.requires_grad)
    return 0


def _balanced(weights, parts):
    """Stage boundaries [0, b1, ..., len] that split weights into `parts` non-empty
    contiguous runs with the heaviest run as light as possible (as DeepSpeed's
    partition_balanced)."""
    n = len(weights)
    if parts > n:
        raise ValueError(f"PipelineModule: {n} layers cannot fill {parts} stages")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)

    def cut(limit):
        """Greedy runs no heavier than limit, leaving a layer for every later stage; None if impossible."""
        bounds, start = [0], 0
        for k in range(parts):
            last = n - (parts - k - 1)  # the furthest this run may reach
            end = start + 1  # every stage gets a layer
            if prefix[end] - prefix[start] > limit:
                return None
            while end < last and prefix[end + 1] - prefix[start] <= limit:
                end += 1
            bounds.append(end)
            start = end
        return bounds if bounds[-1] == n else None

    lo, hi = 0, prefix[-1]
    while lo < hi:
        mid = (lo + hi) // 2
        if cut(mid):
            hi = mid
        else:
            lo = mid + 1
    return cut(lo)


def partition(layers, parts, method):
    """DeepSpeed's partition_method: "parameters", "uniform" or "type:REGEX"."""
    method = method.lower()
    if method == "uniform":
        weights = [1] * len(layers)
    elif method == "parameters":
        weights = [_count_params(layer) for layer in layers]
    elif method.startswith("type:"):
        pattern = re.compile(method[5:], re.IGNORECASE)

        def name(layer):
            return layer.typename.__name__ if isinstance(layer, LayerSpec) else type(layer).__name__
        weights = [1 if pattern.search(name(layer)) else 0 for layer in layers]
        if not any(weights):
            raise ValueError(f"PipelineModule: no layer's type matches partition_method '{method}'")
    else:
        raise NotImplementedError(f"PipelineModule: partition_method '{method}' is not parameters, uniform or type:REGEX")
    return _balanced(weights, parts)


class PipelineModule(torch.nn.Module):
    def __init__(self, layers, num_stages=None, topology=None, loss_fn=None, seed_layers=False, seed_fn=None,
                 base_seed=1234, partition_method="parameters", activation_checkpoint_interval=0,
                 activation_checkpoint_func=None, checkpointable_layers=None):
        super().__init__()
        import chorus.torch as hvd
        if not hvd.is_initialized():
            from chorus.deepspeed import init_distributed
            init_distributed()
        if num_stages is None and topology is None:
            raise ValueError("PipelineModule: give num_stages or topology")
        world = hvd.size()
        if topology is None:
            if world % num_stages:
                raise ValueError(f"PipelineModule: {world} ranks cannot form {num_stages} pipeline stages of equal "
                                 f"data-parallel width (the world size must be a multiple of num_stages)")
            topology = PipeDataParallelTopology(num_pp=num_stages, num_dp=world // num_stages)
        self._topo = topology
        self.num_stages = topology.get_dim("pipe")
        if num_stages is not None and num_stages != self.num_stages:
            raise ValueError(f"PipelineModule: num_stages={num_stages} but the topology has {self.num_stages}")
        if topology.world_size() != world:
            raise ValueError(f"PipelineModule: the topology has {topology.world_size()} ranks, the job {world}")
        self.global_rank = hvd.rank()
        self.stage_id = topology.get_coord(self.global_rank).pipe
        self.loss_fn = loss_fn
        self._layer_specs = list(layers)
        self.seed_layers, self.seed_fn, self.base_seed = seed_layers, seed_fn, base_seed
        self.activation_checkpoint_interval = activation_checkpoint_interval
        self.activation_checkpoint_func = activation_checkpoint_func or _default_checkpoint
        self.checkpointable_layers = checkpointable_layers
        self.parts = partition(self._layer_specs, self.num_stages, partition_method)
        self._local_start, self._local_stop = self.parts[self.stage_id], self.parts[self.stage_id + 1]
        self.tied_modules = torch.nn.ModuleDict()
        self.tied_weight_attrs = {}
        self.forward_funcs = []
        self._build()

    def _build(self):
        for index in range(self._local_start, self._local_stop):
            layer = self._layer_specs[index]
            if self.seed_layers:
                (self.seed_fn or torch.manual_seed)(self.base_seed + index)
            if isinstance(layer, TiedLayerSpec):
                if layer.key not in self.tied_modules:
                    self.tied_modules[layer.key] = layer.build()
                    self.tied_weight_attrs[layer.key] = layer.tied_weight_attr
                module = self.tied_modules[layer.key]
                if layer.forward_fn is None:
                    self.forward_funcs.append(module)
                else:
                    self.forward_funcs.append(_TiedForward(layer.forward_fn, module))
            elif isinstance(layer, LayerSpec):
                module = layer.build()
                self.add_module(str(index), module)
                self.forward_funcs.append(module)
            elif isinstance(layer, torch.nn.Module):
                self.add_module(str(index), layer)
                self.forward_funcs.append(layer)
            elif callable(layer):
                self.forward_funcs.append(layer)
            else:
                raise ValueError(f"PipelineModule: layer {index} ({layer!r}) is not a LayerSpec, module or callable")

    def tied_keys_everywhere(self):
        """{key: sorted stages whose layers use it} for every TiedLayerSpec key."""
        where = {}
        for s in range(self.num_stages):
            for index in range(self.parts[s], self.parts[s + 1]):
                layer = self._layer_specs[index]
                if isinstance(layer, TiedLayerSpec):
                    where.setdefault(layer.key, set()).add(s)
        return {k: sorted(v) for k, v in where.items()}

    def tied_parameters(self, key):
        module = self.tied_modules[key]
        return [getattr(module, attr) for attr in self.tied_weight_attrs[key]]

    def _is_checkpointable(self, funcs):
        if self.checkpointable_layers is not None:
            return all(type(f).__name__ in self.checkpointable_layers for f in funcs)
        return any(isinstance(f, torch.nn.Module) and any(True for _ in f.parameters()) for f in funcs)

    def forward(self, forward_input):
        x = forward_input
        funcs = self.forward_funcs
        interval = self.activation_checkpoint_interval
        # As DeepSpeed: each layer takes the previous one's output as its one argument.
        if interval <= 0 or not torch.is_grad_enabled():
            for f in funcs:
                x = f(x)
            return x

        def run(start, stop):
            def chunk(*inputs):
                y = inputs[0] if len(inputs) == 1 else inputs
                for f in funcs[start:stop]:
                    y = f(y)
                return y
            return chunk

        for start in range(0, len(funcs), interval):
            stop = min(start + interval, len(funcs))
            inputs = x if isinstance(x, tuple) else (x,)
            if self._is_checkpointable(funcs[start:stop]):
                x = self.activation_checkpoint_func(run(start, stop), *inputs)
            else:
                x = run(start, stop)(*inputs)
        return x

    def topology(self):
        return self._topo

    def stage_owner(self, layer_idx):
        for s in range(self.num_stages):
            if self.parts[s] <= layer_idx < self.parts[s + 1]:
                return s
        raise ValueError(f"PipelineModule: layer {layer_idx} is out of range")


class _TiedForward(torch.nn.Module):
    def __init__(self, fn, module):
        super().__init__()
        self.fn, self.module = fn, module

    def forward(self, x):
        return self.fn(self.module, x)


def _default_checkpoint(function, *args):
    from chorus.deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint
    return checkpoint(function, *args)
