"""A rank stopped with SIGSTOP inside a process set over TCP: the timeout error on
the set's other member names it by its global rank (2), not by its rank in the set (1)."""
import os
import signal

import torch

import chorus.torch as hvd

ps = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[ps])
r = hvd.rank()
pids = hvd.allgather_object(os.getpid())
if r in (0, 2):
    hvd.allreduce(torch.ones(4), name="warm", process_set=ps)
hvd.barrier()
if r == 2:
    os.kill(os.getpid(), signal.SIGSTOP)
if r == 0:
    try:
        hvd.allreduce(torch.ones(4), name="warm", process_set=ps)
        print("no error", flush=True)
    except Exception as e:  # noqa: BLE001
        print("error:", e, flush=True)
    os.kill(pids[2], signal.SIGKILL)  # the stopped rank goes; this one and rank 1 end without shutdown
os._exit(0)
