"""Elastic PyTorch training on Ray, written as a Horovod-on-Ray program: only the
imports name chorus. A small convolutional classifier learns a synthetic image task
(which quadrant is brightest) with an ElasticSampler, checkpointed state and an LR
that follows the world size; workers come and go with the cluster's nodes.

    python examples/ray/pytorch_ray_elastic.py --local-cluster     # a loopback cluster
    python examples/ray/pytorch_ray_elastic.py                     # ray.init(address="auto")
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data

import chorus.torch as hvd  # was: import horovod.torch as hvd

parser = argparse.ArgumentParser(description="elastic PyTorch on Ray")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--lr", type=float, default=0.02)
parser.add_argument("--samples", type=int, default=1024)
parser.add_argument("--local-cluster", action="store_true", help="start a loopback Ray cluster of two nodes")
args = parser.parse_args()


def quadrant_images(n, seed=0):
    """16x16 noise images; the label is the quadrant that was brightened."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 16, 16, generator=g) * 0.5
    y = torch.randint(0, 4, (n,), generator=g)
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, 0, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] += 0.5
    return torch.utils.data.TensorDataset(x, y)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 4)
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)


def train_fn():
    hvd.init()
    torch.manual_seed(42)
    torch.set_num_threads(1)
    dataset = quadrant_images(args.samples)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def on_state_reset():  # the learning rate follows the world size
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, train_sampler=sampler, epoch=0, batch=0, losses=[])
    state.register_reset_callbacks([on_state_reset])

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, args.epochs):
            state.model.train()
            state.train_sampler.set_epoch(state.epoch)
            total, seen = 0.0, 0
            for state.batch, (data, target) in enumerate(loader, start=state.batch):
                state.optimizer.zero_grad()
                loss = F.nll_loss(state.model(data), target)
                loss.backward()
                state.optimizer.step()
                state.train_sampler.record_batch(state.batch, args.batch_size)
                total += loss.item()
                seen += 1
                if state.batch % 4 == 0:
                    state.commit()
            epoch_loss = hvd.allreduce(torch.tensor(total / max(seen, 1)), name="epoch_loss").item()
            state.losses.append(epoch_loss)
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: loss {epoch_loss:.4f} on {hvd.size()} workers", flush=True)
            state.batch = 0
            state.commit()

    train(state)
    return {"rank": hvd.rank(), "losses": state.losses}


if __name__ == "__main__":
    import ray
    from chorus.ray import ElasticRayExecutor  # was: from horovod.ray import ElasticRayExecutor

    if args.local_cluster:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from cluster_local import ray_local_cluster
        cluster = ray_local_cluster()
    else:
        ray.init(address="auto")
    settings = ElasticRayExecutor.create_settings(min_np=1, max_np=2, verbose=True)
    executor = ElasticRayExecutor(settings, use_gpu=torch.cuda.is_available(), cpus_per_slot=1)
    executor.start()
    results = executor.run(train_fn)
    losses = results[0]["losses"]
    print(f"losses by epoch: {[round(v, 4) for v in losses]}")
    assert losses[-1] < losses[0], "the loss did not fall"
