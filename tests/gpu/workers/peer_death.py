"""A rank dies mid-allreduce of CUDA tensors (SIGKILL); the others get
HorovodInternalError within CHORUS_TIMEOUT_SECONDS, never a hang.

    chorusrun --keep-going -np 3 python3 tests/gpu/workers/peer_death.py
"""
import os
import signal
import time

import torch

import chorus.torch as hvd

DEVICE = os.environ.get("CHORUS_TEST_DEVICE", "cuda")
hvd.init()
if DEVICE == "cuda":
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
r = hvd.rank()
x = torch.ones(1 << 22, device=DEVICE)
started = None
try:
    for step in range(100000):
        if r == 1 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        started = time.monotonic()
        hvd.allreduce(x, name="grad")
    raise SystemExit("no failure seen")
except hvd.HorovodInternalError as e:
    print(f"rank {r}: HorovodInternalError caught after {time.monotonic() - started:.1f} s: {e}", flush=True)
hvd.shutdown()
