"""An elastic training loop whose result can be checked: rank r's batch at step s
is data(s, r), so a fault-free run given the same world size at every step ends
with the same parameters. Rank 0 writes the committed schedule of world sizes and
the final parameters to argv[1].

FAULT=kill:WORKER:STEP makes that worker kill itself with signal 9 after its
backward pass at that step (mid-step: the others wait in the allreduce)."""
import os
import sys

import torch

import chorus.torch as hvd
from elastic_common import ME, data, finish_step, maybe_fault, write_result

STEPS = int(os.environ.get("STEPS", "24"))
PAUSE = float(os.environ.get("STEP_PAUSE", "0.25"))
LR = 0.1


# PROCESS_SETS=1: static sets [0, 1] and [2, 3] given at the first init (of 4);
# a reset keeps those of their ranks the new world has (a set left empty goes).
# PROCESS_SETS=dynamic: the even and the odd ranks, added at run time and added
# again over the new ranks after every reset (Horovod 0.28.1 cannot: its issue 4021).
SETS = os.environ.get("PROCESS_SETS", "0")
low = high = None
dynamic_sets = []
if SETS == "1":
    low, high = hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])
    hvd.init(process_sets=[low, high])
elif SETS == "dynamic":
    hvd.init(process_sets="dynamic")
else:
    hvd.init()


def add_dynamic_sets():
    dynamic_sets[:] = [hvd.add_process_set(list(range(first, hvd.size(), 2))) for first in (0, 1)]
torch.manual_seed(0)
model = torch.nn.Linear(4, 1).double()
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR), named_parameters=model.named_parameters())



def on_reset():
    print(f"worker {ME}: reset, now rank {hvd.rank()} of {hvd.size()}", flush=True)


def check_sets():
    live = [ps for ps in (low, high) if ps is not None and ps.process_set_id is not None] + dynamic_sets
    for ps in live:
        assert all(r < hvd.size() for r in ps.ranks), ps
        if ps.included():
            got = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, process_set=ps).item()
            assert got == sum(ps.ranks), (got, ps)
    if hvd.rank() == 0:
        print(f"process sets: {[ps.ranks for ps in live]}", flush=True)


@hvd.elastic.run
def train(state):
    if SETS != "0":
        check_sets()
    if hvd.rank() == 0:
        print(f"resuming from commit {state.step} with {hvd.size()} ranks", flush=True)
    while state.step < STEPS:
        x, y = data(state.step, hvd.rank())
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        maybe_fault(state.step)
        opt.step()
        finish_step(state, loss, PAUSE)


state = hvd.elastic.TorchState(model, opt, step=0, sizes=[])
state.register_reset_callbacks([on_reset] + ([add_dynamic_sets] if SETS == "dynamic" else []))
if SETS == "dynamic":
    add_dynamic_sets()
train(state)
if hvd.rank() == 0:
    write_result(sys.argv[1], sizes=state.sizes, params=[p.detach().flatten().tolist() for p in model.parameters()])
print(f"worker {ME}: done as rank {hvd.rank()} of {hvd.size()}", flush=True)
