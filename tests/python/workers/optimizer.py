"""DistributedOptimizer against a reference computed in this process from every rank's data."""
import copy
import warnings

import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)
template = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1)).double()


def shard(k, micro=0):
    g = torch.Generator().manual_seed(10 * k + micro)
    return torch.randn(8, 4, generator=g, dtype=torch.float64), torch.randn(8, 1, generator=g, dtype=torch.float64)


def loss_of(model, k, micro=0):
    x, y = shard(k, micro)
    return ((model(x) - y) ** 2).mean()


def reference(steps, passes, reduce):
    """Plain SGD where each step's gradient is every rank's (summed over passes) gradient, reduced."""
    model = copy.deepcopy(template)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        grads = []
        for k in range(n):
            model.zero_grad()
            for m in range(passes):
                loss_of(model, k, m).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            stacked = torch.stack([g[i] for g in grads])
            p.grad = stacked.mean(0) if reduce == "avg" else stacked.sum(0)
        opt.step()
    return [p.detach() for p in model.parameters()]


def distributed(steps, passes=1, tol=1e-10, reduce="avg", **kwargs):
    model = copy.deepcopy(template)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kwargs)
    for _ in range(steps):
        opt.zero_grad()
        for m in range(passes):
            loss_of(model, r, m).backward()
        opt.step()
    ref = reference(steps, passes, reduce)
    for p, q in zip(model.parameters(), ref):
        assert torch.allclose(p.detach(), q, atol=tol), (kwargs, p, q)


distributed(3)
distributed(3, passes=2)
distributed(2, num_groups=2)
distributed(2, groups=[[p for p in template.parameters()][:2]])
distributed(2, op=hvd.Sum, reduce="sum")
distributed(2, gradient_predivide_factor=2.0, tol=1e-9)
distributed(2, compression=hvd.Compression.fp16, tol=2e-3)

# zero_grad between backward and step is refused.
model = copy.deepcopy(template)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
loss_of(model, r).backward()
try:
    opt.zero_grad()
    raise SystemExit("zero_grad before step was accepted")
except AssertionError as e:
    assert "zero_grad" in str(e)
opt.synchronize()
# synchronize() then clip, then step without a second reduction.
torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
with opt.skip_synchronize():
    opt.step()
with warnings.catch_warnings():
    warnings.simplefilter("error")
    opt.zero_grad()
    loss_of(model, r).backward()
    opt.step()

# Duplicate names are rejected.
try:
    hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             named_parameters=[("w", p) for p in model.parameters()])
    raise SystemExit("duplicate names accepted")
except ValueError as e:
    assert "unique" in str(e)

hvd.shutdown()
print(f"rank {r}: optimizer ok")
