"""The MoE side of the engine: each expert group's parameters in a ZeRO engine of
their own, over that group's expert-data-parallel set (the ranks holding the
same experts), so that their gradients are reduced and their optimizer states
partitioned there, not over every rank. The shared parameters stay in the main
engine. All of them step with one gradient norm, the whole model's: each engine's
sum of squares over its set, the experts' summed over the expert-parallel set."""
import os

import torch

from chorus import _core
import chorus.torch as hvd
from chorus.deepspeed.moe.utils import is_moe_param
from chorus.deepspeed.runtime import config as ds_config
from chorus.deepspeed.runtime.utils import is_model_parallel_parameter, partition_dim
from chorus.deepspeed.utils import groups as ds_groups


def split(params, names):
    """(shared (params, names), {group name: (params, names)}) in model order."""
    shared, experts = ([], []), {}
    for p, n in zip(params, names):
        if is_moe_param(p):
            ps, ns = experts.setdefault(getattr(p, "group_name", None) or "ep_size_1", ([], []))
            ps.append(p)
            ns.append(n)
        else:
            shared[0].append(p)
            shared[1].append(n)
    return shared, experts


def _ep_size(name):
    try:
        return int(name.split("_")[2])
    except (IndexError, ValueError):
        raise ValueError(f"deepspeed.initialize: expert parameters carry group_name '{name}'; "
                         "expected ep_size_<N> (set by deepspeed.moe.layer.MoE)") from None


class ExpertPart:
    """One expert group: its parameters, their engine and the sets it runs over."""

    def __init__(self, engine, name, params, names):
        self.name = name
        self.params, self.names = params, names
        self.shapes = [tuple(p.shape) for p in params]
        ep = _ep_size(name)
        if name not in ds_groups._get_expert_parallel_group_dict():
            ds_groups._create_expert_and_data_parallel(ep, use_data_before_expert_parallel_=_data_first(engine))
        self.ep_set = ds_groups._get_expert_parallel_group(name)
        self.data_set = ds_groups._get_expert_data_parallel_group(name)
        self.ep_rank = ds_groups._get_expert_parallel_rank(name)
        self.data_rank = ds_groups._get_expert_data_parallel_rank(name)
        # Tensor-parallel experts: their norm spans the slices (a parameter the slices hold
        # alike counts once), as the dense parameters' does.
        from chorus.deepspeed.moe.layer import MoE
        self.sliced = any(m.expert_group_name == name and m.deepspeed_moe.expert_tp for m in engine.module.modules()
                          if isinstance(m, MoE))
        tp_set = engine._pipe_set.process_set_id if self.sliced else -1
        weights = [1.0 if is_model_parallel_parameter(p) else 1.0 / engine._tp for p in params] \
            if self.sliced else []
        from chorus.torch.handles import _dtype_code
        self.core = _core.ZeroEngine(ds_config.per_rank(engine._raw_config, engine._cfg),
                                     self.data_set.process_set_id, _dtype_code(params[0], "ZeRO"),
                                     [int(torch.Size(s).numel()) for s in self.shapes],
                                     engine._group_of(engine.optimizer_groups, params), engine._core_args[1],
                                     tp_set, weights,
                                     [int(getattr(p, "chorus_priority", 0)) for p in params], *engine._core_device(),
                                     grad_factor=self.data_set.size() / engine.process_set.size())

    def attach(self, view, dtype):
        for i, p in enumerate(self.params):
            p.data = p.data.contiguous()
            self.core.load_param(i, p.data_ptr())
        self.core.finish_init()  # every holder of these experts starts from its set's first rank's values
        for i, p in enumerate(self.params):
            p.data = view(self.core.param_storage(i), dtype, self.shapes[i])

    def sum_squares(self, external=False):
        """This group's experts' share of the model's sum of squares: its set's, over the
        expert-parallel set (external: of the gradients an outside optimizer rewrote)."""
        local = self.core.external_set_sum_squares() if external else self.core.grad_sum_squares()
        s = torch.tensor([local], dtype=torch.float64)
        if self.ep_set.size() > 1:
            s = hvd.allreduce(s, op=hvd.Sum, name=f"moe.norm.{self.name}{'.x' if external else ''}",
                              process_set=self.ep_set)
        return float(s[0])


def _data_first(engine):
    """DeepSpeed's "use_data_before_expert_parallelism": the D + E layout."""
    return bool(engine._raw_config.get("use_data_before_expert_parallelism", False))


def check_layout(engine):
    """What MoE needs of the engine, with a clear error when it is not so."""
    if engine._cfg["stage"] >= 3:
        raise ValueError("deepspeed.initialize: MoE layers with ZeRO stage 3 are not supported by chorus "
                         "(nor by DeepSpeed for its own MoE layers); use stage 0, 1 or 2")
    from chorus.deepspeed.runtime.pipe.module import PipelineModule
    if isinstance(engine.module, PipelineModule):
        raise ValueError("deepspeed.initialize: MoE layers inside a PipelineModule are not supported by chorus "
                         "(as in DeepSpeed's pipeline engine); use expert x tensor x data parallel layouts")
    if engine.process_set.size() * engine._tp != hvd.size():
        raise ValueError(f"deepspeed.initialize: MoE layers need the data-parallel set times the tensor-parallel "
                         f"size ({engine._tp}) to be every rank ({hvd.size()}), got {engine.process_set.ranks}")


def make_parts(engine, experts):
    check_layout(engine)
    from chorus.deepspeed.moe.layer import MoE
    for m in engine.module.modules():  # collective: every rank's model has the same layers
        if isinstance(m, MoE):
            m.set_deepspeed_parallelism(_data_first(engine))
    return [ExpertPart(engine, name, ps, ns) for name, (ps, ns) in experts.items()]


def total_sum_squares(engine):
    """The whole model's sum of squares of its (loss-scaled) gradients, the same on every rank."""
    total = engine.core.grad_sum_squares()
    for part in engine._expert_parts:
        total += part.sum_squares()
    return total


# --- checkpoints -----------------------------------------------------------------------------
# Each expert group's fp32 state goes in shards of its own, one per rank of its
# expert-data-parallel set and per expert-parallel rank; each expert's weights also
# go where DeepSpeed puts them (layer_<L>_expert_<G>_mp_rank_00_model_states.pt).
# A parameter is known by (its experts module, its global expert, its name in the
# expert), so that a checkpoint loads at another expert-parallel size.
_MARK = ".deepspeed_experts."


def shard_name(group, ep_rank, data_rank, mp=None):
    """mp: the tensor-parallel slice, for experts that are sliced (else None)."""
    slice_ = "" if mp is None else f"_mp_rank_{mp:02d}"
    return f"expp_rank_{ep_rank}{slice_}_{group}_zero_rank_{data_rank:05d}_optim_states.chorus"


def expert_file(layer, expert, mp=0):
    return f"layer_{layer}_expert_{expert}_mp_rank_{mp if isinstance(mp, str) else f'{mp:02d}'}_model_states.pt"


def _slice_of(engine, sliced):
    return engine._mp_rank if sliced else None


def split_expert_name(name):
    """(experts module path, local expert, name in the expert) of an expert parameter's name."""
    at = name.index(_MARK)
    local, _, inner = name[at + len(_MARK):].partition(".")
    return name[:at + len(_MARK) - 1], int(local), inner


def describe(engine):
    """What the model-states file says of the expert groups (every rank's parts are named alike)."""
    return {part.name: {"ep_size": part.ep_set.size(), "names": part.names, "shapes": [list(s) for s in part.shapes],
                        "shards": part.data_set.size() if engine.core.stage > 0 else 1, "sliced": part.sliced,
                        "partition_dims": [partition_dim(p) for p in part.params],
                        "group_of": engine._group_of(engine.optimizer_groups, part.params)}
            for part in engine._expert_parts}


def global_name(name, ep_rank, local_counts):
    """A saved expert parameter's name with its global expert number (local_counts:
    experts per rank at each experts path)."""
    prefix, local, inner = split_expert_name(name)
    return f"{prefix}.{ep_rank * local_counts[prefix] + local}.{inner}"


def local_counts(names):
    """{experts path: experts per rank} from one rank's expert parameter names."""
    counts = {}
    for name in names:
        prefix, local, _ = split_expert_name(name)
        counts[prefix] = max(counts.get(prefix, 0), local + 1)
    return counts


def _layers(module):
    """{experts' path in parameter names: (MoE layer number, the MoE layer)} in model order."""
    from chorus.deepspeed.moe.layer import MoE
    out = {}
    for n, m in module.named_modules():
        if isinstance(m, MoE):
            out[(n + "." if n else "") + "deepspeed_moe.experts.deepspeed_experts"] = (len(out), m)
    return out


def _local_experts(engine):
    """(file name, key prefix, expert module, ep rank, data rank) of every expert this rank holds."""
    out = []
    for prefix, (number, moe) in _layers(engine.module).items():
        if moe.ep_size > 1 and moe.expert_group_name not in ds_groups._get_expert_parallel_group_dict():
            continue  # never set up (no forward, no trainable experts): nothing distinct to save
        name = moe.expert_group_name
        made = name in ds_groups._get_expert_parallel_group_dict()
        ep_rank = ds_groups._get_expert_parallel_rank(name) if made else 0
        data_rank = ds_groups._get_expert_data_parallel_rank(name) if made else hvd.rank()
        mp = engine._mp_rank if moe.deepspeed_moe.expert_tp else 0
        for j, expert in enumerate(moe.deepspeed_moe.experts.deepspeed_experts):
            g = ep_rank * moe.num_local_experts + j
            out.append((expert_file(number, g, mp), f"{prefix}.{g}.", expert, ep_rank, data_rank))
    return out


def is_expert_name(name):
    return _MARK in name


def save(engine, path, identity, sink):
    """Each group's shards; each expert's whole state (weights, frozen ones and buffers
    too) in its DeepSpeed-named file, by the first rank holding it."""
    for part in engine._expert_parts:
        if part.core.writes_shard:
            name = shard_name(part.name, part.ep_rank, part.data_rank, _slice_of(engine, part.sliced))
            sink.shard(part.core, os.path.join(path, name), identity)
    for file, state in expert_states(engine):
        sink.pickled(os.path.join(path, file), state)


def expert_states(engine):
    """(file, state) of each expert this rank writes: its whole state (weights, frozen ones and
    buffers) under its global number, by the first rank holding it."""
    for file, prefix, expert, _, data_rank in _local_experts(engine):
        if data_rank == 0:
            yield file, {prefix + k: v.detach().clone() for k, v in expert.state_dict().items()}


def _untrained(expert):
    """An expert's frozen parameters and buffers: what its shards do not hold."""
    return [(n, p) for n, p in expert.named_parameters() if not p.requires_grad] + \
        [(n, b) for n, b in expert.named_buffers() if b is not None]


def _load_untrained(engine, path):
    """The experts' frozen parameters and buffers from their files (the trained ones
    come from the shards), at whatever expert-parallel size they were saved."""
    for file, prefix, expert, _, _ in _local_experts(engine):
        wanted = _untrained(expert)
        if not wanted:
            continue
        where = os.path.join(path, file)
        state = torch.load(where)
        for n, t in wanted:
            if prefix + n not in state:
                raise ValueError(f"load_checkpoint: '{where}' has no '{prefix + n}'")
            t.data.copy_(state[prefix + n])


def load(engine, path, saved, identity):
    """Each expert group's state from the shards of every saved group that holds
    its experts, at whatever expert-parallel size they were saved."""
    layers = _layers(engine.module)
    if not layers:
        return
    if bool(saved) != bool(engine._expert_parts):
        raise ValueError(f"load_checkpoint: the checkpoint has {len(saved)} expert groups, the model "
                         f"{len(engine._expert_parts)}")
    plans = []
    for part in engine._expert_parts:
        mine = {}
        for i, name in enumerate(part.names):
            prefix, local, inner = split_expert_name(name)
            mine[(prefix, part.ep_rank * layers[prefix][1].num_local_experts + local, inner)] = i
        paths, maps = [], []
        for group, info in saved.items():
            ep = info["ep_size"]
            for e in range(ep):
                to = []
                for name in info["names"]:
                    prefix, local, inner = split_expert_name(name)
                    if prefix not in layers:
                        raise ValueError(f"load_checkpoint: the checkpoint's experts '{prefix}' are not in the model")
                    num = layers[prefix][1].num_experts
                    if num % ep:
                        raise ValueError(f"load_checkpoint: {num} experts at '{prefix}' do not divide over the "
                                         f"checkpoint's ep_size {ep}")
                    to.append(mine.get((prefix, e * (num // ep) + local, inner), -1))
                if any(t >= 0 for t in to):
                    for d in range(info["shards"]):
                        paths.append(os.path.join(path, shard_name(group, e, d,
                                                                   _slice_of(engine, info.get("sliced")))))
                        maps.append(to)
        if not paths:
            raise ValueError(f"load_checkpoint: no saved expert group holds the experts of '{part.name}'")
        plans.append((part, paths, maps))
    # Each expert-parallel rank reads other files: a missing one must stop every rank
    # before any starts the loads' collectives.
    needed = [p for _, paths, _ in plans for p in paths]
    needed += [os.path.join(path, file) for file, _, expert, _, _ in _local_experts(engine) if _untrained(expert)]
    missing = [p for p in needed if not os.path.isfile(p)]
    flags = hvd.allgather(torch.tensor([[len(missing)]], dtype=torch.int64), name="ckpt.experts.present")
    bad = [r for r, n in enumerate(flags.reshape(-1).tolist()) if n]
    if bad:
        mine = f" (here: {missing[0]})" if missing else ""
        raise ValueError(f"load_checkpoint: expert shards are missing on rank(s) {bad}{mine}")
    for part, paths, maps in plans:
        part.core.load_shards(paths, identity, maps)
    _load_untrained(engine, path)
