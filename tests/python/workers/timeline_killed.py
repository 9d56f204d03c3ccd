"""Rank 0 is killed (signal 9) while it writes the timeline: the file must still
be valid JSON holding what was recorded before."""
import os
import signal
import time

import torch

import chorus.torch as hvd

hvd.init()
for i in range(30):
    hvd.allreduce(torch.ones(4), name=f"before.kill.{i % 3}")
time.sleep(0.3)  # past a write of the timeline's writer
if hvd.rank() == 0:
    os.kill(os.getpid(), signal.SIGKILL)
try:
    hvd.allreduce(torch.ones(4), name="after.kill")
except hvd.HorovodInternalError:
    print("rank 1 saw rank 0 die", flush=True)
