"""What every checkpoint format shares (below checkpoint.py, which dispatches to the formats,
and the formats, which all use it): the ranks' agreement on a failure, the tag's validation,
the buffers and tied names a save holds."""
import torch

import chorus.torch as hvd
from chorus.deepspeed.runtime import expert_parts


def _buffers(module):
    """The buffers module.state_dict() holds (not the non-persistent ones), as DeepSpeed saves them;
    the experts' go in their own files (expert_parts), each rank holding other experts."""
    persistent = set(module.state_dict(keep_vars=True).keys())
    return [(n, b) for n, b in module.named_buffers()
            if b is not None and n in persistent and not expert_parts.is_expert_name(n)]


def _agree(ps, error, what, across=None, verb="save_checkpoint"):
    """Every rank learns whether any failed `what`; each raises, naming the ranks.
    across: the set joining the engine's other slices (tensor-parallel), told too."""
    failed = hvd.allgather(torch.tensor([[1 if error is not None else 0]], dtype=torch.int32), name=f"ckpt.{what}",
                           process_set=ps).reshape(-1).tolist()
    bad = [r for r, f in enumerate(failed) if f]
    elsewhere = 0
    if across is not None and across.size() > 1:
        elsewhere = int(hvd.allreduce(torch.tensor([len(bad)], dtype=torch.int64), op=hvd.Sum, process_set=across,
                                      name=f"ckpt.{what}.slices")[0]) - len(bad)
    if bad or elsewhere:
        why = f": {error}" if error is not None else ""
        where = f"rank(s) {bad} of the process set" if bad else "another tensor-parallel slice's ranks"
        raise RuntimeError(f"{verb}: {what} failed on {where}{why}") from error


def _validate_tag(engine, tag):
    """checkpoint.tag_validation (Warn by default, Ignore, Fail), as DeepSpeed's: every rank's
    tag must be the same, since each writes into the folder its tag names."""
    mode = str((engine._raw_config.get("checkpoint") or {}).get("tag_validation", "Warn")).upper()
    if mode not in ("WARN", "IGNORE", "FAIL"):
        raise ValueError(f"DeepSpeed config: 'checkpoint.tag_validation' {mode!r} is not Warn, Ignore or Fail")
    # Every rank sees every tag, so a bad one is an error on all of them, not a wait.
    tags = hvd.allgather_object(tag, process_set=engine.process_set, name="ckpt.tags")
    bad = sorted({t for t in tags if "/" in t or t in ("", ".", "..")})
    if bad:
        raise ValueError(f"save_checkpoint: tag(s) {bad} are not valid folder names")
    if mode == "IGNORE" or len(set(tags)) == 1:
        return
    msg = (f"save_checkpoint: the checkpoint tag differs across the ranks ({sorted(set(tags))}); each rank writes "
           "into the folder its tag names, and a tag with a rank in it cannot be restored at another size")
    if mode == "FAIL":
        raise ValueError(msg)
    import warnings
    warnings.warn(msg)


def _shared_names(module):
    """{a tied parameter's other name: the name it is saved under}, as DeepSpeed's shared_params."""
    first, shared = {}, {}
    every = [(f"{m}.{k}" if m else k, p) for m, mod in module.named_modules(remove_duplicate=False)
             for k, p in mod._parameters.items() if p is not None]  # (torch 1.13 has no remove_duplicate there)
    for n, p in every:
        if id(p) in first:
            shared[n] = first[id(p)]
        else:
            first[id(p)] = n
    return shared
