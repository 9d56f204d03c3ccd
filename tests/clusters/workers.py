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


def elastic_train(batches, progress, pause=0.05, stop_file=None):
    """Elastic training (hvd.elastic.run, TorchState) that records the world size at
    every committed batch; rank 0 writes "batch size" to `progress` as it goes. It
    ends after `batches`, or at the first commit after stop_file appears (rank 0's view)."""
    import torch
    import chorus.torch as hvd
    hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, batch=0, sizes=[], unequal=[])

    @hvd.elastic.run
    def train(state):
        while state.batch < batches:
            x = torch.randn(8, 4)
            loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
            state.sizes.append(hvd.size())
            # Replicas equal at every step: every rank's weights, side by side.
            weights = hvd.allgather(model.weight.detach().clone())
            if not all(torch.equal(weights[0], w) for w in weights):
                state.unequal.append((state.batch, hvd.size()))
            state.batch += 1
            if hvd.rank() == 0:
                with open(progress, "a") as f:
                    f.write(f"{state.batch} {hvd.size()}\n")
            time.sleep(pause)
            state.commit()
            if stop_file and hvd.broadcast_object(os.path.exists(stop_file), root_rank=0, name="stop"):
                break

    train(state)
    return {"rank": hvd.rank(), "batch": state.batch, "sizes": list(state.sizes), "unequal": list(state.unequal),
            "params": [p.detach().clone() for p in model.parameters()]}


def serves_the_store():
    """Whether a socket of this process listens on the rendezvous port."""
    port = int(os.environ["CHORUS_RENDEZVOUS_PORT"])
    inodes = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{name}") as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                        inodes.add(fields[9])
        except OSError:
            pass
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    return bool(inodes & mine)
