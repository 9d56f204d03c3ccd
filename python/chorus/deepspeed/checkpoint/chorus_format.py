"""A checkpoint in chorus's own format (TAG/model_states.chorus and its shards), read offline
into whole tensors: what checkpoint/ds_writer.py needs to write it in DeepSpeed's layout.
Every shard is checked to belong to the save its model states name (as load_checkpoint
does); a missing piece of any parameter is an error naming it."""
import json
import os

import numpy as np
import torch

from chorus import _core
from chorus.deepspeed.checkpoint import ds_pickle, ds_writer
from chorus.deepspeed.runtime.zero.checkpoint import MODEL_STATES, mp_slices, read_model_states, shard_name

# The engine's optimizer numbering (src/zero/hyper.h), for checkpoints that predate optimizer_kind.
_KINDS = ["adam", "adamw", "sgd", "lion", "adagrad", "lamb"]


def is_chorus_checkpoint(path):
    return os.path.isfile(os.path.join(path, MODEL_STATES)) or bool(mp_slices(path))


def read(path, mp=None):
    """(Whole, {param index: {"fp32", state keys...: whole fp32 tensors}}, meta) of TAG folder
    `path` (mp: that tensor-parallel slice's, as the slice holds its parameters)."""
    if mp is None and mp_slices(path):
        raise ValueError(f"{path} holds tensor-parallel slices; chorus writes those in DeepSpeed's layout as a "
                         "universal checkpoint only (python -m chorus.deepspeed.checkpoint universal)")
    meta, blobs = read_model_states(path, mp)
    names, shapes = list(meta["param_names"]), [tuple(s) for s in meta["param_shapes"]]
    values, first = _read_shards(path, [shard_name(r, mp) for r in range(meta["shards"])], names, shapes,
                                 meta.get("save", ""))
    group_of = meta.get("param_group_of")
    for name, shape, value, group in _read_experts(path, meta, mp):  # (every expert under its global number)
        values[len(names)] = value
        names.append(name)
        shapes.append(shape)
        if group_of is not None:
            if group is None:
                raise ValueError(f"{path} predates the record of each expert's optimizer group; save it again")
            group_of = list(group_of) + [group]
    kind = meta.get("optimizer_kind") or _KINDS[int(first["optimizer"])]
    keys = ds_writer.STATE_KEYS.get(kind, ())
    for v in values.values():  # the engine's state 1 and 2 under the optimizer's names
        for k, src in zip(keys, ("state1", "state2")):
            v[k] = v.pop(src)
        v.pop("state1", None)
        v.pop("state2", None)
    dtype = getattr(torch, meta["dtype"].replace("torch.", ""))
    buffers = {}
    for name, bdtype, shape in meta["buffers"]:
        raw = np.frombuffer(blobs["buffer:" + name], dtype=np.uint8).copy()
        buffers[name] = torch.from_numpy(raw).view(getattr(torch, bdtype)).view(shape) if raw.size else \
            torch.empty(shape, dtype=getattr(torch, bdtype))
    frozen = {}
    for name, fdtype, shape in meta.get("frozen", []):
        raw = np.frombuffer(blobs["frozen:" + name], dtype=np.uint8).copy()
        frozen[name] = torch.from_numpy(raw).view(getattr(torch, fdtype)).view(shape) if raw.size else \
            torch.empty(shape, dtype=getattr(torch, fdtype))
    hypers = meta["param_groups"]
    if group_of is None:
        if len(hypers) != 1:
            raise ValueError(f"{path} predates the record of each parameter's optimizer group and has "
                             f"{len(hypers)} groups; save it again with this chorus to convert it")
        group_of = [0] * len(names)
    config = meta.get("ds_config") or {}
    scaler = ds_writer.scaler_state(first.get("loss_scaler"), config) if dtype == torch.float16 else None
    whole = ds_writer.Whole(
        names=names, shapes=shapes, group_of=group_of, hypers=hypers, kind=kind,
        step=int(first.get("optimizer_steps", 0)), dtype=dtype,
        module_keys=meta.get("module_keys") or names + list(frozen) + list(buffers), buffers=buffers, frozen=frozen,
        shared=meta.get("shared") or {}, global_steps=meta["global_steps"],
        global_samples=meta.get("global_samples", 0), skipped_steps=meta.get("skipped_steps", 0),
        lr_scheduler=meta.get("lr_scheduler"), data_sampler=meta.get("data_sampler"),
        random_ltd=meta.get("random_ltd"), config=config,
        client_state=ds_pickle.loads_plain(blobs["client_state"], f"{path}: the client state"),
        clip_grad=float(config.get("gradient_clipping", 0.0) or 0.0), scaler=scaler,
        held=meta.get("held_names"),
        sub_group_size=int((config.get("zero_optimization") or {}).get("sub_group_size", 1_000_000_000)))
    return whole, values, meta


def _read_shards(path, files, names, shapes, save):
    """({param index: {"fp32", "state1", "state2": whole fp32 tensors}}, the first shard's meta) of
    the parameters `names`, from shard files whose pieces cover each of them exactly."""
    first = None
    values = {i: None for i in range(len(names))}
    covered = [0] * len(names)
    for file in files:
        shard = os.path.join(path, file)
        if not os.path.isfile(shard):
            raise ValueError(f"{path}: the shard {file} is missing")
        smeta, sblobs = _core.read_checkpoint_file(shard)
        smeta = json.loads(smeta)
        if smeta.get("extra", "") != save:
            raise ValueError(f"{shard} belongs to another save than {path}'s model states")
        first = first or smeta
        data = {"fp32": np.frombuffer(sblobs["master"], dtype=np.float32)}
        for k, blob in (("state1", "state1"), ("state2", "state2")):
            if blob in sblobs:
                data[k] = np.frombuffer(sblobs[blob], dtype=np.float32)
        for param, p_off, q_off, count in smeta["pieces"]:
            if values[param] is None:
                values[param] = {k: torch.zeros(int(np.prod(shapes[param], dtype=np.int64))) for k in data}
            for k, arr in data.items():
                values[param][k][p_off:p_off + count] = torch.from_numpy(arr[q_off:q_off + count].copy())
            covered[param] += count
    for i, n in enumerate(names):
        if covered[i] != int(np.prod(shapes[i], dtype=np.int64)):
            raise ValueError(f"{path} is incomplete: parameter '{n}' has {covered[i]} of its "
                             f"{int(np.prod(shapes[i], dtype=np.int64))} values in the shards")
    return values, first


def _read_experts(path, meta, mp):
    """[(global name, shape, values, optimizer group)] of every expert of every expert group's shards."""
    from chorus.deepspeed.runtime import expert_parts
    out = []
    for group, info in (meta.get("experts") or {}).items():
        names, shapes = info["names"], [tuple(s) for s in info["shapes"]]
        counts = expert_parts.local_counts(names)
        for e in range(info["ep_size"]):
            files = [expert_parts.shard_name(group, e, d, mp if info.get("sliced") else None)
                     for d in range(info["shards"])]
            values, _ = _read_shards(path, files, names, shapes, meta.get("save", ""))
            groups = info.get("group_of") or [None] * len(names)
            out += [(expert_parts.global_name(n, e, counts), shapes[i], values[i], groups[i])
                    for i, n in enumerate(names)]
    return out


def read_whole(path):
    """read(path), with a tensor-parallel checkpoint's slices joined along each parameter's
    partition_dim: (Whole, values, meta, {name: the dimension it was cut along})."""
    slices = mp_slices(path)
    if not slices:
        whole, values, meta = read(path)
        return whole, values, meta, {}
    parts = [read(path, mp) for mp in slices]
    whole, values, meta = parts[0]
    world = meta.get("mp_world", 1)
    if slices != list(range(world)) or len({p[2].get("save") for p in parts}) != 1:
        raise ValueError(f"{path} is not one save of {world} tensor-parallel slices: it has slices {slices} from "
                         f"{len({p[2].get('save') for p in parts})} save(s)")
    dims = meta["partition_dims"]
    if any(info.get("sliced") for info in (meta.get("experts") or {}).values()):
        raise ValueError(f"{path} holds tensor-parallel experts; chorus joins the slices of other parameters only")
    cat_dims = {}
    for i, name in enumerate(whole.names[:len(dims)]):
        dim = dims[i]
        if dim is None:
            continue
        if dim < 0:
            raise ValueError(f"{path}: parameter '{name}' is tensor-parallel but its layer does not say along which "
                             "dimension (partition_dim)")
        shape = whole.shapes[i]
        values[i] = {k: torch.cat([p[1][i][k].view(p[0].shapes[i]) for p in parts], dim=dim).reshape(-1)
                     for k in values[i]}
        whole.shapes[i] = tuple(shape[:dim]) + (sum(p[0].shapes[i][dim] for p in parts),) + tuple(shape[dim + 1:])
        cat_dims[name] = dim
    return whole, values, meta, cat_dims



def pipeline_stages(save_dir, tag):
    """The TAG folders of a pipeline engine's save in chorus's format (pipe_stage_XX/TAG), or []."""
    import glob
    found = sorted(glob.glob(os.path.join(glob.escape(save_dir), "pipe_stage_[0-9][0-9]")))
    if found and [os.path.basename(f) for f in found] != [f"pipe_stage_{s:02d}" for s in range(len(found))]:
        raise ValueError(f"{save_dir} holds the pipeline stages {[os.path.basename(f) for f in found]}; some are "
                         "missing")
    return [os.path.join(f, tag) for f in found]


def read_stages(paths):
    """read_whole of each pipeline stage's folder, joined: every stage's parameters (a tied one,
    which several stages hold alike, once), buffers and frozen parameters."""
    whole, values, meta, cat_dims = read_whole(paths[0])
    for path in paths[1:]:
        w, v, m, c = read_whole(path)
        if m["global_steps"] != meta["global_steps"]:
            raise ValueError(f"{path} is at step {m['global_steps']}, {paths[0]} at {meta['global_steps']}: "
                             "not one save")
        for i, name in enumerate(w.names):
            if name not in whole.names:
                values[len(whole.names)] = v[i]
                whole.names.append(name)
                whole.shapes.append(w.shapes[i])
                whole.group_of.append(w.group_of[i])
        whole.module_keys += [k for k in w.module_keys if k not in whole.module_keys]
        whole.buffers.update(w.buffers)
        whole.frozen.update(w.frozen)
        whole.shared.update(w.shared)
        cat_dims.update(c)
    return whole, values, meta, cat_dims
