"""A rank dies; the others get HorovodInternalError, as elastic training expects."""
import os
import signal

import torch

import chorus.torch as hvd

hvd.init()
r = hvd.rank()
try:
    for step in range(10000):
        if r == 1 and step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        hvd.allreduce(torch.ones(1000), name="grad")
    raise SystemExit("no failure seen")
except hvd.HorovodInternalError as e:
    print(f"rank {r}: HorovodInternalError caught: {e}", flush=True)
hvd.shutdown()
