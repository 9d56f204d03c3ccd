"""Data-parallel training of an MLP on scikit-learn's handwritten digits.

    chorusrun -np 2 python3 examples/pytorch/digits.py

Written as a Horovod user would write it; only the import names chorus.
"""
import argparse
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

import chorus.torch as hvd


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def datasets():
    digits = load_digits()  # bundled with scikit-learn: no download
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0,
                                                        stratify=y)
    return TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(float(value)), name=name, op=hvd.Average).item()


def save_checkpoint(model, optimizer, epoch, directory):
    """Rank 0 writes the checkpoint atomically: a temporary file, then a rename."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "digits.pt")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".digits.pt.")
    with os.fdopen(fd, "wb") as f:
        torch.save({"epoch": epoch, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict()}, f)
    os.replace(tmp, path)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate for one rank")
    parser.add_argument("--checkpoint-dir", default=os.path.join(tempfile.gettempdir(), "chorus-digits"))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--no-cuda", action="store_true", help="train on the CPU even where a GPU is present")
    args = parser.parse_args()
    args.cuda = not args.no_cuda and torch.cuda.is_available()

    hvd.init()
    if args.cuda:  # as Horovod's examples: one GPU per local rank (ranks may share one)
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    device = torch.device("cuda" if args.cuda else "cpu")
    torch.manual_seed(args.seed + hvd.rank())  # different on purpose: the broadcast fixes it
    torch.set_num_threads(1)

    train_set, test_set = datasets()
    train_sampler = DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                       shuffle=True, seed=args.seed)
    test_sampler = DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                      shuffle=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = MLP().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.none, op=hvd.Average)

    for epoch in range(args.epochs):
        model.train()
        train_sampler.set_epoch(epoch)
        total, seen = 0.0, 0
        bar = tqdm(train_loader, desc=f"epoch {epoch:2d}", disable=hvd.rank() != 0, mininterval=0.5)
        for x, y in bar:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            seen += len(y)
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        train_loss = metric_average(total / max(seen, 1), "train_loss")
        if hvd.rank() == 0:
            path = save_checkpoint(model, optimizer, epoch, args.checkpoint_dir)
            if epoch % 5 == 0 or epoch == args.epochs - 1:
                print(f"epoch {epoch:2d}  train loss {train_loss:.4f}  (checkpoint {path})", flush=True)

    model.eval()
    correct, count = 0, 0
    with torch.no_grad():
        for x, y in test_loader:
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(dim=1) == y).sum().item()
            count += len(y)
    totals = hvd.allreduce(torch.tensor([correct, count], dtype=torch.float64), op=hvd.Sum,
                           name="test_totals")
    accuracy = (totals[0] / totals[1]).item()
    if hvd.rank() == 0:
        print(f"test accuracy {accuracy:.4f} on {int(totals[1])} held-out digits", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
