"""DeepSpeed 0.19.8's checkpoint folder (TAG/), written from whole tensors: what its
`load_checkpoint`, its zero_to_fp32.py and the Hugging Face Trainer read.

The layout, as DeepSpeed's engine and ZeRO optimizers write it:
- without ZeRO: mp_rank_00_model_states.pt holds the module and the optimizer (a torch state
  per parameter in fp32; DeepSpeed's flat fp32 groups under bf16/fp16);
- ZeRO 1-2: each optimizer group's parameters end to end, padded at the end to a multiple
  of 2 x ranks, cut into equal partitions; rank R's ([bf16_]zero_pp_rank_R_mp_rank_00_
  optim_states.pt) holds its partition (without the padding) and its moments (with it);
- ZeRO 3: every parameter cut into ceil(numel / ranks) per rank, the last piece padded; each
  rank's pieces end to end in sub-groups of sub_group_size; each rank also writes
  zero_pp_rank_R_mp_rank_00_model_states.pt, its module's parameters empty.
`Whole` says what the checkpoint holds; `fetch(indices)` gives those parameters' whole fp32
values and optimizer state (a collective in an engine: every rank asks for the same indices
in the same order). Each rank in `ranks` gets its files; rank 0's model states come last."""
import collections
import math
import os
from dataclasses import dataclass, field

import torch

from chorus.deepspeed.checkpoint import ds_pickle_write as pw

DS_VERSION = "0.19.8"
# DeepSpeed's names for each optimizer's state (the engine's state 1 and state 2, in order).
STATE_KEYS = {"adam": ("exp_avg", "exp_avg_sq"), "adamw": ("exp_avg", "exp_avg_sq"),
              "lamb": ("exp_avg", "exp_avg_sq"), "lion": ("exp_avg",), "adagrad": ("exp_avg_sq",),
              "sgd": ("momentum_buffer",)}
CHUNK_ELEMS = 1 << 24  # parameters fetched per round (whole fp32 values and states): 64 MiB each


@dataclass
class Whole:
    names: list
    shapes: list
    group_of: list
    hypers: list  # each optimizer group's settings (lr, betas, eps, weight_decay, ...)
    kind: str
    step: int
    dtype: torch.dtype
    module_keys: list  # the module's state_dict keys, in order (parameters and persistent buffers)
    buffers: dict  # name -> tensor
    frozen: dict  # name -> whole tensor (parameters not trained)
    shared: dict = field(default_factory=dict)  # tied name -> the name holding it
    global_steps: int = 0
    global_samples: int = 0
    skipped_steps: int = 0
    lr_scheduler: object = None
    data_sampler: object = None
    random_ltd: object = None
    client_state: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    clip_grad: float = 0.0
    scaler: dict = None  # fp16: the dynamic loss scaler's state (DeepSpeed's names)
    sub_group_size: int = 1_000_000_000
    held: list = None  # the parameters DeepSpeed's own optimizer would hold, in order (frozen ones too)
    # Model parallelism: this slice (mp_rank_XX: pipeline stage x tensor-parallel rank) of pp x tp;
    # a pipeline stage's layers {index: (parameter prefix, the layer's state_dict keys)} go in
    # layer files (layer_XX[-model_YY]-model_states.pt; tp_rank None: no model axis in the name).
    mp: int = 0
    pp: int = 1
    tp: int = 1
    layers: dict = None
    tp_rank: int = None
    # MoE: the expert groups' param_shapes (this file's rank's local names) and each MoE layer's experts
    expert_shapes: list = None
    num_experts: list = None

    @property
    def state_keys(self):
        if self.kind not in STATE_KEYS:
            raise ValueError(f"DeepSpeed's checkpoint layout: chorus writes the state of Adam, AdamW, LAMB, Lion, "
                             f"Adagrad and SGD; this engine's optimizer is {self.kind!r}")
        return STATE_KEYS[self.kind]

    def groups(self):
        """Each optimizer group's parameter indices, in the engine's order (empty groups dropped)."""
        out = [[i for i, g in enumerate(self.group_of) if g == gi] for gi in range(len(self.hypers))]
        return [(gi, idx) for gi, idx in enumerate(out) if idx]


def scaler_state(state, config):
    """The engine's dynamic loss scaler (its "scale iteration last-overflow hysteresis-left")
    under DeepSpeed's DynamicLossScaler names, its settings from the config's fp16 section."""
    fp16 = config.get("fp16") or {}
    if float(fp16.get("loss_scale", 0) or 0) != 0:
        return {"cur_scale": float(fp16["loss_scale"]), "dynamic": False}
    scale, it, last, hyst = state.split()
    return {"cur_scale": float(scale), "cur_iter": int(it), "last_overflow_iter": int(last),
            "scale_factor": 2.0, "scale_window": int(fp16.get("loss_scale_window", 1000)),
            "min_scale": float(fp16.get("min_loss_scale", 1)), "delayed_shift": int(fp16.get("hysteresis", 2)),
            "cur_hysteresis": int(hyst), "consecutive_hysteresis": bool(fp16.get("consecutive_hysteresis", False)),
            "raise_error_at_min_scale": True, "dynamic": True, "dtype": torch.float16}


def _numel(shape):
    return int(math.prod(shape))


def _zero12_partition(total, world):
    """(partition size, the padded total) of a flat group, as DeepSpeed's ZeRO 1-2 cut it."""
    align = 2 * world
    padded = -(-total // align) * align
    return padded // world, padded


def _fetch_all(whole, fetch, order, use):
    """Calls use(i, values) for each parameter in order, fetching CHUNK_ELEMS at a time. A
    failure in use() is raised after the last fetch: fetch is a collective in an engine, and
    every rank must make all of them."""
    chunk, size, error = [], 0, None
    for i in order + [None]:
        if i is not None and (not chunk or size + _numel(whole.shapes[i]) <= CHUNK_ELEMS):
            chunk.append(i)
            size += _numel(whole.shapes[i])
            continue
        if chunk:
            got = fetch(chunk)
            for j in chunk:
                if error is None:
                    try:
                        use(j, got[j])
                    except Exception as e:  # noqa: BLE001 (raised once the others' fetches are met)
                        error = e
        chunk, size = ([i], _numel(whole.shapes[i])) if i is not None else ([], 0)
    if error is not None:
        raise error


def _param_group(hyper, params):
    g = {k: v for k, v in hyper.items() if k != "params"}
    if "betas" in g:
        g["betas"] = tuple(g["betas"])
    g.setdefault("bias_correction", True)
    g.setdefault("step", 0)
    g["params"] = list(params)
    return g


def _name(stage, rank, dtype, kind, mp=0):
    bf16 = "bf16_" if dtype == torch.bfloat16 else ""
    if kind == "model":
        return f"zero_pp_rank_{rank}_mp_rank_{mp:02d}_model_states.pt" if stage == 3 else \
            f"mp_rank_{mp:02d}_model_states.pt"
    return f"{bf16}zero_pp_rank_{rank}_mp_rank_{mp:02d}_optim_states.pt"


def _layer_files(whole, module_values, path, save):
    """A pipeline stage's layers, each in its own file under its own keys (DeepSpeed's
    PipelineModule.save_state_dict)."""
    from chorus.deepspeed.checkpoint.deepspeed_format import layer_file
    for idx, (prefix, keys) in sorted(whole.layers.items()):
        state = collections.OrderedDict()
        for k in keys:
            name = prefix + k
            if name in module_values:
                state[k] = module_values[name]
            elif name in whole.buffers:
                state[k] = whole.buffers[name].detach().cpu().clone()
            elif name in whole.frozen:
                state[k] = whole.frozen[name].detach().cpu().clone()
        save(state, os.path.join(path, layer_file(idx, whole.tp_rank)))


def _scaler(whole):
    return pw.loss_scaler(whole.scaler if whole.scaler else {"cur_scale": 1.0, "dynamic": False})


def layout_refusal(config):
    """Why DeepSpeed would lay this config's ZeRO groups out otherwise than written here, or None."""
    zero = config.get("zero_optimization") or {}
    for key, why in (("round_robin_gradients", "reorders each group's parameters"),
                     ("parameter_alignment", "pads each parameter")):
        if zero.get(key):
            return (f"with zero_optimization.{key} DeepSpeed {why} in its flat groups, which chorus does not "
                    "write yet; save in chorus's format (or a universal checkpoint), or leave the key out")
    return None


@dataclass
class ExpertGroup:
    """One MoE expert group, as this rank holds it: its Whole (local names), fetch, its
    expert-data-parallel size and this rank's place there, its expert-parallel rank, its name."""
    whole: Whole
    fetch: object
    world: int
    data_rank: int
    ep_rank: int
    name: str


def write(whole, fetch, path, stage, world, ranks, save=pw.save, experts=()):
    """The files of `ranks` (of `world`) for a checkpoint at ZeRO `stage` into folder `path`
    (each through save(obj, path)). experts: this rank's MoE expert groups (ExpertGroup); their
    state joins its ZeRO file (stages 1-2), or, without ZeRO, each expert-parallel rank's
    optimizer goes in expp_rank_E_mp_rank_XX_optim_states.pt (its first data-parallel rank's)."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"DeepSpeed's checkpoint layout: ZeRO stage {stage} does not exist")
    why = layout_refusal(whole.config) if stage in (1, 2) else None
    if why is not None:
        raise ValueError(f"DeepSpeed's checkpoint layout: {why}")
    keys = whole.state_keys
    if stage == 0:
        expp = [x for x in experts if x.data_rank == 0]
        files = _unpartitioned(whole, fetch, keys) if 0 in ranks or expp else None
        if files is not None:
            os.makedirs(path, exist_ok=True)
            module, opt = files
            for x in expp:  # (fetches without ZeRO are local: each rank holds its whole state)
                opt = merge_expert_optimizer(opt, _unpartitioned(x.whole, x.fetch, keys)[1], x.name)
            if expp:
                save({"optimizer": opt}, os.path.join(path, f"expp_rank_{expp[0].ep_rank}_mp_rank_{whole.mp:02d}"
                                                            "_optim_states.pt"))
            if 0 in ranks:
                if whole.layers is not None:
                    _layer_files(whole, module, path, save)
                save(_model_states(whole, stage, world, (module, opt)),
                     os.path.join(path, _name(0, 0, whole.dtype, "model", whole.mp)))
        return
    build = _zero12 if stage in (1, 2) else _zero3
    optim, module_parts = build(whole, fetch, keys, world, ranks, stage)
    for x in experts:
        if stage == 3:
            raise ValueError("DeepSpeed's checkpoint layout: MoE experts at ZeRO stage 3 (neither DeepSpeed's MoE "
                             "layers nor chorus's run there)")
        got, _ = _zero12(x.whole, x.fetch, keys, x.world, [x.data_rank], stage)
        for r in ranks:
            optim[r] = merge_experts(optim[r], got[x.data_rank], x.name)
    os.makedirs(path, exist_ok=True)  # (after the fetches: a failure here fails this rank's writes only)
    for r in ranks:
        sd = dict(optimizer_state_dict=optim[r], ds_config=whole.config, ds_version=DS_VERSION)
        save(sd, os.path.join(path, _name(stage, r, whole.dtype, "optim", whole.mp)))
        if stage == 3:
            save(_model_states(whole, stage, world, None, rank=r),
                 os.path.join(path, _name(3, r, whole.dtype, "model", whole.mp)))
    if stage in (1, 2) and 0 in ranks:
        if whole.layers is not None:
            _layer_files(whole, module_parts, path, save)
        save(_model_states(whole, stage, world, module_parts), os.path.join(path, _name(stage, 0, whole.dtype,
                                                                                            "model", whole.mp)))


def _unpartitioned(whole, fetch, keys):
    """(module values, the optimizer's state_dict) of a checkpoint without ZeRO."""
    module, per_param = {}, {}

    def use(i, v):
        module[whole.names[i]] = v["fp32"].to(whole.dtype).view(whole.shapes[i]).clone()
        per_param[i] = v

    _fetch_all(whole, fetch, list(range(len(whole.names))), use)
    if whole.dtype == torch.float32:  # DeepSpeed's optimizer steps the module's parameters
        held = whole.held or whole.names  # (numbered over what initialize gave it: frozen ones too by default)
        trained = {name: i for i, name in enumerate(whole.names)}
        state, groups = {}, []
        groups_ = whole.groups()
        for g, (gi, idx) in enumerate(groups_):
            mine = held if len(groups_) == 1 else [whole.names[i] for i in idx]
            first = sum(len(x["params"]) for x in groups)
            for n, name in enumerate(mine):
                if name in trained:
                    i = trained[name]
                    state[first + n] = {"step": whole.step,
                                        **{k: per_param[i][k].view(whole.shapes[i]).clone() for k in keys}}
            groups.append(_param_group(whole.hypers[gi], range(first, first + len(mine))))
        return module, {"state": state, "param_groups": groups}
    # 16-bit: DeepSpeed's FP16_Optimizer, a flat fp32 copy of each group
    flats, state, groups = [], {}, []
    for g, (gi, idx) in enumerate(whole.groups()):
        flats.append(torch.cat([per_param[i]["fp32"].reshape(-1) for i in idx]))
        state[g] = {"step": whole.step, **{k: torch.cat([per_param[i][k].reshape(-1) for i in idx]) for k in keys}}
        groups.append(_param_group(whole.hypers[gi], [g]))
    opt = {"optimizer_state_dict": {"state": state, "param_groups": groups}, "fp32_groups_flat": flats,
           "clip_grad": whole.clip_grad}
    if whole.dtype == torch.float16:
        s = whole.scaler or {}
        opt.update(dynamic_loss_scale=bool(s.get("dynamic")), cur_scale=s.get("cur_scale", 1.0),
                   cur_iter=s.get("cur_iter", 0), last_overflow_iter=s.get("last_overflow_iter", -1),
                   scale_factor=s.get("scale_factor", 2.0), scale_window=s.get("scale_window", 1000),
                   cur_hysteresis=s.get("cur_hysteresis"))  # (chorus's: DeepSpeed's FP16_Optimizer ignores it)
    return module, opt


def _zero12(whole, fetch, keys, world, ranks, stage):
    """Each rank's ZeRO 1-2 optimizer state_dict, and the module's 16-bit values (rank 0)."""
    groups = whole.groups()
    layout = []  # per group: (partition size, padded total, {param: offset in the group})
    for _, idx in groups:
        offsets, off = {}, 0
        for i in idx:
            offsets[i] = off
            off += _numel(whole.shapes[i])
        layout.append(_zero12_partition(off, world) + (offsets, off))
    where = {i: g for g, (_, idx) in enumerate(groups) for i in idx}
    parts = {r: [{k: torch.zeros(layout[g][0]) for k in ("fp32",) + keys} for g in range(len(groups))] for r in ranks}
    maps = {r: [collections.OrderedDict() for _ in groups] for r in ranks}
    module = {}

    def use(i, v):
        g = where[i]
        part, _, offsets, _ = layout[g]
        start, n = offsets[i], _numel(whole.shapes[i])
        if 0 in ranks:
            module[whole.names[i]] = v["fp32"].to(whole.dtype).view(whole.shapes[i]).clone()
        for r in ranks:
            lo, hi = max(start, r * part), min(start + n, (r + 1) * part)
            if lo >= hi:
                continue
            for k in ("fp32",) + keys:
                parts[r][g][k][lo - r * part:hi - r * part] = v[k].reshape(-1)[lo - start:hi - start]
            maps[r][g][whole.names[i]] = pw.fragment_address(hi - lo, lo - r * part)

    _fetch_all(whole, fetch, [i for _, idx in groups for i in idx], use)
    out = {}
    for r in ranks:
        paddings = []
        for part, padded, _, total in layout:
            left = r * part
            paddings.append(part if total <= left else max(0, left + part - total))
        out[r] = {
            "loss_scaler": _scaler(whole), "dynamic_loss_scale": bool((whole.scaler or {}).get("dynamic")),
            "overflow": False, "clip_grad": whole.clip_grad,
            "base_optimizer_state": {
                "state": {g: {"step": whole.step, **{k: parts[r][g][k] for k in keys}} for g in range(len(groups))},
                "param_groups": [_param_group(whole.hypers[gi], [g]) for g, (gi, _) in enumerate(groups)]},
            "single_partition_of_fp32_groups": [parts[r][g]["fp32"][:layout[g][0] - paddings[g]].clone()
                                                for g in range(len(groups))],
            "zero_stage": pw.zero_stage(stage), "group_paddings": paddings,
            "param_alignment_paddings": [[0] * len(idx) for _, idx in groups],
            "partition_count": [world] * len(groups), "ds_version": DS_VERSION, "param_slice_mappings": maps[r]}
    return out, module


def _sub_groups(whole, idx, world):
    """DeepSpeed's ZeRO-3 sub-groups of one optimizer group: parameters gathered until their
    partitions reach sub_group_size."""
    parts = [-(-_numel(whole.shapes[i]) // world) for i in idx]
    if whole.sub_group_size >= sum(parts):
        return [idx]
    out, cur, size = [], [], 0
    for i, p in zip(idx, parts):
        cur.append(i)
        size += p
        if size >= whole.sub_group_size or i == idx[-1]:
            out.append(cur)
            cur, size = [], 0
    return out


def _zero3(whole, fetch, keys, world, ranks, stage):
    """Each rank's ZeRO-3 optimizer state_dict (per sub-group flats), and the frozen parameters'
    pieces (whole ones are passed on)."""
    subs, hyper_of = [], []
    for gi, idx in whole.groups():
        for sub in _sub_groups(whole, idx, world):
            subs.append(sub)
            hyper_of.append(gi)
    pieces = {r: [{k: [] for k in ("fp32",) + keys} for _ in subs] for r in ranks}
    where = {i: s for s, sub in enumerate(subs) for i in sub}

    def use(i, v):
        n = _numel(whole.shapes[i])
        part = -(-n // world)
        for r in ranks:
            for k in ("fp32",) + keys:
                flat = v[k].reshape(-1)
                piece = torch.zeros(part)
                lo, hi = min(r * part, n), min((r + 1) * part, n)
                piece[:hi - lo] = flat[lo:hi]
                pieces[r][where[i]][k].append(piece)

    _fetch_all(whole, fetch, [i for sub in subs for i in sub], use)
    out = {}
    for r in ranks:
        flats = [torch.cat(pieces[r][s]["fp32"]) for s in range(len(subs))]
        state = {s: {"step": whole.step, **{k: torch.cat(pieces[r][s][k]) for k in keys}} for s in range(len(subs))}
        groups = []
        for gi in sorted(set(hyper_of)):
            groups.append(_param_group(whole.hypers[gi], [s for s in range(len(subs)) if hyper_of[s] == gi]))
        out[r] = {"zero_stage": pw.zero_stage(3), "loss_scaler": _scaler(whole),
                  "dynamic_loss_scale": bool((whole.scaler or {}).get("dynamic")), "overflow": False,
                  "partition_count": world, "optimizer_state_dict": {"state": state, "param_groups": groups},
                  "fp32_flat_groups": flats}
    return out, None


def _frozen_fragment(t, stage, world, rank):
    if stage < 3:
        return t.detach().cpu().clone()
    flat = t.detach().reshape(-1).cpu()
    part = -(-flat.numel() // world)
    piece = torch.zeros(part, dtype=t.dtype)
    lo, hi = min(rank * part, flat.numel()), min((rank + 1) * part, flat.numel())
    piece[:hi - lo] = flat[lo:hi]
    return piece


def _model_states(whole, stage, world, module_values, rank=0):
    optimizer = None
    if stage == 0:
        module_values, optimizer = module_values
    trained = set(whole.names)
    module = collections.OrderedDict()
    for key in whole.module_keys:
        if key in trained:
            module[key] = module_values[key] if stage < 3 else torch.empty(0, dtype=whole.dtype)
        elif key in whole.buffers:
            module[key] = whole.buffers[key].detach().cpu().clone()
        elif key in whole.frozen:
            module[key] = whole.frozen[key].detach().cpu().clone() if stage < 3 else \
                torch.empty(0, dtype=whole.frozen[key].dtype)
    for key in whole.module_keys:  # a tied parameter under each of its names (one storage), as torch saves it
        if key in whole.shared and whole.shared[key] in module:
            module[key] = module[whole.shared[key]]
    module = collections.OrderedDict((k, module[k]) for k in whole.module_keys if k in module)
    partitioned_grads = stage >= 2
    frozen_shapes = collections.OrderedDict((n, torch.Size(t.shape)) for n, t in whole.frozen.items())
    frozen_fragments = collections.OrderedDict((n, _frozen_fragment(t, stage, world, rank))
                                               for n, t in whole.frozen.items())
    state = dict(
        module=None if whole.layers is not None else module,  # (a pipeline's: in the layer files)
        buffer_names=[k for k in whole.module_keys if k in whole.buffers],
        optimizer=optimizer,
        param_shapes=None if stage == 0 else [
            collections.OrderedDict((whole.names[i], torch.Size(whole.shapes[i])) for i in idx)
            for _, idx in whole.groups()] + list(whole.expert_shapes or []),
        frozen_param_shapes=frozen_shapes if partitioned_grads else None,
        shared_params=None if stage == 0 else dict(whole.shared),
        frozen_param_fragments=frozen_fragments if partitioned_grads else None,
        lr_scheduler=whole.lr_scheduler, data_sampler=whole.data_sampler, random_ltd=whole.random_ltd,
        skipped_steps=whole.skipped_steps, global_steps=whole.global_steps, global_samples=whole.global_samples,
        dp_world_size=world, mp_world_size=whole.pp * whole.tp,
        checkpoint_parallel_dimensions={"pp_degree": whole.pp, "tp_degree": whole.tp},
        ds_config=whole.config, ds_version=DS_VERSION)
    if whole.num_experts is not None:
        state.update(num_experts=list(whole.num_experts), ds_autoep_layers=None)
    for k, v in (whole.client_state or {}).items():
        if k in state:
            raise KeyError(f"save_checkpoint: client_state key {k!r} is one of DeepSpeed's own checkpoint keys")
        state[k] = v
    return state


def merge_experts(main, experts, name):
    """A rank's ZeRO 1-2 optimizer dict with an expert group's appended (DeepSpeed's MoE parameter
    groups come after the others, each partitioned over its expert-data-parallel set)."""
    base, more = main["base_optimizer_state"], experts["base_optimizer_state"]
    n = len(base["param_groups"])
    base["state"].update({n + g: v for g, v in more["state"].items()})
    base["param_groups"] += [dict(pg, params=[n + g], moe=True, name=name) for g, pg in enumerate(more["param_groups"])]
    for key in ("single_partition_of_fp32_groups", "group_paddings", "param_alignment_paddings", "partition_count",
                "param_slice_mappings"):
        main[key] = list(main[key]) + list(experts[key])
    return main


def merge_expert_optimizer(main, experts, name):
    """An expert-parallel rank's optimizer state_dict without ZeRO: its shared parameters' groups,
    then its experts' (numbered after them)."""
    if "fp32_groups_flat" in main:  # (16-bit: flat groups, numbered by group)
        inner, more = main["optimizer_state_dict"], experts["optimizer_state_dict"]
        n = len(inner["param_groups"])
        inner["state"].update({n + g: v for g, v in more["state"].items()})
        inner["param_groups"] += [dict(pg, params=[n + g], moe=True, name=name)
                                  for g, pg in enumerate(more["param_groups"])]
        main["fp32_groups_flat"] = list(main["fp32_groups_flat"]) + list(experts["fp32_groups_flat"])
        return main
    n = sum(len(g["params"]) for g in main["param_groups"])
    main["state"].update({n + i: v for i, v in experts["state"].items()})
    main["param_groups"] += [dict(pg, params=[n + i for i in pg["params"]], moe=True, name=name)
                             for pg in experts["param_groups"]]
    return main
