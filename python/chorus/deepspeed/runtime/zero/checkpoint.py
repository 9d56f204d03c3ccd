"""save_checkpoint / load_checkpoint: every rank writes its shard of the fp32 state
(C++), rank 0 the model-states file; `latest` is written last, so that it never
names an incomplete checkpoint. Every file is written atomically and carries a hash.
Under tensor parallelism each slice writes its own files (DeepSpeed's mp_rank_XX)."""
import json
import os
import pickle

import numpy as np
import torch

from chorus import _core
import chorus.torch as hvd
from chorus.deepspeed.runtime import expert_parts
from chorus.deepspeed.runtime.zero import checkpoint_io, client_state as client_optim
from chorus.deepspeed.runtime.zero.checkpoint_common import _agree, _buffers, _shared_names, _validate_tag
from chorus.deepspeed.runtime.utils import partition_dim

MODEL_STATES = "model_states.chorus"


def shard_name(rank, mp=None):
    return f"zero_rank_{rank:05d}{'' if mp is None else f'_mp_rank_{mp:02d}'}_optim_states.chorus"


def model_states_name(mp=None):
    return MODEL_STATES if mp is None else f"mp_rank_{mp:02d}_{MODEL_STATES}"


def mp_slices(path):
    """The tensor-parallel slices whose model states are in the folder (empty: none)."""
    import glob
    pattern = os.path.join(glob.escape(path), "mp_rank_[0-9][0-9]_" + MODEL_STATES)
    return sorted(int(os.path.basename(f)[8:10]) for f in glob.glob(pattern))


def _raw(b):
    return b.detach().reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes() if b.numel() else b""


def save(engine, save_dir, tag, client_state, save_latest, exclude_frozen_parameters=False, async_save=None):
    checkpoint_io.wait(engine)  # a save still in flight is finished and committed first
    deferred = checkpoint_io.async_requested(engine, async_save)
    fmt = checkpoint_format(engine)
    if fmt == "deepspeed":
        from chorus.deepspeed.runtime.zero import ds_save
        return ds_save.save(engine, save_dir, tag, client_state, save_latest, exclude_frozen_parameters, deferred)
    if fmt == "dcp":
        if deferred:
            raise ValueError("save_checkpoint: checkpoint.format \"dcp\" saves synchronously (DCP's own writer); "
                             "asynchronous saves write chorus's format or DeepSpeed's")
        from chorus.deepspeed.runtime.zero import dcp_io
        return dcp_io.save(engine, save_dir, tag, client_state, save_latest, exclude_frozen_parameters)
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    _validate_tag(engine, tag)
    path = os.path.join(save_dir, tag)
    ps, mp = engine.process_set, engine._mp_rank
    # This save's identity, in every file of it: a load refuses files of different saves.
    save_id = hvd.broadcast_object(os.urandom(8).hex() if ps.rank() == 0 else None, root_rank=ps.ranks[0]
                                   if ps.ranks else 0, process_set=ps, name="ckpt.id")
    if mp is not None:  # one identity for every slice (whole experts' shards span the slices)
        save_id = hvd.broadcast_object(save_id, root_rank=engine._pipe_set.ranks[0], process_set=engine._pipe_set,
                                       name="ckpt.id.slices")  # (not the tag: ranks may differ in it)
    identity = json.dumps({"tag": tag, "step": engine.global_steps, "save_id": save_id}, sort_keys=True)
    # checkpoint.use_node_local_storage: save_dir is each node's own disk, so the first rank
    # of each node also writes what rank 0 writes (the model states, stage 0's one shard, latest).
    first_on_node = _first_on_node(engine) if _node_local(engine) else False  # (collective: on every rank)
    writer = ps.rank() == 0 or first_on_node
    across = engine._pipe_set if mp is not None else None
    sink = checkpoint_io.Snapshot() if deferred else checkpoint_io.Writer()
    error = None
    try:
        os.makedirs(path, exist_ok=True)
        if engine.core.writes_shard:
            sink.shard(engine.core, os.path.join(path, shard_name(ps.rank(), mp)), identity)
        elif writer:  # (stage 0's replica)
            sink.shard(engine.core, os.path.join(path, shard_name(0, mp)), identity)
        client_optim.save(engine, path, identity, sink)
        expert_parts.save(engine, path, identity, sink)
    except Exception as e:  # noqa: BLE001 (any failure must reach every rank, not leave them waiting)
        error = e
    _agree(ps, error, "copying the checkpoint" if deferred else "writing the checkpoint", across)
    # The model states (the metadata) after every rank's shards (checkpoint.parallel_write's order).
    try:
        if writer:
            _save_model_states(engine, path, client_state, exclude_frozen_parameters, identity, sink)
    except Exception as e:  # noqa: BLE001
        error = e
    _agree(ps, error, "writing the model states", across)

    def commit():
        if save_latest and writer and not mp:  # one writer (per node with node-local storage): slice 0's
            _core.write_file_atomic(os.path.join(save_dir, "latest"), tag.encode())
            _write_consolidation_script(save_dir)

    if deferred:  # committed at a later step boundary, save or wait_for_checkpoint()
        sink.start()
        engine._pending_save = checkpoint_io.Pending(sink, tag, commit, across)
        return True
    checkpoint_io.commit(engine, commit, across)
    return True


def checkpoint_format(engine):
    """checkpoint.format (chorus's extension): "chorus" (the default), "deepspeed" or "dcp"."""
    fmt = str((engine._raw_config.get("checkpoint") or {}).get("format", "chorus")).lower()
    if fmt not in ("chorus", "deepspeed", "dcp"):
        raise ValueError(f"DeepSpeed config: 'checkpoint.format' {fmt!r} is not \"chorus\", \"deepspeed\" or "
                         "\"dcp\"")
    return fmt


def _node_local(engine):
    on = bool((engine._raw_config.get("checkpoint") or {}).get("use_node_local_storage", False))
    if on and (engine._expert_parts or engine._mp_rank is not None):
        raise ValueError("DeepSpeed config: 'checkpoint.use_node_local_storage' with MoE experts or tensor/pipeline "
                         "slices is not built yet (their files are read across nodes); save to shared storage")
    return on


def _first_on_node(engine):
    """Whether this rank is the first of its process set on its host (collective over the set)."""
    import socket
    hosts = hvd.allgather_object(socket.gethostname(), process_set=engine.process_set, name="ckpt.node_local.hosts")
    return hosts.index(hosts[engine.process_set.rank()]) == engine.process_set.rank()


def _write_consolidation_script(save_dir):
    """zero_to_fp32.py beside the checkpoints, as DeepSpeed leaves one:
    `python zero_to_fp32.py . pytorch_model.bin` consolidates them offline."""
    text = ('#!/usr/bin/env python\n"""Consolidates the ZeRO checkpoints in this folder into one fp32 state_dict:\n'
            '    python zero_to_fp32.py . pytorch_model.bin [-t TAG]\n(chorus\'s; needs chorus installed)."""\n'
            'import sys\n\nfrom chorus.deepspeed.utils.zero_to_fp32 import main\n\n'
            'if __name__ == "__main__":\n    sys.exit(main())\n')
    _core.write_file_atomic(os.path.join(save_dir, "zero_to_fp32.py"), text.encode())


def _jsonable(value):
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return None


def _save_model_states(engine, path, client_state, exclude_frozen_parameters, identity, sink):
    ps = engine.process_set
    meta = {
        "mp_world": engine._tp if engine._mp_rank is not None else 1,
        # per parameter: the dimension its slices split (None: held alike by every slice)
        "partition_dims": [partition_dim(p) for p in engine._params],
        "save": identity,
        "format": 1, "stage": engine.core.stage, "world": ps.size(), "dtype": str(engine.dtype),
        "shards": ps.size() if engine.core.stage > 0 else 1,
        "global_steps": engine.global_steps, "global_samples": engine.global_samples,
        "micro_steps": engine.micro_steps, "skipped_steps": engine.skipped_steps,
        "param_names": engine._names, "param_shapes": [list(s) for s in engine._shapes],
        "param_groups": engine.optimizer.hypers(),
        # what DeepSpeed's layout also needs (the converter: python -m chorus.deepspeed.checkpoint)
        "param_group_of": list(engine._core_args[0]), "optimizer_kind": engine._core_args[1],
        "module_keys": list(engine.module.state_dict(keep_vars=True).keys()),
        "shared": _shared_names(engine.module), "ds_config": _jsonable(engine._raw_config),
        "held_names": getattr(engine, "_given_param_names", None),
        "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None and
        hasattr(engine.lr_scheduler, "state_dict") else None,
        "experts": expert_parts.describe(engine),
        "random_ltd": engine.random_ltd_scheduler.state_dict() if engine.random_ltd_scheduler is not None else None,
        "data_sampler": engine._curriculum_sampler().state_dict() if engine._curriculum_sampler() else None,
        "buffers": [[n, str(b.dtype).replace("torch.", ""), list(b.shape)] for n, b in _buffers(engine.module)],
    }
    blobs = {"client_state": pickle.dumps(client_state)}
    for n, b in _buffers(engine.module):
        blobs["buffer:" + n] = _raw(b)
    if not exclude_frozen_parameters:
        for n, p in engine.module.named_parameters():
            if not p.requires_grad and not expert_parts.is_expert_name(n):
                blobs["frozen:" + n] = _raw(p)
                meta.setdefault("frozen", []).append([n, str(p.dtype).replace("torch.", ""), list(p.shape)])
    sink.file(os.path.join(path, model_states_name(engine._mp_rank)), json.dumps(meta), blobs)


def resolve_tag(load_dir, tag):
    if tag is not None:
        return str(tag)
    latest = os.path.join(load_dir, "latest")
    if not os.path.exists(latest):
        return None
    with open(latest) as f:
        return f.read().strip()


def read_model_states(path, mp=None):
    """(meta, blobs) of the model states of slice mp (None: a checkpoint without tensor
    parallelism), with a clear error when the folder holds the other kind."""
    if not os.path.exists(os.path.join(path, model_states_name(mp))):
        slices = mp_slices(path)
        if mp is None and slices:
            raise ValueError(f"checkpoint {path} was saved by {len(slices)} tensor-parallel slices "
                             f"(mp_rank_XX files): load it with the same tensor-parallel size, or choose a slice")
        if mp is not None and os.path.exists(os.path.join(path, MODEL_STATES)):
            raise ValueError(f"checkpoint {path} was saved without tensor parallelism; this engine is "
                             f"tensor-parallel slice {mp}")
    meta, blobs = _core.read_checkpoint_file(os.path.join(path, model_states_name(mp)))
    return json.loads(meta), blobs


def _read_checked(engine, path, mp):
    """The model states of this rank's slice, checked against the engine's parameters."""
    meta, blobs = read_model_states(path, mp)
    if mp is not None and meta.get("mp_world", 1) != engine._tp:
        raise ValueError(f"load_checkpoint: {path} was saved at tensor-parallel size {meta.get('mp_world', 1)}, "
                         f"this engine's is {engine._tp}")
    names, shapes = meta["param_names"], [tuple(s) for s in meta["param_shapes"]]
    if names != engine._names or shapes != engine._shapes:
        for k, (n, s) in enumerate(zip(engine._names, engine._shapes)):
            if k >= len(names) or names[k] != n or shapes[k] != s:
                got = f"'{names[k]}' {shapes[k]}" if k < len(names) else "nothing"
                raise ValueError(f"load_checkpoint: parameter {k} of the model is '{n}' {s}, the checkpoint has {got}")
        raise ValueError(f"load_checkpoint: the checkpoint has {len(names)} parameters, the model {len(engine._names)}")
    return meta, blobs


def load(engine, load_dir, tag, load_lr_scheduler_states):
    universal = bool((engine._raw_config.get("checkpoint") or {}).get("load_universal", False))
    if tag is None and universal and os.path.exists(os.path.join(load_dir, "latest_universal")):
        with open(os.path.join(load_dir, "latest_universal")) as f:  # (DeepSpeed's pointer to a universal save)
            tag = f.read().strip()
    tag = resolve_tag(load_dir, tag)
    if tag is None:
        import warnings
        warnings.warn(f"load_checkpoint: no 'latest' file in {load_dir}; nothing loaded")
        return None, None
    path = os.path.join(load_dir, tag)
    if not os.path.isdir(path):
        raise ValueError(f"load_checkpoint: checkpoint folder '{path}' does not exist")
    mp = engine._mp_rank
    from chorus.deepspeed.checkpoint.universal import is_universal_checkpoint
    if is_universal_checkpoint(path):
        from chorus.deepspeed.runtime.zero import universal_load
        return universal_load.load(engine, path, load_lr_scheduler_states)
    if universal:
        raise ValueError(f"load_checkpoint: checkpoint.load_universal is set but {path} is not a universal "
                         "checkpoint (no zero/optimizer_state.pt); make one with python -m "
                         "chorus.deepspeed.checkpoint universal, or DeepSpeed's ds_to_universal")
    from chorus.deepspeed.checkpoint.deepspeed_format import is_deepspeed_checkpoint
    if not os.path.exists(os.path.join(path, model_states_name(mp))) and is_deepspeed_checkpoint(path):
        from chorus.deepspeed.runtime.zero import ds_checkpoint
        return ds_checkpoint.load(engine, path, load_lr_scheduler_states)
    from chorus.deepspeed.checkpoint.dcp import is_dcp_checkpoint
    if not os.path.exists(os.path.join(path, model_states_name(mp))) and is_dcp_checkpoint(path):
        from chorus.deepspeed.runtime.zero import dcp_io
        return dcp_io.load(engine, path, load_lr_scheduler_states)
    error = meta = blobs = None
    try:
        meta, blobs = _read_checked(engine, path, mp)
    except (ValueError, OSError, RuntimeError) as e:
        error = e
    if mp is not None:  # each slice reads its own files: a failure on one must stop them all
        try:
            _agree(engine.process_set, error, "reading the model states", engine._pipe_set, verb="load_checkpoint")
        except RuntimeError:
            if error is not None:
                raise error from None
            raise
    elif error is not None:
        raise error
    client = error = None
    try:
        client = client_optim.read(engine, path, meta.get("save", ""))
    except (ValueError, OSError, RuntimeError) as e:
        error = e
    if engine._client is not None:  # every rank learns of one's failure before the shards' collectives
        try:
            _agree(engine.process_set, error, "reading the client optimizer's state", verb="load_checkpoint")
        except RuntimeError:
            if error is not None:
                raise error from None
            raise
    shards = range(meta["shards"])
    if _node_local(engine):  # each rank reads its own shard only: the others are on other nodes' disks
        ps = engine.process_set
        if meta["stage"] != engine.core.stage or meta["world"] != ps.size():
            raise ValueError(f"load_checkpoint: {path} is a node-local checkpoint (checkpoint.use_node_local_storage) "
                             f"of {meta['world']} ranks at ZeRO stage {meta['stage']}; this engine has "
                             f"{ps.size()} at stage {engine.core.stage}, and each rank reads only its own shard. Load "
                             "it at that size and stage, or save it to shared storage")
        shards = [ps.rank() if engine.core.stage > 0 else 0]
    engine.core.load_shards([os.path.join(path, shard_name(r, mp)) for r in shards], meta.get("save", ""))
    expert_parts.load(engine, path, meta.get("experts", {}), meta.get("save", ""))
    client_optim.apply(engine, client)
    for n, b in _buffers(engine.module):
        raw = blobs.get("buffer:" + n)
        if raw is None:
            raise ValueError(f"load_checkpoint: the checkpoint has no buffer '{n}'")
        if b.numel():
            b.data.reshape(-1).view(torch.uint8).copy_(torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy()))
    params = dict(engine.module.named_parameters())
    for n, dtype, shape in meta.get("frozen", []):
        if n in params and not params[n].requires_grad and params[n].numel():
            raw = np.frombuffer(blobs["frozen:" + n], dtype=np.uint8).copy()
            params[n].data.reshape(-1).view(torch.uint8).copy_(torch.from_numpy(raw))
    engine.global_steps = meta["global_steps"]
    engine.global_samples = meta["global_samples"]
    engine.micro_steps = meta["micro_steps"]
    engine.skipped_steps = meta["skipped_steps"]
    for g, saved in zip(engine.optimizer.param_groups, meta["param_groups"]):
        g.update({k: tuple(v) if k == "betas" else v for k, v in saved.items()})
    if engine.random_ltd_scheduler is not None and meta.get("random_ltd") is not None:
        engine.random_ltd_scheduler.load_state_dict(meta["random_ltd"])
    if engine._curriculum_sampler() is not None and meta.get("data_sampler") is not None:
        engine._curriculum_sampler().load_state_dict(meta["data_sampler"])
    if load_lr_scheduler_states and engine.lr_scheduler is not None and meta["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(meta["lr_scheduler"])
    return path, pickle.loads(blobs["client_state"])
