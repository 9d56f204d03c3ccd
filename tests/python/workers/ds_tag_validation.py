"""checkpoint.tag_validation, as DeepSpeed's: tags that differ across ranks are a
warning (Warn, the default), nothing (Ignore) or an error on every rank (Fail); a tag
that is no folder name on one rank is an error on every rank, not a wait.

    ds_tag_validation.py CHECKPOINT_DIR
"""
import sys
import warnings

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd


def engine(mode):
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
           "zero_optimization": {"stage": 1}}
    if mode is not None:
        cfg["checkpoint"] = {"tag_validation": mode}
    return deepspeed.initialize(model=torch.nn.Linear(3, 2), config=cfg)[0]


hvd.init()
folder, rank = sys.argv[1], hvd.rank()
for mode, expect in ((None, "warn"), ("Warn", "warn"), ("Ignore", "quiet"), ("Fail", "error")):
    e = engine(mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            e.save_checkpoint(folder, tag=f"t{rank}")  # a rank in the tag: differs across ranks
            got = "warn" if any("differs across the ranks" in str(w.message) for w in caught) else "quiet"
        except ValueError as err:
            assert "differs across the ranks" in str(err), err
            got = "error"
    assert got == expect, (mode, got)
    e.save_checkpoint(folder, tag="same")  # the same tag everywhere: fine in every mode
e = engine("Ignore")
try:
    e.save_checkpoint(folder, tag="a/b" if rank == 1 else "fine")
    raise AssertionError("an invalid tag on one rank was saved")
except ValueError as err:
    assert "not valid folder names" in str(err), err
print(f"tag validation ok {rank}", flush=True)
