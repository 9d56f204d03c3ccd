"""Elastic training on one host: the worker with rank 2 kills itself with SIGKILL
once, mid-training. That is its own failure: the other workers go on (the host is
not blacklisted), a new worker takes the free slot, and the job completes."""
import os
import signal
import sys
import time

import torch

import chorus.torch as hvd

hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
marker = sys.argv[1]


@hvd.elastic.run
def train(state):
    while state.step < 12:
        if state.step == 4 and hvd.rank() == 2 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        state.step += 1
        state.commit()
        time.sleep(0.1)
    return hvd.size()


n = train(state)
print(f"done at step {state.step} on {n} workers, rank {hvd.rank()}", flush=True)
