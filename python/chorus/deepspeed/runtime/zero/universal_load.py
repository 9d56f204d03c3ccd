"""load_checkpoint of a universal checkpoint (checkpoint/universal.py): every parameter whole,
so each rank takes its tensor-parallel slice (along the parameter's partition_dim, at this
engine's tensor-parallel rank and size) and, of that, its ZeRO pieces; the optimizer's
state the same way; counters, scheduler, buffers and client state from the model states."""
import torch

from chorus.deepspeed.checkpoint import ds_writer
from chorus.deepspeed.checkpoint.universal import UniversalCheckpoint
from chorus.deepspeed.runtime.utils import partition_dim
from chorus.deepspeed.runtime.zero.checkpoint_common import _agree
from chorus.deepspeed.runtime.zero.ds_checkpoint import Targets, expert_names, restore_states


def _slice(engine, param, whole, name, where, shape):
    """This engine's tensor-parallel slice (of `shape`) of a whole tensor."""
    shape = tuple(shape)
    if tuple(whole.shape) == shape:
        return whole
    tp = engine._tp if engine._mp_rank is not None else 1
    if whole.dim() == 1 and whole.numel() == ds_writer._numel(shape) * tp and len(shape) != 1:
        if tp == 1:  # (stored flat, as ds_to_universal stores ZeRO-3's)
            return whole.view(shape)
        raise ValueError(f"load_checkpoint: '{name}' is stored flat in the universal checkpoint {where}; its "
                         "tensor-parallel slices cannot be cut from it")
    dim = partition_dim(param) if engine._mp_rank is not None else None
    if dim is None or dim < 0:
        raise ValueError(f"load_checkpoint: the universal checkpoint {where} has '{name}' {tuple(whole.shape)}, the "
                         f"model {shape} and it is not a tensor-parallel parameter (partition_dim)")
    tp, rank = engine._tp, engine._mp_rank
    if whole.shape[dim] % tp or tuple(whole.shape[:dim]) + (whole.shape[dim] // tp,) + tuple(whole.shape[dim + 1:]) \
            != shape:
        raise ValueError(f"load_checkpoint: '{name}' is {tuple(whole.shape)} in the universal checkpoint {where}; "
                         f"cut into {tp} along dimension {dim} it does not give this slice's {shape}")
    size = whole.shape[dim] // tp
    return whole.narrow(dim, rank * size, size)


def load(engine, path, load_lr_scheduler_states):
    kind = engine._core_args[1]
    error = uc = None
    try:
        if engine._client is not None or kind not in ds_writer.STATE_KEYS:
            raise ValueError(f"load_checkpoint: {path} is a universal checkpoint; chorus reads it into engines "
                             "running their own Adam, AdamW, LAMB, Lion, Adagrad or SGD")
        from chorus.deepspeed.runtime import expert_parts
        if any(expert_parts._untrained(e) for _, _, e, _, _ in expert_parts._local_experts(engine)):
            raise ValueError(f"load_checkpoint: {path} is a universal checkpoint, which does not carry the experts' "
                             "frozen parameters and buffers; load chorus's own checkpoint")
        uc = UniversalCheckpoint(path)
        missing = [n for n in engine._names + [n for p in engine._expert_parts for n in expert_names(engine, p)]
                   if not uc.has(n)]
        if missing:
            raise ValueError(f"load_checkpoint: the universal checkpoint {path} has no {missing[:3]} "
                             f"({len(missing)} of the model's parameters)")
    except Exception as e:  # noqa: BLE001 (every rank learns of one's failure)
        error = e
    _agree(engine.process_set, error, "reading the universal checkpoint", engine._pipe_set, verb="load_checkpoint")
    keys = ds_writer.STATE_KEYS[kind]
    error = None
    try:  # each expert group's parameters under their global numbers: experts re-placed at any ep size
        for part, names, params, shapes in [(None, engine._names, engine._params, engine._shapes)] + \
                [(p, expert_names(engine, p), p.params, p.shapes) for p in engine._expert_parts]:
            targets = Targets(engine, keys, part)
            for i, (name, param) in enumerate(zip(names, params)):
                got, _ = uc.read(name, keys)
                mine = {k: _slice(engine, param, v, name, path, shapes[i]).contiguous() for k, v in got.items()}
                targets.put(i, mine["fp32"], mine)
            if part is not None:
                part.core.optimizer_steps = uc.step(names[0]) or 0
    except Exception as e:  # noqa: BLE001
        error = e
    _agree(engine.process_set, error, "applying the universal checkpoint", engine._pipe_set, verb="load_checkpoint")
    restore_states(engine, uc.step(engine._names[0]), uc.scaler, uc.param_groups, uc.model_states,
                   load_lr_scheduler_states)
    ms = uc.model_states
    module = ms.get("module") or {}
    buffers = dict(engine.module.named_buffers())
    for name in ms.get("buffer_names") or []:
        if name in buffers and name in module and tuple(module[name].shape) == tuple(buffers[name].shape):
            buffers[name].data.copy_(module[name].to(buffers[name].dtype))
    params = dict(engine.module.named_parameters())
    with torch.no_grad():
        for name, value in module.items():  # the parameters not trained, from the module as saved
            p = params.get(name)
            if p is not None and not p.requires_grad and p.numel() and tuple(value.shape) == tuple(p.shape):
                p.data.copy_(value.to(p.dtype))
    from chorus.deepspeed.checkpoint.deepspeed_format import ENGINE_KEYS
    return path, {k: v for k, v in ms.items() if k not in ENGINE_KEYS}
