"""save_checkpoint in DeepSpeed 0.19.8's layout (`checkpoint.format: "deepspeed"`): the
engine's state as checkpoint/ds_writer.py lays it out, each rank writing its own ZeRO
files, rank 0 the model states and `latest` last, after every rank has written. Each
parameter's whole fp32 value and moments are gathered a chunk at a time (so a rank holds
its own DeepSpeed partition and one chunk, not the model)."""
import collections
import os

import torch

import chorus.torch as hvd
from chorus import _core
from chorus.deepspeed.checkpoint import ds_pickle_write as pw, ds_writer
from chorus.deepspeed.runtime import expert_parts
from chorus.deepspeed.runtime.zero import checkpoint_io
from chorus.deepspeed.runtime.zero.checkpoint_common import _agree, _buffers, _shared_names, _validate_tag


# DeepSpeed cuts each MoE parameter group into groups of at most this many elements (moe/utils.py)
MOE_MAX_GROUP = 178956971


def _refusal(engine, layout=True):
    parts = engine._expert_parts
    if parts and (engine._mp_rank is not None or len(parts) > 1 or
                  any(sum(int(torch.Size(s).numel()) for s in p.shapes) > MOE_MAX_GROUP for p in parts)):
        return ("MoE experts are written in DeepSpeed's layout for one expert-parallel size, without tensor "
                f"parallelism, in expert groups of at most {MOE_MAX_GROUP} elements (DeepSpeed cuts larger ones) so "
                "far; save in chorus's format (checkpoint.format \"chorus\") and convert it to a universal checkpoint")
    if engine._client is not None:
        return "a client optimizer's state has no DeepSpeed layout; the engine's own optimizers (from the config) do"
    if engine._core_args[1] not in ds_writer.STATE_KEYS:
        return f"the {engine._core_args[1]!r} optimizer's state is not written in DeepSpeed's layout"
    return ds_writer.layout_refusal(engine._raw_config) if layout and engine.core.stage in (1, 2) else None


def whole_of(engine, client_state, exclude_frozen_parameters):
    """What the checkpoint holds, but the parameters' values (fetch gives those)."""
    module = engine.module
    buffers = dict(_buffers(module))
    frozen = {} if exclude_frozen_parameters else {
        n: p for n, p in module.named_parameters() if not p.requires_grad and not expert_parts.is_expert_name(n)}
    shared = _shared_names(module)
    trained = set(engine._names)
    keys = [k for k in module.state_dict(keep_vars=True) if k in shared or k in buffers or k in frozen or k in trained]
    sampler = engine._curriculum_sampler()
    return ds_writer.Whole(
        names=list(engine._names), shapes=[tuple(s) for s in engine._shapes], group_of=list(engine._core_args[0]),
        hypers=[dict(g) for g in engine.optimizer.hypers()], kind=engine._core_args[1],
        step=int(engine.core.optimizer_steps), dtype=engine.dtype, module_keys=keys, buffers=buffers, frozen=frozen,
        shared=shared, global_steps=engine.global_steps, global_samples=engine.global_samples,
        skipped_steps=engine.skipped_steps,
        lr_scheduler=engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None and
        hasattr(engine.lr_scheduler, "state_dict") else None,
        data_sampler=sampler.state_dict() if sampler else None,
        random_ltd=engine.random_ltd_scheduler.state_dict() if engine.random_ltd_scheduler is not None else None,
        client_state=dict(client_state), config=dict(engine._raw_config), clip_grad=float(engine.gradient_clipping()),
        scaler=ds_writer.scaler_state(engine.core.loss_scaler_state, engine._raw_config)
        if engine.dtype == torch.float16 else None,
        held=[n for n in engine._given_param_names if not expert_parts.is_expert_name(n)]
        if getattr(engine, "_given_param_names", None) is not None else None,
        sub_group_size=int((engine._raw_config.get("zero_optimization") or {}).get("sub_group_size", 1_000_000_000)),
        **_model_parallel(engine), **_moe(engine))


def _expert_whole(engine, part):
    return ds_writer.Whole(
        names=list(part.names), shapes=[tuple(s) for s in part.shapes],
        group_of=list(engine._group_of(engine.optimizer_groups, part.params)),
        hypers=[dict(g) for g in engine.optimizer.hypers()], kind=engine._core_args[1],
        step=int(part.core.optimizer_steps), dtype=engine.dtype, module_keys=[], buffers={}, frozen={},
        config=dict(engine._raw_config), clip_grad=float(engine.gradient_clipping()))


def _moe(engine):
    """MoE: the expert groups' param_shapes (local names, alike on every rank) and each layer's experts."""
    if not engine._expert_parts:
        return {}
    shapes = []
    for part in engine._expert_parts:
        w = _expert_whole(engine, part)
        shapes += [collections.OrderedDict((w.names[i], torch.Size(w.shapes[i])) for i in idx) for _, idx in w.groups()]
    return dict(expert_shapes=shapes, num_experts=[m.num_experts for _, m in expert_parts._layers(engine.module).values()])


def expert_groups(engine, keys):
    """This rank's expert groups for ds_writer.write (each with a fetch over its own set)."""
    stage = engine.core.stage
    return [ds_writer.ExpertGroup(_expert_whole(engine, part), fetcher(engine, keys, part),
                                  part.data_set.size() if stage > 0 else 1, part.data_rank, part.ep_rank, part.name)
            for part in engine._expert_parts]


def _model_parallel(engine):
    """This engine's slice of the model (Whole's mp, pp, tp, layers, tp_rank), as DeepSpeed numbers
    it: mp_rank = stage x tp + tensor-parallel rank."""
    from chorus.deepspeed.runtime.pipe.module import PipelineModule
    from chorus.deepspeed.runtime.zero.ds_checkpoint import pipeline_prefixes
    module = engine.module
    tp, tp_rank = (engine._tp, engine._mp_rank) if engine._mp_rank is not None else (1, 0)
    if not isinstance(module, PipelineModule):
        return dict(mp=tp_rank, tp=tp)
    topo = module.topology()
    pp, stage = topo.get_dim("pipe"), module.stage_id
    tied = pipeline_prefixes(module)
    layers = {}
    from chorus.deepspeed.runtime.pipe.module import _TiedForward
    for idx, layer in zip(range(module._local_start, module._local_stop), module.forward_funcs):
        if isinstance(layer, torch.nn.Module) and not isinstance(layer, _TiedForward):  # (DeepSpeed's partial)
            layers[idx] = (tied.get(idx, f"{idx}."), list(layer.state_dict().keys()))
    return dict(mp=stage * tp + tp_rank, pp=pp, tp=tp, layers=layers,
                tp_rank=tp_rank if "model" in topo.get_axis_names() else None)


def fetcher(engine, keys, part=None):
    """fetch(indices): those parameters' whole fp32 values and states, on every rank (a
    collective over the process set: each rank sends the pieces it holds). part: an expert
    group's, over its expert-data-parallel set."""
    from chorus.deepspeed.runtime.zero.ds_checkpoint import state_arrays
    core, ps = (part or engine).core, (part.data_set if part is not None else engine.process_set)
    shapes = part.shapes if part is not None else engine._shapes
    views = state_arrays(core, len(keys))
    world = ps.size() if core.stage > 0 else 1
    pieces = [core.pieces_of(r) for r in range(world)]

    def fetch(indices):
        want = set(indices)
        mine = [p for p in pieces[ps.rank() if core.stage > 0 else 0] if p[0] in want]
        send = torch.cat([v[off:off + n].cpu() for v in views for _, _, off, n in mine]) if mine else torch.zeros(0)
        if world > 1:
            got = hvd.allgather(send, name="ckpt.ds.fetch", process_set=ps)
        else:
            got = send
        out = {i: {k: torch.zeros(ds_writer._numel(shapes[i])) for k in ("fp32",) + tuple(keys)}
               for i in indices}
        at = 0
        for r in range(world):
            held = [p for p in pieces[r] if p[0] in want]
            for k in ("fp32",) + tuple(keys):
                for param, poff, _, n in held:
                    out[param][k][poff:poff + n] = got[at:at + n]
                    at += n
        return out

    return fetch


def save(engine, save_dir, tag, client_state, save_latest, exclude_frozen_parameters=False, deferred=False):
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    _validate_tag(engine, tag)
    why = _refusal(engine)
    if why is not None:
        raise ValueError(f"save_checkpoint: checkpoint.format \"deepspeed\": {why}")
    ps = engine.process_set
    path = os.path.join(save_dir, tag)
    stage = engine.core.stage
    error = None
    try:
        whole = whole_of(engine, client_state, exclude_frozen_parameters)
        fetch = fetcher(engine, whole.state_keys)
    except Exception as e:  # noqa: BLE001 (every rank must learn of it before the collectives)
        error = e
    across = engine._pipe_set  # (the other model-parallel slices, each writing its own files)
    _agree(ps, error, "describing the checkpoint", across)
    ranks = [ps.rank()] if stage > 0 else ([0] if ps.rank() == 0 else [])
    sink = checkpoint_io.Snapshot() if deferred else None
    put = pw.save if sink is None else (lambda obj, where: sink.pickled(where, obj, save=pw.dump))
    try:
        ds_writer.write(whole, fetch, path, stage, ps.size(), ranks, save=put,
                        experts=expert_groups(engine, whole.state_keys))
        for file, state in expert_parts.expert_states(engine):  # (each expert by its first holder)
            put(state, os.path.join(path, file))
    except Exception as e:  # noqa: BLE001 (a write failure on one rank is an error on all; no `latest`)
        error = e
    _agree(ps, error, "copying the checkpoint" if deferred else "writing the checkpoint", across)

    def commit():
        if save_latest and ps.rank() == 0 and not engine._mp_rank:
            _core.write_file_atomic(os.path.join(save_dir, "latest"), tag.encode())

    if deferred:
        sink.start()
        engine._pending_save = checkpoint_io.Pending(sink, tag, commit, across)
        return True
    checkpoint_io.commit(engine, commit, across)
    return True
