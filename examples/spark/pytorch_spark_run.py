"""PyTorch training on Spark executors through horovod.spark.run's API (chorus.spark):
each Spark task runs one rank; the function returns its rank's model and loss, and
run() hands them back in rank order. Only the imports name chorus.

    python examples/spark/pytorch_spark_run.py --master local[2]
    python examples/spark/pytorch_spark_run.py --master local-cluster[2,1,1024]
"""
import argparse
import os
import sys

parser = argparse.ArgumentParser(description="PyTorch on Spark with chorus.spark.run")
parser.add_argument("--master", default="local[2]")
parser.add_argument("--num-proc", type=int, default=2)
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--batch-size", type=int, default=64)
args = parser.parse_args()


def train(epochs, batch_size):
    import torch
    import torch.nn.functional as F
    import chorus.torch as hvd  # was: import horovod.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    # Synthetic regression data; each rank reads its own shard.
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4096, 16, generator=g)
    y = x @ torch.linspace(-1, 1, 16) + 0.1 * torch.randn(4096, generator=g)
    shard = slice(hvd.rank(), None, hvd.size())
    data = torch.utils.data.TensorDataset(x[shard], y[shard])
    loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01 * hvd.size()),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    losses = []
    for epoch in range(epochs):
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(xb)
        losses.append(hvd.allreduce(torch.tensor(total / len(data)), name="epoch_loss").item())
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {losses[-1]:.4f}")
    return {"rank": hvd.rank(), "losses": losses, "state": {k: v.clone() for k, v in model.state_dict().items()}}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from cluster_local import spark_local_session
    import chorus.spark  # was: import horovod.spark

    spark = spark_local_session(args.master, "pytorch_spark_run")
    results = chorus.spark.run(train, args=(args.epochs, args.batch_size), num_proc=args.num_proc)
    import torch
    same = all(torch.equal(results[0]["state"][k], r["state"][k]) for r in results for k in r["state"])
    losses = results[0]["losses"]
    print(f"ranks {[r['rank'] for r in results]}, replicas equal: {same}, losses {[round(v, 4) for v in losses]}")
    assert same and losses[-1] < losses[0] / 2
    spark.stop()
