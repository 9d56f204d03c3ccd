"""Past CHORUS_STALL_SHUTDOWN_TIME_SECONDS a call its peer never matches fails with
the stall error on every rank, instead of spinning."""
import time

import torch

import chorus.torch as hvd

hvd.init()
r = hvd.rank()
start = time.monotonic()
try:
    if r == 1:
        hvd.allreduce(torch.ones(1), name="lonely")  # rank 0 never submits it
    else:
        time.sleep(4)  # the shutdown time (2 s) passes while rank 0 is away
        hvd.allreduce(torch.ones(1), name="other")
    raise AssertionError("the stalled job went on")
except hvd.HorovodInternalError as e:
    assert "stalled" in str(e) and "'allreduce.lonely' missing ranks [0]" in str(e), e
    assert r == 0 or time.monotonic() - start < 30, time.monotonic() - start
print(f"rank {r}: stall shutdown ok", flush=True)
