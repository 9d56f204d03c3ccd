"""save_checkpoint / load_checkpoint in PyTorch's distributed checkpoint format (checkpoint/
dcp.py lays it out): the engine's side. A failure on one rank is an error on every rank;
`latest` is written after rank 0 has joined the ranks' metadata."""
import json
import os

import torch

from chorus import _core
from chorus.deepspeed.checkpoint import dcp, ds_pickle, ds_pickle_write as pw, ds_writer
from chorus.deepspeed.runtime.zero import checkpoint_io
from chorus.deepspeed.runtime.zero.checkpoint_common import _agree, _validate_tag
from chorus.deepspeed.runtime.zero.ds_checkpoint import Targets
from chorus.deepspeed.runtime.zero.ds_save import _refusal, fetcher, whole_of


def save(engine, save_dir, tag, client_state, save_latest, exclude_frozen_parameters=False):
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    _validate_tag(engine, tag)
    why = _refusal(engine, layout=False)
    if why is None and (engine._mp_rank is not None or engine._pipe_set is not None or engine._expert_parts):
        why = "MoE experts, tensor and pipeline slices are saved in chorus's own format or in DeepSpeed's layout so far"
    if why is not None:
        raise ValueError(f"save_checkpoint: checkpoint.format \"dcp\": {why.replace('deepspeed', 'dcp')}")
    dcp._require()
    ps = engine.process_set
    path = os.path.join(save_dir, tag)
    error = whole = None
    try:
        whole = whole_of(engine, client_state, exclude_frozen_parameters)
        whole.state_keys  # (the optimizer's state has names)
        os.makedirs(path, exist_ok=True)
    except Exception as e:  # noqa: BLE001
        error = e
    _agree(ps, error, "describing the checkpoint")
    try:
        dcp.write_rank(whole, fetcher(engine, whole.state_keys), path, ps.rank(), ps.size())
    except Exception as e:  # noqa: BLE001
        error = e
    _agree(ps, error, "writing the checkpoint")
    if ps.rank() == 0:
        try:
            dcp.join_metadata(path, ps.size())
            meta = {"global_steps": engine.global_steps, "global_samples": engine.global_samples,
                    "skipped_steps": engine.skipped_steps, "micro_steps": engine.micro_steps,
                    "lr_scheduler": whole.lr_scheduler, "param_groups": whole.hypers,
                    "world": ps.size(), "stage": engine.core.stage}
            # The client state as torch.save writes it, read back through chorus's allowlist (never plain pickle).
            pw.save(dict(client_state), os.path.join(path, dcp.CLIENT_STATE))
            _core.write_checkpoint_file(os.path.join(path, dcp.CHORUS_STATE), json.dumps(meta), {})
        except Exception as e:  # noqa: BLE001
            error = e
    _agree(ps, error, "writing the checkpoint's metadata")
    checkpoint_io.commit(engine, lambda: _core.write_file_atomic(os.path.join(save_dir, "latest"), tag.encode())
                         if save_latest and ps.rank() == 0 else None)
    return True


def load(engine, path, load_lr_scheduler_states):
    error = ck = None
    kind = engine._core_args[1]
    try:
        if engine._expert_parts or engine._mp_rank is not None or engine._pipe_set is not None or \
                engine._client is not None or kind not in ds_writer.STATE_KEYS:
            raise ValueError(f"load_checkpoint: {path} is a DCP checkpoint; chorus reads it into data-parallel "
                             "engines running their own Adam, AdamW, LAMB, Lion, Adagrad or SGD so far")
        ck = dcp.DcpCheckpoint(path, engine._names)
        for name, shape in zip(engine._names, engine._shapes):
            if ck.shape(name) != tuple(shape):
                raise ValueError(f"load_checkpoint: the DCP checkpoint {path} has "
                                 f"{'no ' + repr(ck.prefix + name) if ck.shape(name) is None else ck.shape(name)}"
                                 f" for the model's parameter '{name}' {tuple(shape)}")
            for key in ds_writer.STATE_KEYS.get(kind, ()):  # (sizes checked before anything is allocated)
                have = ck.tensors.get(f"optimizer.state.{name}.{key}")
                if have is not None and tuple(have.size) != tuple(shape):
                    raise ValueError(f"load_checkpoint: the DCP checkpoint {path} has {key} of '{name}' "
                                     f"{tuple(have.size)}, not {tuple(shape)}")
    except Exception as e:  # noqa: BLE001 (every rank learns of it before reading)
        error = e
    _agree(engine.process_set, error, "reading the DCP checkpoint", verb="load_checkpoint")
    error = None
    try:
        client = _apply(engine, ck, path, kind, load_lr_scheduler_states)
    except Exception as e:  # noqa: BLE001 (one rank's failed read is every rank's)
        error = e
    _agree(engine.process_set, error, "applying the DCP checkpoint", verb="load_checkpoint")
    return path, client


def _apply(engine, ck, path, kind, load_lr_scheduler_states):
    keys = ds_writer.STATE_KEYS[kind]
    with_state = all(ck.has_state(n, k) for n in engine._names for k in keys)
    core = engine.core
    targets = Targets(engine, keys)
    chunk, size = [], 0
    for i in list(range(len(engine._names))) + [None]:  # whole parameters a chunk at a time
        if i is not None and (not chunk or size + ds_writer._numel(engine._shapes[i]) <= ds_writer.CHUNK_ELEMS):
            chunk.append(i)
            size += ds_writer._numel(engine._shapes[i])
            continue
        got = ck.read({engine._names[j]: ["fp32"] + (list(keys) if with_state else []) for j in chunk})
        for j in chunk:
            v = got[engine._names[j]]
            targets.put(j, v["fp32"], v if with_state else None)
        chunk, size = ([i], ds_writer._numel(engine._shapes[i])) if i is not None else ([], 0)
    step = ck.scalar(f"optimizer.state.{engine._names[0]}.step") if with_state else None
    core.optimizer_steps = int(step) if step is not None else 0
    buffers = dict(engine.module.named_buffers())
    wanted = {n: ["fp32"] for n in buffers if ck.shape(n) == tuple(buffers[n].shape) and buffers[n].numel()}
    params = dict(engine.module.named_parameters())
    wanted.update({n: ["fp32"] for n, p in params.items() if not p.requires_grad and p.numel() and
                   ck.shape(n) == tuple(p.shape)})
    if wanted:
        got = ck.read(wanted)
        with torch.no_grad():
            for n in wanted:
                target = buffers.get(n, params.get(n))
                target.data.copy_(got[n]["fp32"].to(target.dtype))
    client = {}
    side = os.path.join(path, dcp.CHORUS_STATE)
    if os.path.isfile(side):  # (a checkpoint chorus wrote: its counters, scheduler and client state)
        meta, blobs = _core.read_checkpoint_file(side)
        meta = json.loads(meta)
        engine.global_steps, engine.global_samples = meta["global_steps"], meta["global_samples"]
        engine.skipped_steps, engine.micro_steps = meta["skipped_steps"], meta["micro_steps"]
        for g, saved in zip(engine.optimizer.param_groups, meta["param_groups"]):
            g.update({k: tuple(v) if k == "betas" else v for k, v in saved.items()})
        if load_lr_scheduler_states and engine.lr_scheduler is not None and meta["lr_scheduler"] is not None:
            engine.lr_scheduler.load_state_dict(meta["lr_scheduler"])
        client = ds_pickle.load(os.path.join(path, dcp.CLIENT_STATE))
    return client
