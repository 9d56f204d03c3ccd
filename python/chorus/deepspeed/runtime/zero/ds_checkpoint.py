"""load_checkpoint of a folder DeepSpeed 0.19.8 saved (checkpoint/deepspeed_format.py reads
it into whole tensors): at any data-parallel size and ZeRO stage, each rank takes its
pieces of every parameter's fp32 master value and optimizer state, the 16-bit parameters
follow from the master, and the step count, the engine's counters, the LR scheduler,
the buffers and the client state come back as DeepSpeed restores them."""
import torch

import chorus.torch as hvd
from chorus.deepspeed.checkpoint.deepspeed_format import DeepSpeedCheckpoint
from chorus.deepspeed.checkpoint.ds_writer import STATE_KEYS


def _refuse(path, why):
    raise ValueError(f"load_checkpoint: {path} is a DeepSpeed checkpoint; {why}")


def load(engine, path, load_lr_scheduler_states):
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
    targets = Targets(engine, STATE_KEYS[engine._core_args[1]])
    for i, name in enumerate(engine._names):
        targets.put(i, ds.fp32[name], ds.states[name])
    restore_states(engine, ds.step, ds.scaler, ds.param_groups, ds.model_states, load_lr_scheduler_states)
    ms = ds.model_states
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
    kind = engine._core_args[1]
    if engine._client is not None or kind not in STATE_KEYS:
        _refuse(path, "chorus reads the state of DeepSpeed's Adam, AdamW, LAMB, Lion, Adagrad and SGD; this engine "
                f"runs {'a client optimizer' if engine._client is not None else repr(kind)}")
    if list(ds.names) != list(engine._names) or [tuple(s) for s in ds.shapes] != [tuple(s) for s in engine._shapes]:
        for k, (n, s) in enumerate(zip(engine._names, engine._shapes)):
            got = (ds.names[k], tuple(ds.shapes[k])) if k < len(ds.names) else None
            if got != (n, tuple(s)):
                _refuse(path, f"the model's parameter {k} is '{n}' {tuple(s)}, the checkpoint's is {got}")
        _refuse(path, f"it has {len(ds.names)} trainable parameters, the model {len(engine._names)}")
    missing = [k for k in STATE_KEYS[kind] if not ds.states or k not in next(iter(ds.states.values()))]
    if missing:
        have = sorted(next(iter(ds.states.values()))) if ds.states else []
        _refuse(path, f"this engine's {kind} needs the optimizer state {list(STATE_KEYS[kind])} for every "
                f"parameter; the checkpoint has {have} (saved by another optimizer?)")


class _DiskState:
    """One fp32 array of the partition that the engine keeps in a file (offload_optimizer nvme),
    sliced as a tensor is: reads and writes of [a:b) go through the engine a tile at a time."""

    device = torch.device("cpu")

    def __init__(self, core, k):
        self.core, self.k = core, k

    def __getitem__(self, s):
        return torch.from_numpy(self.core.read_state(self.k, s.start, s.stop - s.start))

    def __setitem__(self, s, value):
        flat = value.detach().to(torch.float32).reshape(-1).contiguous()
        if flat.numel() != s.stop - s.start:
            raise ValueError(f"state slice [{s.start}:{s.stop}) given {flat.numel()} values")
        self.core.write_state(self.k, s.start, flat.numpy())


def state_arrays(core, count):
    """The engine's fp32 master weights and its first `count` optimizer states over the partition."""
    if core.state_on_disk:
        return [_DiskState(core, k) for k in range(-1, count)]
    from chorus.deepspeed.runtime.engine import _view
    return [_view(core.master_view(), torch.float32)] + [_view(core.state_view(k), torch.float32)
                                                          for k in range(count)]


class Targets:
    """Where a whole parameter's values go in this rank's engine: its 16-bit parameter, and its
    pieces of the fp32 master and of the optimizer's state (keys, in the engine's order)."""

    def __init__(self, engine, keys):
        self.engine, self.core, self.keys = engine, engine.core, tuple(keys)
        self.master, *self.views = state_arrays(self.core, len(self.keys))
        rank = engine.process_set.rank() if self.core.stage > 0 else 0
        self.pieces = {}
        for param, poff, off, n in self.core.pieces_of(rank):
            self.pieces.setdefault(param, []).append((poff, off, n))

    @torch.no_grad()
    def put(self, i, fp32, states=None):
        """Parameter i's whole fp32 value (this engine's shape) and, if given, its state {key: tensor}."""
        value = fp32.to(self.engine.dtype).contiguous()  # (held while the engine copies it)
        self.core.assign_param(i, value.data_ptr())
        flat = fp32.reshape(-1)
        for poff, off, n in self.pieces.get(i, []):
            self.master[off:off + n] = flat[poff:poff + n].to(self.master.device)
            for key, view in zip(self.keys if states is not None else (), self.views):
                view[off:off + n] = states[key].reshape(-1)[poff:poff + n].to(view.device)


def restore_states(engine, step, scaler, param_groups, ms, load_lr_scheduler_states):
    """What DeepSpeed restores beside the tensors: the optimizer's step and settings (the LR
    included), fp16's dynamic loss scale, the engine's counters and the LR scheduler (ms: the
    model states' dict)."""
    core = engine.core
    core.optimizer_steps = step if step is not None else 0
    if engine.dtype == torch.float16 and scaler is not None:  # the dynamic loss scale goes on where it was
        hysteresis = scaler.get("cur_hysteresis")
        if hysteresis is None:
            hysteresis = int((engine._raw_config.get("fp16") or {}).get("hysteresis", 2))
        core.loss_scaler_state = (f"{float(scaler['cur_scale'])!r} {int(scaler.get('cur_iter', 0))} "
                                  f"{int(scaler.get('last_overflow_iter', -1))} {int(hysteresis)}")
    for group, saved in zip(engine.optimizer.param_groups, param_groups):
        group.update({k: tuple(saved[k]) if k == "betas" else saved[k]
                      for k in ("lr", "betas", "eps", "weight_decay") if k in saved and k in group})
    engine.global_steps = int(ms.get("global_steps", 0))
    engine.global_samples = int(ms.get("global_samples", engine.global_steps * engine.train_batch_size()))
    engine.skipped_steps = int(ms.get("skipped_steps", 0))
    if load_lr_scheduler_states and engine.lr_scheduler is not None and ms.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(ms["lr_scheduler"])
