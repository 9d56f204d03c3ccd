"""Elastic data-parallel training on scikit-learn's digits, as a Horovod user
writes it (only the import names chorus). Workers may fail or join: the job
rolls back to the last commit, re-forms, and says who left, who joined, and from
which commit it resumed.

    chorusrun --min-np 1 --max-np 4 --host-discovery-script examples/elastic/discover_local.sh \\
        python3 examples/elastic/digits_elastic.py
Across hosts, the discovery script prints "host:slots" lines (docs/launching.md).
"""
import os
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import chorus.torch as hvd

EPOCHS = int(os.environ.get("EPOCHS", "8"))
PAUSE = float(os.environ.get("BATCH_PAUSE", "0"))  # slows it down, to watch workers come and go
BATCH = 32

hvd.init()
digits = load_digits()
data = TensorDataset(torch.tensor(digits.data, dtype=torch.float32) / 16.0, torch.tensor(digits.target))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=1)
# A worker that replaces a dead one keeps its host:slot name: the pid tells them apart.
me = (os.environ.get("CHORUS_ELASTIC_WORKER", f"rank{hvd.rank()}"), os.getpid())


@hvd.elastic.run
def train(state):
    workers = hvd.allgather_object(me)
    if hvd.rank() == 0:
        left = sorted(name for name, _ in set(state.workers) - set(workers))
        joined = sorted(name for name, _ in set(workers) - set(state.workers)) if state.workers else []
        print(f"resuming from commit epoch {state.epoch} batch {state.batch} with {hvd.size()} workers"
              + (f"; left: {', '.join(left)}" if left else "") + (f"; joined: {', '.join(joined)}" if joined else ""),
              flush=True)
    state.workers = workers
    while state.epoch < EPOCHS:
        # The sampler's shard holds what this epoch has not processed yet.
        for i, (x, y) in enumerate(DataLoader(data, batch_size=BATCH, sampler=sampler)):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            sampler.record_batch(i, BATCH)
            time.sleep(PAUSE)
            state.batch += 1
            if state.batch % 10 == 0:
                state.commit()
        if hvd.rank() == 0:
            print(f"epoch {state.epoch}: loss {loss.item():.4f} on {hvd.size()} workers", flush=True)
        state.epoch += 1
        state.batch = 0
        sampler.set_epoch(state.epoch)
        state.commit()


state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0, workers=[])
train(state)
x, y = data.tensors
accuracy = (model(x).argmax(1) == y).float().mean().item()
if hvd.rank() == 0:
    print(f"done: accuracy {accuracy:.4f} on the whole set", flush=True)
