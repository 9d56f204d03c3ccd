"""A model whose loss reaches some parameters on one rank only: missing gradients count as zeros."""
import copy

import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()


class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 2).double()
        self.b = torch.nn.Linear(4, 2).double()

    def forward(self, x, k):
        out = self.a(x).pow(2).sum()
        return out + self.b(x).pow(2).sum() if k % 2 == 1 else out  # odd ranks use head b too


def data(k, step):
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(100 * step + k), dtype=torch.float64)


torch.manual_seed(0)
template = TwoHeads()


def reference(steps):
    model = copy.deepcopy(template)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s in range(steps):
        sums = [torch.zeros_like(p) for p in model.parameters()]
        for k in range(n):
            model.zero_grad()
            model(data(k, s), k).backward()
            for acc, p in zip(sums, model.parameters()):
                if p.grad is not None:
                    acc += p.grad
        for acc, p in zip(sums, model.parameters()):
            p.grad = acc / n
        opt.step()
    return list(model.parameters())


for kwargs in ({}, {"num_groups": 2}):
    model = copy.deepcopy(template)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), **kwargs)
    for s in range(3):
        opt.zero_grad()
        model(data(r, s), r).backward()
        opt.step()
    for p, q in zip(model.parameters(), reference(3)):
        assert torch.allclose(p, q, atol=1e-12), (kwargs, p, q)
print(f"rank {r}: uneven ok")
