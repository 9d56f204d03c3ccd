"""save_checkpoint(async_save=True) under chorusrun, in chorus's format and DeepSpeed's:
the step goes on while the files are written (each file's write slowed here, so that the
training steps run while it is in flight); the files equal a blocking save's at the same
step; `latest` appears only once every rank has written, and names the save then; a
resumed engine trains on as the saving one did. A background write that fails on one rank
is raised on every rank at a later step (or wait_for_checkpoint()), naming that rank, and
`latest` still names the last complete save.

    zero_async_save.py FOLDER
"""
import json
import os
import sys
import time

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus import _core
from chorus.deepspeed.runtime.zero import checkpoint_io

slow = checkpoint_io.write_one


def slowly(path, item):
    time.sleep(0.2)
    slow(path, item)


checkpoint_io.write_one = slowly


def make(fmt, stage):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    engine, _, _, _ = deepspeed.initialize(model=model, config={
        "train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}},
        "zero_optimization": {"stage": stage}, "checkpoint": {"format": fmt}})
    return engine


def train(engine, first, n):
    out = []
    for step in range(first, first + n):
        g = torch.Generator().manual_seed(step * 7 + hvd.rank())
        loss = torch.nn.functional.cross_entropy(engine(torch.randn(4, 8, generator=g)),
                                                 torch.randint(0, 4, (4,), generator=g))
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    return out


def contents(folder, fmt):
    """Each file's contents, but what names the save (its random identity)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        if fmt == "deepspeed":
            with open(full, "rb") as f:
                out[name] = f.read()
        else:
            meta, blobs = _core.read_checkpoint_file(full)
            meta = json.loads(meta)
            for k in ("save", "extra"):
                meta.pop(k, None)
            out[name] = (meta, blobs)
    return out


root = sys.argv[1]
hvd.init()
for fmt, stage in (("chorus", 2), ("deepspeed", 2), ("chorus", 3), ("deepspeed", 1)):
    where = os.path.join(root, f"{fmt}{stage}")
    engine = make(fmt, stage)
    train(engine, 0, 3)
    engine.save_checkpoint(os.path.join(where, "blocking"), tag="t")
    t0 = time.perf_counter()
    engine.save_checkpoint(os.path.join(where, "async"), tag="t", async_save=True)
    stalled = time.perf_counter() - t0
    assert not os.path.exists(os.path.join(where, "async", "latest")), "latest before the files were written"
    went_on = train(engine, 3, 3)  # (the files are still being written: 0.2 s each)
    engine.wait_for_checkpoint()
    with open(os.path.join(where, "async", "latest")) as f:
        assert f.read() == "t"
    hvd.barrier()
    a, b = contents(os.path.join(where, "async", "t"), fmt), contents(os.path.join(where, "blocking", "t"), fmt)
    assert sorted(a) == sorted(b) and a == b, (fmt, stage, sorted(a), sorted(b))
    fresh = make(fmt, stage)
    fresh.load_checkpoint(os.path.join(where, "async"))
    assert train(fresh, 3, 3) == went_on, (fmt, stage)
    print(f"async {fmt} stage {stage} ok (the save stalled the step {stalled * 1e3:.1f} ms, "
          f"{len(a)} files)", flush=True)

# A write that fails on rank 1 (its shard's name taken by a folder): raised at a later step on all.
for fmt, victim in (("chorus", "zero_rank_00001_optim_states.chorus"),
                    ("deepspeed", "zero_pp_rank_1_mp_rank_00_optim_states.pt")):
    engine = make(fmt, 2)
    train(engine, 0, 1)
    where = os.path.join(root, f"fail_{fmt}")
    engine.save_checkpoint(where, tag="good")
    if hvd.rank() == 1:
        os.makedirs(os.path.join(where, "bad", victim))
    hvd.barrier()
    engine.save_checkpoint(where, tag="bad", async_save=True)
    try:
        for step in range(1, 40):
            train(engine, step, 1)
            time.sleep(0.05)
        raise AssertionError("the failed background write was never raised")
    except RuntimeError as e:
        assert "asynchronous save of tag 'bad' failed on rank(s) [1]" in str(e), e
    with open(os.path.join(where, "latest")) as f:
        assert f.read() == "good"
    train(engine, 50, 1)  # the runtime goes on
    engine.save_checkpoint(where, tag="again", async_save=True)
    engine.wait_for_checkpoint()
    with open(os.path.join(where, "latest")) as f:
        assert f.read() == "again"
print(f"async failures ok {hvd.rank()}", flush=True)
