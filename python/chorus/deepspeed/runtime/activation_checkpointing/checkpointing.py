"""Activation checkpointing as ``deepspeed.checkpointing``: checkpoint(function, *args)
keeps only function's inputs and recomputes its activations (with the same RNG
state) when the backward pass needs them.

configure() (or a config's "activation_checkpointing" section) adds DeepSpeed's
options: partition_activations keeps 1/n of each saved input on each of the n
tensor-parallel ranks (gathered again for the recomputation), cpu_checkpointing
keeps them in host memory. contiguous_memory_optimization and
synchronize_checkpoint_boundary are accepted; host tensors gain nothing from them."""
import torch

import chorus.torch as hvd

_options = {"partition_activations": False, "cpu_checkpointing": False, "contiguous_memory_optimization": False,
            "number_checkpoints": None, "synchronize_checkpoint_boundary": False, "profile": False}
_mpu = None
_configured = False


def configure(mpu_, deepspeed_config=None, partition_activations=None, contiguous_checkpointing=None,
              num_checkpoints=None, checkpoint_in_cpu=None, synchronize=None, profile=None):
    """DeepSpeed's signature: the config's section first, then the arguments given."""
    global _mpu, _configured
    _mpu = mpu_
    if deepspeed_config is not None:
        import json
        if isinstance(deepspeed_config, str):
            with open(deepspeed_config) as f:
                deepspeed_config = json.load(f)
        section = deepspeed_config.get("activation_checkpointing", {})
        unknown = set(section) - set(_options)
        if unknown:
            raise ValueError(f"activation_checkpointing: unknown option(s) {sorted(unknown)}")
        _options.update(section)
    for key, value in (("partition_activations", partition_activations),
                       ("contiguous_memory_optimization", contiguous_checkpointing),
                       ("number_checkpoints", num_checkpoints), ("cpu_checkpointing", checkpoint_in_cpu),
                       ("synchronize_checkpoint_boundary", synchronize), ("profile", profile)):
        if value is not None:
            _options[key] = value
    if _options["partition_activations"] and _mpu is None:
        raise ValueError("activation_checkpointing: partition_activations needs an mpu (the tensor-parallel group)")
    _configured = True


def is_configured():
    return _configured


def _group():
    if not _options["partition_activations"] or _mpu is None:
        return None, 1, 0
    return _mpu.get_model_parallel_group(), _mpu.get_model_parallel_world_size(), _mpu.get_model_parallel_rank()


def _keep(t):
    """What is saved of an input: its slice when partitioned (and whether it is), in
    host memory if asked."""
    group, n, r = _group()
    kept = t.detach()
    if group is not None and n > 1 and t.is_floating_point() and t.numel() >= n:
        flat = kept.reshape(-1)
        per = (flat.numel() + n - 1) // n
        return flat[r * per:(r + 1) * per].clone(), True
    if _options["cpu_checkpointing"] and kept.device.type != "cpu":
        kept = kept.cpu()
    return kept, False


def _restore(kept, partitioned, shape, device):
    if partitioned:  # every tensor-parallel rank recomputes at once: gather the slices
        group = _group()[0]
        kept = hvd.allgather(kept.contiguous(), process_set=group)[:torch.Size(shape).numel()]
    return kept.view(shape).to(device)


class _Checkpoint(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function, *args):
        ctx.function = function
        ctx.rng = torch.get_rng_state()
        ctx.shapes, ctx.devices, ctx.flags, ctx.parts, saved, ctx.plain = [], [], [], [], [], []
        for a in args:
            if torch.is_tensor(a):
                kept, part = _keep(a)
                ctx.shapes.append(a.shape)
                ctx.devices.append(a.device)
                ctx.flags.append(a.requires_grad)
                ctx.parts.append(part)
                saved.append(kept)
                ctx.plain.append(None)
            else:
                ctx.shapes.append(None)
                ctx.devices.append(None)
                ctx.flags.append(False)
                ctx.parts.append(False)
                ctx.plain.append(a)
        ctx.save_for_backward(*saved)
        with torch.no_grad():
            return function(*args)

    @staticmethod
    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        inputs = []
        for shape, device, flag, part, plain in zip(ctx.shapes, ctx.devices, ctx.flags, ctx.parts, ctx.plain):
            if shape is None:
                inputs.append(plain)
                continue
            t = _restore(next(saved), part, shape, device).detach()
            inputs.append(t.requires_grad_(flag))
        now = torch.get_rng_state()
        torch.set_rng_state(ctx.rng)
        try:
            with torch.enable_grad():
                outputs = ctx.function(*inputs)
        finally:
            torch.set_rng_state(now)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        pairs = [(o, g) for o, g in zip(outputs, grads) if torch.is_tensor(o) and o.requires_grad and g is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        return (None,) + tuple(t.grad if torch.is_tensor(t) and t.requires_grad else None for t in inputs)


def checkpoint(function, *args):
    """function(*args), with its activations dropped after the forward pass and
    recomputed in the backward pass."""
    if not torch.is_grad_enabled() or not any(torch.is_tensor(a) and a.requires_grad for a in args):
        return function(*args)
    return _Checkpoint.apply(function, *args)
