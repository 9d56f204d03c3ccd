"""Functions the tests run on every rank (importable by the engines' workers)."""
import os
import time


def identity(x):
    import torch
    import chorus.torch as hvd
    hvd.init()
    summed = hvd.allreduce(torch.full((3,), float(hvd.rank() + 1)), op=hvd.Sum)
    print(f"rank {hvd.rank()} says hello")
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(), "local_size": hvd.local_size(),
            "cross_size": hvd.cross_size(), "sum": summed.tolist(), "x": x, "pid": os.getpid(),
            "env": os.environ.get("CHORUS_TEST_VALUE")}


def fail_on(rank_to_fail, linger=120):
    """rank_to_fail raises; the others stay busy outside chorus (only cancellation stops them)."""
    import chorus.torch as hvd
    hvd.init()
    if hvd.rank() == rank_to_fail:
        raise ValueError(f"rank {rank_to_fail} gives up on purpose")
    time.sleep(linger)
    return "lingered"


def train(steps=20, seed=0):
    """A small regression trained with DistributedOptimizer on each rank's own data;
    returns the final parameters and losses (the replicas must be equal)."""
    import torch
    import chorus.torch as hvd
    hvd.init()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    g = torch.Generator().manual_seed(100 + hvd.rank())
    w = torch.arange(8, dtype=torch.float32) / 8
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 8, generator=g)
        y = (x @ w).unsqueeze(1)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(hvd.allreduce(loss.detach(), op=hvd.Average).item())
    return {"params": [p.detach().clone() for p in model.parameters()], "losses": losses}
