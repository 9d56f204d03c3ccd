"""A rank dies with signal 9 while another waits to receive from it: the waiter
gets HorovodInternalError (a peer failure) at once, not after the timeout."""
import os
import signal
import time

import torch

import chorus.torch as hvd

hvd.init()
r = hvd.rank()
hvd.send(torch.ones(2), 1 - r) if r == 0 else hvd.recv(torch.zeros(2), 0)  # both connected
if r == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
start = time.time()
try:
    hvd.recv(torch.zeros(100000), 1, tag=2)
    raise SystemExit("no failure seen")
except hvd.HorovodInternalError as e:
    assert "peer failure: rank 1" in str(e), e
    print(f"rank 0: peer failure after {time.time() - start:.1f} s: {e}", flush=True)
