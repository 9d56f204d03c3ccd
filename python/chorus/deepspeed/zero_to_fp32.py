"""chorus-zero-to-fp32 CHECKPOINT_DIR OUT: consolidates a chorus ZeRO checkpoint's
shards into one fp32 state_dict (torch.save) that loads into the plain model."""
import argparse
import json
import os
import sys

import numpy as np
import torch

from chorus import _core
from chorus.deepspeed.zero_checkpoint import read_model_states, resolve_tag, shard_name


def consolidate(checkpoint_dir, tag=None):
    """{name: fp32 tensor} for every parameter, plus the module's buffers."""
    tag = resolve_tag(checkpoint_dir, tag)
    if tag is None:
        raise ValueError(f"no 'latest' file in {checkpoint_dir}; give the tag")
    path = os.path.join(checkpoint_dir, tag)
    meta, blobs = read_model_states(path)
    full = [np.zeros(int(np.prod(s)) if s else 1, dtype=np.float32) for s in meta["param_shapes"]]
    covered = [0] * len(full)
    for r in range(meta["shards"]):
        smeta, sblobs = _core.read_checkpoint_file(os.path.join(path, shard_name(r)))
        master = np.frombuffer(sblobs["master"], dtype=np.float32)
        for param, p_off, q_off, count in json.loads(smeta)["pieces"]:
            full[param][p_off:p_off + count] = master[q_off:q_off + count]
            covered[param] += count
    out = {}
    for name, shape, data, n in zip(meta["param_names"], meta["param_shapes"], full, covered):
        if n != data.size:
            raise ValueError(f"checkpoint {path} is incomplete: parameter '{name}' has {n} of {data.size} elements")
        out[name] = torch.from_numpy(data).view(shape)
    for name, dtype, shape in meta["buffers"]:
        raw = np.frombuffer(blobs["buffer:" + name], dtype=np.uint8).copy()
        out[name] = torch.from_numpy(raw).view(getattr(torch, dtype)).view(shape) if raw.size else \
            torch.empty(shape, dtype=getattr(torch, dtype))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="chorus-zero-to-fp32", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint_dir", help="the folder given to save_checkpoint (holding 'latest')")
    ap.add_argument("output_file", help="where to write the fp32 state_dict")
    ap.add_argument("-t", "--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    args = ap.parse_args(argv)
    try:
        sd = consolidate(args.checkpoint_dir, args.tag)
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
