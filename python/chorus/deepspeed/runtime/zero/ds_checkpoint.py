"""load_checkpoint of a folder DeepSpeed 0.19.8 saved (checkpoint/deepspeed_format.py reads
it into whole tensors): at any data-parallel size and ZeRO stage, each rank takes its
pieces of every parameter's fp32 master value and Adam moments, the 16-bit parameters
follow from the master, and the step count, the engine's counters, the LR scheduler,
the buffers and the client state come back as DeepSpeed restores them."""
import torch

import chorus.torch as hvd
from chorus.deepspeed.checkpoint.deepspeed_format import DeepSpeedCheckpoint


def _refuse(path, why):
    raise ValueError(f"load_checkpoint: {path} is a DeepSpeed checkpoint; {why}")


def load(engine, path, load_lr_scheduler_states):
    from chorus.deepspeed.runtime.engine import _view
    error, ds = None, None
    try:
        ds = DeepSpeedCheckpoint(path, trainable=engine._names)
        _check(engine, ds, path)
    except Exception as e:  # noqa: BLE001 (a failure on one rank must reach every rank, not leave them waiting)
        error = e
    failed = hvd.allreduce(torch.tensor([1 if error else 0]), op=hvd.Sum, name="ckpt.ds.read",
                           process_set=engine.process_set)
    if error is not None:
        raise error
    if int(failed.item()):
        raise RuntimeError(f"load_checkpoint: another rank could not read the DeepSpeed checkpoint {path}")
    core = engine.core
    for i, name in enumerate(engine._names):  # the 16-bit parameters (and a first master) from the fp32 value
        value = ds.fp32[name].to(engine.dtype).contiguous()
        core.assign_param(i, value.data_ptr())
    master = _view(core.master_view(), torch.float32)
    states = [core.state_view(k) for k in (0, 1)]
    m, v = [None if s is None else _view(s, torch.float32) for s in states]
    rank = engine.process_set.rank() if core.stage > 0 else 0
    with torch.no_grad():
        for param, poff, off, n in core.pieces_of(rank):
            name = engine._names[param]
            master[off:off + n] = ds.fp32[name].reshape(-1)[poff:poff + n].to(master.device)
            if ds.moments is not None:
                m[off:off + n] = ds.moments[name][0].reshape(-1)[poff:poff + n].to(m.device)
                v[off:off + n] = ds.moments[name][1].reshape(-1)[poff:poff + n].to(v.device)
    core.optimizer_steps = ds.step
    # The optimizer's settings as saved (DeepSpeed restores its param_groups, the LR included).
    for group, saved in zip(engine.optimizer.param_groups, ds.param_groups):
        group.update({k: tuple(saved[k]) if k == "betas" else saved[k]
                      for k in ("lr", "betas", "eps", "weight_decay") if k in saved and k in group})
    ms = ds.model_states
    engine.global_steps = int(ms.get("global_steps", 0))
    engine.global_samples = int(ms.get("global_samples", engine.global_steps * engine.train_batch_size()))
    engine.skipped_steps = int(ms.get("skipped_steps", 0))
    if load_lr_scheduler_states and engine.lr_scheduler is not None and ms.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(ms["lr_scheduler"])
    params = dict(engine.module.named_parameters())
    with torch.no_grad():
        for name, value in ds.frozen().items():  # parameters not trained, as DeepSpeed restores them
            if name in params and not params[name].requires_grad and params[name].numel():
                params[name].data.copy_(value.view(params[name].shape).to(params[name].dtype))
    buffers = dict(engine.module.named_buffers())
    for name in ms.get("buffer_names") or []:
        if name in buffers and name in ds.module:
            buffers[name].data.copy_(ds.module[name].to(buffers[name].dtype))
    return path, ds.client_state()


def _check(engine, ds, path):
    if engine._expert_parts or engine._mp_rank is not None or engine._pipe_set is not None:
        _refuse(path, "chorus reads DeepSpeed's checkpoints into data-parallel engines only (no MoE, pipeline or "
                "tensor parallelism yet)")
    if engine.core.loss_scale != 1.0 or engine.dtype == torch.float16:
        _refuse(path, "fp16 (its loss scaler's state) is not read yet; fp32 and bf16 are")
    if engine._client is not None or engine._core_args[1] not in ("adam", "adamw"):
        _refuse(path, "chorus reads DeepSpeed's Adam and AdamW state; this engine runs another optimizer")
    if list(ds.names) != list(engine._names) or [tuple(s) for s in ds.shapes] != [tuple(s) for s in engine._shapes]:
        for k, (n, s) in enumerate(zip(engine._names, engine._shapes)):
            got = (ds.names[k], tuple(ds.shapes[k])) if k < len(ds.names) else None
            if got != (n, tuple(s)):
                _refuse(path, f"the model's parameter {k} is '{n}' {tuple(s)}, the checkpoint's is {got}")
        _refuse(path, f"it has {len(ds.names)} trainable parameters, the model {len(engine._names)}")
    if ds.moments is None:
        _refuse(path, "it holds no Adam moments (exp_avg, exp_avg_sq) for every parameter")
