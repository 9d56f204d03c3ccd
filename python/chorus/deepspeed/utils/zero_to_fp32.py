"""deepspeed.utils.zero_to_fp32: a ZeRO checkpoint's shards consolidated offline
into one fp32 state_dict that loads into the plain model, under DeepSpeed's
function names; chorus-zero-to-fp32 CHECKPOINT_DIR OUT is the command."""
import argparse
import json
import os
import sys

import numpy as np
import torch

from chorus import _core
from chorus.deepspeed.runtime import expert_parts
from chorus.deepspeed.runtime.zero.checkpoint import MODEL_STATES, mp_slices, read_model_states, resolve_tag, \
    shard_name


def consolidate(checkpoint_dir, tag=None, mp_rank=None):
    """{name: fp32 tensor} for every parameter, plus the module's buffers. A checkpoint of
    tensor-parallel slices is joined along each parameter's partition_dim, or gives one
    slice's tensors as that slice holds them (mp_rank)."""
    tag = resolve_tag(checkpoint_dir, tag)
    if tag is None:
        raise ValueError(f"no 'latest' file in {checkpoint_dir}; give the tag")
    path = os.path.join(checkpoint_dir, tag)
    slices = mp_slices(path)
    if slices and os.path.exists(os.path.join(path, MODEL_STATES)):
        raise ValueError(f"checkpoint {path} holds the files of two saves (with and without tensor parallelism); "
                         "save again into an empty tag")
    if not slices:
        if mp_rank is not None:
            raise ValueError(f"checkpoint {path} has no tensor-parallel slices; leave out the slice number")
        return _slice(path, None)
    if mp_rank is not None:
        if mp_rank not in slices:
            raise ValueError(f"checkpoint {path} has tensor-parallel slices {slices}, not {mp_rank}")
        return _slice(path, mp_rank)
    metas = [read_model_states(path, mp)[0] for mp in slices]
    world = metas[0].get("mp_world", 1)
    if slices != list(range(world)) or any(m.get("save") != metas[0].get("save") for m in metas):
        raise ValueError(f"checkpoint {path} is not one save of {world} tensor-parallel slices: it has slices "
                         f"{slices} from {len({m.get('save') for m in metas})} save(s)")
    parts = [_slice(path, mp) for mp in slices]
    dims = _dims(path)
    out = {}
    for name, first in parts[0].items():
        dim = dims.get(name)
        if dim is None:  # held alike by every slice (a buffer, a replicated parameter)
            out[name] = first
        elif dim < 0:
            raise ValueError(f"checkpoint {path}: parameter '{name}' is tensor-parallel but its layer does not say "
                             "along which dimension (partition_dim); consolidate one slice at a time (--mp-rank)")
        else:
            out[name] = torch.cat([part[name] for part in parts], dim=dim)
    return out


def _dims(path):
    """{parameter: the dimension its tensor-parallel slices split, None when they hold it alike}."""
    meta, _ = read_model_states(path, 0)
    dims = dict(zip(meta["param_names"], meta["partition_dims"]))
    for info in meta.get("experts", {}).values():
        if info.get("sliced"):
            counts = expert_parts.local_counts(info["names"])
            for e in range(info["ep_size"]):
                for name, dim in zip(info["names"], info["partition_dims"]):
                    dims[expert_parts.global_name(name, e, counts)] = dim
    return dims


def _slice(path, mp):
    """One engine's parameters (one tensor-parallel slice's, or the whole model's) and buffers."""
    meta, blobs = read_model_states(path, mp)
    shards = [os.path.join(path, shard_name(r, mp)) for r in range(meta["shards"])]
    out = dict(zip(meta["param_names"], _assemble(shards, meta["param_names"], meta["param_shapes"], path)))
    out.update(_experts(path, meta, mp))
    for name, dtype, shape in meta["buffers"]:
        raw = np.frombuffer(blobs["buffer:" + name], dtype=np.uint8).copy()
        out[name] = torch.from_numpy(raw).view(getattr(torch, dtype)).view(shape) if raw.size else \
            torch.empty(shape, dtype=getattr(torch, dtype))
    return out


def _assemble(shards, names, shapes, where):
    """The fp32 parameters (names, shapes) from the master pieces of one engine's shards."""
    full = [np.zeros(int(np.prod(s)) if s else 1, dtype=np.float32) for s in shapes]
    covered = [0] * len(full)
    for shard in shards:
        smeta, sblobs = _core.read_checkpoint_file(shard)
        master = np.frombuffer(sblobs["master"], dtype=np.float32)
        for param, p_off, q_off, count in json.loads(smeta)["pieces"]:
            full[param][p_off:p_off + count] = master[q_off:q_off + count]
            covered[param] += count
    for name, data, n in zip(names, full, covered):
        if n != data.size:
            raise ValueError(f"checkpoint {where} is incomplete: parameter '{name}' has {n} of {data.size} elements")
    return [torch.from_numpy(data).view(shape) for data, shape in zip(full, shapes)]


def _experts(path, meta, mp=None):
    """Every expert's parameters under its global number: the trained ones in fp32 from
    each expert-parallel rank's shards, the rest (frozen, buffers) from the experts' files."""
    import glob
    out = {}
    for group, info in meta.get("experts", {}).items():
        counts = expert_parts.local_counts(info["names"])
        for e in range(info["ep_size"]):
            shards = [os.path.join(path, expert_parts.shard_name(group, e, d, mp if info.get("sliced") else None))
                      for d in range(info["shards"])]
            tensors = _assemble(shards, info["names"], info["shapes"], f"{path} (expert-parallel rank {e})")
            for name, t in zip(info["names"], tensors):
                out[expert_parts.global_name(name, e, counts)] = t
    # this slice's files first (sliced experts), then slice 0's (whole experts)
    files = sorted(glob.glob(os.path.join(path, expert_parts.expert_file("*", "*", mp or 0))))
    files += sorted(glob.glob(os.path.join(path, expert_parts.expert_file("*", "*", 0)))) if mp else []
    for file in files:
        for k, v in torch.load(file).items():
            out.setdefault(k, v.float() if v.is_floating_point() else v)
    return out


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False,
                                             lazy_mode=False):
    """{name: fp32 tensor} of a checkpoint folder (the one holding 'latest', or give tag)."""
    return consolidate(checkpoint_dir, tag)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization=False, tag=None,
                                               exclude_frozen_parameters=False):
    """Writes the consolidated fp32 weights into output_dir (pytorch_model.bin, or
    model.safetensors with safe_serialization); an output path ending in .bin or
    .pt is taken as the file itself, as older DeepSpeed did."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    if str(output_dir).endswith((".bin", ".pt", ".pth")):
        path = str(output_dir)
    else:
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, "model.safetensors" if safe_serialization else "pytorch_model.bin")
    tmp = f"{path}.tmp.{os.getpid()}"
    if safe_serialization:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in state.items()}, tmp)
    else:
        torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Loads the consolidated fp32 weights into model (on the CPU) and returns it."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


def main(argv=None):
    ap = argparse.ArgumentParser(prog="chorus-zero-to-fp32", description="consolidates a chorus ZeRO checkpoint into one fp32 state_dict")
    ap.add_argument("checkpoint_dir", help="the folder given to save_checkpoint (holding 'latest')")
    ap.add_argument("output_file", help="where to write the fp32 state_dict")
    ap.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    ap.add_argument("--mp-rank", type=int, default=None,
                    help="one tensor-parallel slice as it was held (default: the slices joined)")
    args = ap.parse_args(argv)
    try:
        sd = consolidate(args.checkpoint_dir, args.tag, args.mp_rank)
    except (ValueError, OSError, RuntimeError) as e:
        print(f"chorus-zero-to-fp32: {e}", file=sys.stderr)
        return 1
    tmp = f"{args.output_file}.tmp.{os.getpid()}"
    torch.save(sd, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, args.output_file)
    total = sum(t.numel() for t in sd.values())
    print(f"chorus-zero-to-fp32: wrote {len(sd)} tensors ({total} elements) to {args.output_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
