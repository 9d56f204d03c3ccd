"""op=Adasum: hvd.allreduce and DistributedOptimizer's delta optimizer, against a
reference that simulates every rank here in float64 with numpy."""
import copy

import numpy as np
import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()


def combine(a, b):
    dot, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    ca = 1 - dot / (2 * aa) if aa >= 1e-8 else 1.0
    cb = 1 - dot / (2 * bb) if bb >= 1e-8 else 1.0
    return ca * a + cb * b


def adasum(vs):
    if len(vs) == 1:
        return vs[0]
    half = 1
    while half * 2 < len(vs):
        half *= 2
    return combine(adasum(vs[:half]), adasum(vs[half:]))


def value(k, shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed * 10 + k), dtype=torch.float64) + k


# hvd.allreduce, sync and in place, two shapes, float64 and float32.
for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
    for shape in ((5,), (3, 4)):
        want = adasum([value(k, shape, 1).flatten().numpy() for k in range(n)])
        got = hvd.allreduce(value(r, shape, 1).to(dtype), op=hvd.Adasum, name=f"a.{dtype}.{len(shape)}")
        assert got.shape == shape
        assert np.allclose(got.flatten().double().numpy(), want, rtol=tol, atol=tol), (got, want)
        t = value(r, shape, 1).to(dtype)
        hvd.allreduce_(t, op=hvd.Adasum)
        assert np.allclose(t.flatten().double().numpy(), want, rtol=tol, atol=tol)
try:
    hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)
    raise AssertionError("an integer Adasum ran")
except ValueError as e:
    assert "floating" in str(e), e


# DistributedOptimizer(op=Adasum): each rank steps its own SGD with momentum on its
# gradient; the updates combine by Adasum, parameter by parameter. Head b gets a
# gradient on odd ranks only (an update of zero elsewhere).
class TwoHeads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 3).double()
        self.b = torch.nn.Linear(4, 3).double()

    def forward(self, x, k):
        out = self.a(x).pow(2).sum()
        return out + self.b(x).pow(2).sum() if k % 2 == 1 else out


torch.manual_seed(0)
template = TwoHeads()
steps = 4


def reference():
    models = [copy.deepcopy(template) for _ in range(n)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    for s in range(steps):
        updates = []
        for k, (m, o) in enumerate(zip(models, opts)):
            before = [p.detach().clone() for p in m.parameters()]
            o.zero_grad()
            m(value(k, (2, 4), 100 + s), k).backward()
            o.step()
            updates.append([(p.detach() - b).flatten().numpy() for p, b in zip(m.parameters(), before)])
        for i in range(len(updates[0])):
            combined = adasum([u[i] for u in updates])
            for k, m in enumerate(models):  # every rank: its saved parameter plus the combined update
                p = list(m.parameters())[i]
                with torch.no_grad():
                    p.copy_(p - torch.from_numpy(updates[k][i]).view_as(p) + torch.from_numpy(combined).view_as(p))
    return list(models[0].parameters())


model = copy.deepcopy(template)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                               named_parameters=model.named_parameters(), op=hvd.Adasum)
for s in range(steps):
    opt.zero_grad()
    model(value(r, (2, 4), 100 + s), r).backward()
    opt.step()
for got, want in zip(model.parameters(), reference()):
    assert torch.allclose(got, want, rtol=1e-9, atol=1e-9), (got, want)
if n > 1:  # the updates were combined, not each rank's own kept
    alone = copy.deepcopy(template)
    o = torch.optim.SGD(alone.parameters(), lr=0.05, momentum=0.9)
    for s in range(steps):
        o.zero_grad()
        alone(value(r, (2, 4), 100 + s), r).backward()
        o.step()
    assert not torch.allclose(alone.a.weight, model.a.weight)

hvd.shutdown()
print(f"rank {r}: adasum ok")
