"""The plain model's state from this rank's pieces, for save_16bit_model: every expert
gathered over its expert-parallel set under its global number, then tensor-parallel
slices joined along each parameter's partition_dim. Collective over those sets (every
rank runs it alike: the same model, the same keys in the same order)."""
import os

import torch

import chorus.torch as hvd
from chorus.deepspeed.runtime import expert_parts
from chorus.deepspeed.runtime.utils import partition_dim
from chorus.deepspeed.utils import groups as ds_groups


def _partition_dims(module):
    """{parameter name: the dimension its slices split (-1: unknown), None when held alike}."""
    return {n: partition_dim(p) for n, p in module.named_parameters()}


def whole_state(module, state, tp_set=None):
    dims = _partition_dims(module)
    layers = expert_parts._layers(module)
    out, out_dims = {}, {}
    for key, t in state.items():
        prefix = next((p for p in layers if key.startswith(p + ".")), None)
        moe = layers[prefix][1] if prefix is not None else None
        if moe is None or moe.ep_size == 1:
            out[key], out_dims[key] = t, dims.get(key)
            continue
        name = moe.expert_group_name
        order = ds_groups._get_expert_parallel_group_ranks(name)  # by expert-parallel rank
        ep_set = ds_groups._get_expert_parallel_group(name)  # gathers by set rank (sorted ranks)
        every = hvd.allgather(t.detach().unsqueeze(0).contiguous(), name=f"save16.{key}", process_set=ep_set)
        local, inner = key[len(prefix) + 1:].split(".", 1)
        for i, r in enumerate(ep_set.ranks):
            g = order.index(r) * moe.num_local_experts + int(local)
            out[f"{prefix}.{g}.{inner}"], out_dims[f"{prefix}.{g}.{inner}"] = every[i], dims.get(key)
    if tp_set is None or tp_set.size() == 1:
        return out
    for key in list(out):
        dim = out_dims[key]
        if dim is None:
            continue
        if dim < 0:
            raise ValueError(f"save_16bit_model: parameter '{key}' is tensor-parallel (model_parallel) but its "
                             "layer does not say along which dimension (partition_dim): its slices cannot be joined")
        joined = hvd.allgather(out[key].detach().movedim(dim, 0).contiguous(), name=f"save16.tp.{key}",
                               process_set=tp_set)
        out[key] = joined.movedim(0, dim).contiguous()
    return out


def write_state(state, save_dir, save_filename):
    """torch.save into save_dir, atomically (a private temporary, then a rename)."""
    os.makedirs(save_dir, exist_ok=True)
    path = os.path.join(save_dir, save_filename)
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)
