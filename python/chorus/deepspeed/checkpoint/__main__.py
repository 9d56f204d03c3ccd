"""python -m chorus.deepspeed.checkpoint convert SRC DST [--tag TAG] [--world N] [--stage S]
python -m chorus.deepspeed.checkpoint universal SRC DST [--tag TAG]   (SRC: also a pipeline engine's save_dir)

Writes the chorus checkpoint in SRC (a save_dir with `latest`, or its TAG folder) in
DeepSpeed 0.19.8's layout under DST (DST/TAG/..., DST/latest), for DeepSpeed's
load_checkpoint, its zero_to_fp32.py and the Hugging Face Trainer. By default at the
data-parallel size and ZeRO stage it was saved at; --world and --stage write it for
another (DeepSpeed's ZeRO loads only at the size it was saved at). Offline, one process;
it holds the whole fp32 state and its optimizer moments in memory."""
import argparse
import os
import sys

from chorus import _core
from chorus.deepspeed.checkpoint import chorus_format, ds_writer, universal
from chorus.deepspeed.checkpoint.deepspeed_format import is_deepspeed_checkpoint
from chorus.deepspeed.runtime.zero.checkpoint import resolve_tag


def _source(src, tag):
    if chorus_format.is_chorus_checkpoint(src) or is_deepspeed_checkpoint(src):
        return src, tag or os.path.basename(os.path.normpath(src))
    tag = resolve_tag(src, tag)
    if tag is None:
        raise ValueError(f"{src} has no 'latest' file and is not a checkpoint folder; give --tag")
    return os.path.join(src, tag), tag


def convert(src, dst, tag=None, world=None, stage=None):
    path, tag = _source(src, tag)
    if is_deepspeed_checkpoint(path) and not chorus_format.is_chorus_checkpoint(path):
        raise ValueError(f"{path} is already in DeepSpeed's layout; chorus's load_checkpoint reads it as it is")
    if not chorus_format.is_chorus_checkpoint(path):
        raise ValueError(f"{path} holds no chorus checkpoint (model_states.chorus)")
    whole, values, meta = chorus_format.read(path)
    if meta.get("experts"):
        raise ValueError(f"{path} holds MoE experts; save from the engine with checkpoint.format \"deepspeed\" for "
                         "DeepSpeed's MoE layout, or convert it to a universal checkpoint")
    world = int(world or meta["world"])
    stage = int(meta["stage"] if stage is None else stage)
    if world < 1:
        raise ValueError(f"--world {world}: the data-parallel size is at least 1")
    out = os.path.join(dst, tag)
    if os.path.exists(out) and os.listdir(out):
        raise ValueError(f"{out} exists and is not empty; convert into an empty folder")
    whole.config = dict(whole.config or {})
    whole.config["zero_optimization"] = dict(whole.config.get("zero_optimization") or {}, stage=stage)
    ds_writer.write(whole, lambda idx: {i: values[i] for i in idx}, out, stage, world, list(range(world)))
    _core.write_file_atomic(os.path.join(dst, "latest"), tag.encode())
    return out


def to_universal(src, dst, tag=None):
    """A chorus checkpoint (data-, tensor-, pipeline- and expert-parallel) as DeepSpeed's universal
    checkpoint in DST/TAG: every parameter whole (slices joined, stages together, experts under
    their global numbers)."""
    stages = chorus_format.pipeline_stages(src, resolve_tag(src, tag) or "") if not \
        chorus_format.is_chorus_checkpoint(src) else []
    if stages:  # a pipeline engine's save_dir: one folder per stage
        tag = resolve_tag(src, tag)
        whole, values, _, cat_dims = chorus_format.read_stages(stages)
    else:
        path, tag = _source(src, tag)
        if not chorus_format.is_chorus_checkpoint(path):
            raise ValueError(f"{path} holds no chorus checkpoint (model_states.chorus); DeepSpeed's own checkpoints "
                             "go through its ds_to_universal")
        whole, values, _, cat_dims = chorus_format.read_whole(path)
    out = os.path.join(dst, tag)
    if os.path.exists(out) and os.listdir(out):
        raise ValueError(f"{out} exists and is not empty; write into an empty folder")
    universal.write(whole, values, out, cat_dims)
    _core.write_file_atomic(os.path.join(dst, universal.LATEST), tag.encode())
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m chorus.deepspeed.checkpoint", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="a chorus checkpoint, written in DeepSpeed's layout")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--tag")
    c.add_argument("--world", type=int, help="the data-parallel size to write it for (default: as saved)")
    c.add_argument("--stage", type=int, choices=(0, 1, 2, 3), help="the ZeRO stage to write it for")
    u = sub.add_parser("universal", help="a chorus checkpoint (any data-, tensor-, pipeline- or expert-parallel "
                       "layout; a pipeline's save_dir), written as DeepSpeed's universal checkpoint, for any other "
                       "(checkpoint.load_universal)")
    u.add_argument("src")
    u.add_argument("dst")
    u.add_argument("--tag")
    a = ap.parse_args(argv)
    try:
        if a.command == "universal":
            out = to_universal(a.src, a.dst, a.tag)
        else:
            out = convert(a.src, a.dst, a.tag, a.world, a.stage)
    except (ValueError, OSError) as e:
        print(f"chorus.deepspeed.checkpoint: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out} in DeepSpeed's {'universal ' if a.command == 'universal' else ''}layout")
    return 0


if __name__ == "__main__":
    sys.exit(main())
