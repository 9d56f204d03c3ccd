"""load_checkpoint of a folder DeepSpeed 0.19.8 saved (checkpoint/deepspeed_format.py reads
it into whole tensors): at any data-parallel size and ZeRO stage, each rank takes its
pieces of every parameter's fp32 master value and optimizer state, the 16-bit parameters
follow from the master, and the step count, the engine's counters, the LR scheduler,
the buffers and the client state come back as DeepSpeed restores them."""
import torch

from chorus.deepspeed.checkpoint.deepspeed_folder import DeepSpeedFolder
from chorus.deepspeed.checkpoint.ds_writer import STATE_KEYS
from chorus.deepspeed.runtime import expert_parts
from chorus.deepspeed.runtime.utils import partition_dim
from chorus.deepspeed.runtime.views import view as _view


def _refuse(path, why):
    raise ValueError(f"load_checkpoint: {path} is a DeepSpeed checkpoint; {why}")


def pipeline_prefixes(module):
    """{layer index: its parameters' prefix} of a PipelineModule's tied layers saved under their
    index (DeepSpeed's layer files hold each layer's own keys)."""
    from chorus.deepspeed.runtime.pipe.module import PipelineModule, TiedLayerSpec
    if not isinstance(module, PipelineModule):
        return {}
    return {i: f"tied_modules.{spec.key}." for i, spec in enumerate(module._layer_specs)
            if isinstance(spec, TiedLayerSpec) and spec.forward_fn is None}


def _slice_of(engine):
    """(tensor-parallel size, this engine's rank in it)."""
    return (engine._tp, engine._mp_rank) if engine._mp_rank is not None else (1, 0)


def load(engine, path, load_lr_scheduler_states):
    from chorus.deepspeed.runtime.zero.checkpoint_common import _agree
    error, ds = None, None
    across = engine._pipe_set
    try:
        trained = set(engine._names) | {n for p in engine._expert_parts for n in p.names}
        untrained = {n for n, _ in engine.module.named_parameters() if n not in trained}
        ds = DeepSpeedFolder(path, untrained=untrained, layers=pipeline_prefixes(engine.module))
        _check(engine, ds, path)
    except Exception as e:  # noqa: BLE001 (a failure on one rank must reach every rank, not leave them waiting)
        error = e
    try:
        _agree(engine.process_set, error, "reading the DeepSpeed checkpoint", across, verb="load_checkpoint")
    except RuntimeError:
        if error is not None:
            raise error from None
        raise
    tp, tp_rank = _slice_of(engine)
    keys = STATE_KEYS[engine._core_args[1]]
    error = None
    try:
        for part, names, params, shapes in [(None, engine._names, engine._params, engine._shapes)] + \
                [(p, expert_names(engine, p), p.params, p.shapes) for p in engine._expert_parts]:
            targets = Targets(engine, keys, part)
            for i, (name, param) in enumerate(zip(names, params)):
                fp32, states = ds.value(name, tuple(shapes[i]), tp, tp_rank, partition_dim(param))
                targets.put(i, fp32.contiguous(), {k: v.contiguous() for k, v in states.items()})
            if part is not None:
                part.core.optimizer_steps = ds.step
        _untrained(engine, ds, path, tp, tp_rank)
    except Exception as e:  # noqa: BLE001 (one stage's or slice's failure is every rank's)
        error = e
    _agree(engine.process_set, error, "applying the DeepSpeed checkpoint", across, verb="load_checkpoint")
    restore_states(engine, ds.step, ds.scaler, ds.param_groups, ds.model_states, load_lr_scheduler_states)
    return path, ds.client_state()


@torch.no_grad()
def _untrained(engine, ds, path, tp, tp_rank):
    """The parameters not trained and the buffers, as DeepSpeed restores them (the experts' from
    their files)."""
    module, frozen, names = ds.module_values(), ds.frozen(), ds.buffer_names()

    def piece(table, name, t):
        saved = table[name]
        pick = ds.cutter(name, [tuple(v.shape) for v in saved], tuple(t.shape), tp, tp_rank, partition_dim(t))
        t.data.copy_(pick(saved).to(t.dtype))

    for name, p in engine.module.named_parameters():
        if not p.requires_grad and p.numel() and name in frozen:
            piece(frozen, name, p)
    for name, b in engine.module.named_buffers():
        if b is not None and name in names and name in module:
            piece(module, name, b)
    saved = ds.slices[0].experts
    for _, prefix, expert, _, _ in expert_parts._local_experts(engine):
        for n, t in expert_parts._untrained(expert):
            if prefix + n not in saved:
                raise ValueError(f"load_checkpoint: {path}'s expert files have no '{prefix + n}'")
            t.data.copy_(saved[prefix + n].to(t.dtype))


def expert_names(engine, part):
    """An expert group's parameters under their global expert numbers (as DeepSpeed's files name them)."""
    counts = expert_parts.local_counts(part.names)
    return [expert_parts.global_name(n, part.ep_rank, counts) for n in part.names]


def _check(engine, ds, path):
    if (engine._expert_parts or ds.slices[0].experts) and (engine._mp_rank is not None or ds.tp > 1):
        _refuse(path, "chorus reads DeepSpeed's MoE checkpoints without tensor parallelism so far")
    kind = engine._core_args[1]
    if engine._client is not None or kind not in STATE_KEYS:
        _refuse(path, "chorus reads the state of DeepSpeed's Adam, AdamW, LAMB, Lion, Adagrad and SGD; this engine "
                f"runs {'a client optimizer' if engine._client is not None else repr(kind)}")
    from chorus.deepspeed.runtime.pipe.module import PipelineModule
    stage = isinstance(engine.module, PipelineModule)  # (a pipeline stage holds some of the saved parameters)
    experts = [n for p in engine._expert_parts for n in expert_names(engine, p)]
    missing = [n for n in engine._names + experts if not ds.has(n)]
    held = set(engine._names) | set(experts)
    # (this rank's experts are some of the saved ones)
    extra = [n for n in ds.names if n not in held and not (experts and expert_parts.is_expert_name(n))] \
        if not stage else []
    if missing or extra:
        for k, n in enumerate(engine._names + experts):
            if not ds.has(n):
                _refuse(path, f"the model's parameter '{n}' is not in it ({len(missing)} missing; it has "
                        f"{ds.names[:4]}...)")
        _refuse(path, f"it has {len(ds.names)} trainable parameters, the model {len(engine._names)} "
                f"(not in the model: {extra[:4]})")
    have = set.intersection(*[set(s.states[n]) for s in ds.slices for n in s.names if n in s.states]) \
        if any(s.states for s in ds.slices) else set()
    missing = [k for k in STATE_KEYS[kind] if k not in have]
    if missing:
        _refuse(path, f"this engine's {kind} needs the optimizer state {list(STATE_KEYS[kind])} for every "
                f"parameter; the checkpoint has {sorted(have)} (saved by another optimizer?)")


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
    return [_view(core.master_view(), torch.float32)] + [_view(core.state_view(k), torch.float32)
                                                          for k in range(count)]


class Targets:
    """Where a whole parameter's values go in this rank's engine: its 16-bit parameter, and its
    pieces of the fp32 master and of the optimizer's state (keys, in the engine's order)."""

    def __init__(self, engine, keys, part=None):
        """part: an expert group (expert_parts.ExpertPart), whose engine runs over its own set."""
        self.engine, self.core, self.keys = engine, (part or engine).core, tuple(keys)
        self.master, *self.views = state_arrays(self.core, len(self.keys))
        ps = part.data_set if part is not None else engine.process_set
        rank = ps.rank() if self.core.stage > 0 else 0
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
