"""An elastic training loop whose result can be checked: rank r's batch at step s
is data(s, r), so a fault-free run given the same world size at every step ends
with the same parameters. Rank 0 writes the committed schedule of world sizes and
the final parameters to argv[1].

FAULT=kill:WORKER:STEP makes that worker kill itself with signal 9 after its
backward pass at that step (mid-step: the others wait in the allreduce)."""
import json
import os
import signal
import sys
import time

import torch

import chorus.torch as hvd

STEPS = int(os.environ.get("STEPS", "24"))
PAUSE = float(os.environ.get("STEP_PAUSE", "0.25"))
LR = 0.1


def data(step, r):
    g = torch.Generator().manual_seed(1000 * step + r)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    return x, x.sum(1, keepdim=True) * 0.5 + 1.0


# PROCESS_SETS=1: static sets [0, 1] and [2, 3] given at the first init (of 4);
# a reset keeps those of their ranks the new world has (a set left empty goes).
SETS = os.environ.get("PROCESS_SETS") == "1"
if SETS:
    low, high = hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])
    hvd.init(process_sets=[low, high])
else:
    hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1).double()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), named_parameters=model.named_parameters())
me = os.environ.get("CHORUS_ELASTIC_WORKER", "")
fault = os.environ.get("FAULT", "").split(":")


def on_reset():
    print(f"worker {me}: reset, now rank {hvd.rank()} of {hvd.size()}", flush=True)


def check_sets():
    live = [ps for ps in (low, high) if ps.process_set_id is not None]
    for ps in live:
        assert all(r < hvd.size() for r in ps.ranks), ps
        if ps.included():
            got = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, process_set=ps).item()
            assert got == sum(ps.ranks), (got, ps)
    if hvd.rank() == 0:
        print(f"process sets: {[ps.ranks for ps in live]}", flush=True)


@hvd.elastic.run
def train(state):
    if SETS:
        check_sets()
    if hvd.rank() == 0:
        print(f"resuming from commit {state.step} with {hvd.size()} ranks", flush=True)
    while state.step < STEPS:
        x, y = data(state.step, hvd.rank())
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        if fault[0] == "kill" and fault[1] + ":" + fault[2] == me and int(fault[3]) == state.step:
            os.kill(os.getpid(), signal.SIGKILL)
        opt.step()
        state.sizes.append(hvd.size())
        state.step += 1
        if hvd.rank() == 0:
            print(f"step {state.step} size {hvd.size()} loss {loss.item():.6f}", flush=True)
        time.sleep(PAUSE)
        state.commit()


state = hvd.elastic.TorchState(model, opt, step=0, sizes=[])
state.register_reset_callbacks([on_reset])
train(state)
if hvd.rank() == 0:
    result = {"sizes": state.sizes, "params": [p.detach().flatten().tolist() for p in model.parameters()]}
    with open(sys.argv[1] + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
print(f"worker {me}: done as rank {hvd.rank()} of {hvd.size()}", flush=True)
