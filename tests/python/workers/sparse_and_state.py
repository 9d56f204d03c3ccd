"""Sparse gradients stay sparse under the DistributedOptimizer (SparseAdam steps on
them, equal to one process on the global batch); broadcast_optimizer_state on an
optimizer that has not stepped leaves zero gradients, as Horovod's does."""
import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(0)
emb = torch.nn.Embedding(10, 3, sparse=True)
ref = torch.nn.Embedding(10, 3, sparse=True)
ref.load_state_dict(emb.state_dict())
opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(emb.parameters(), lr=0.1),
                               named_parameters=emb.named_parameters())
ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.1)
for step in range(3):
    ids = [torch.tensor([k, 5, (k + step) % 10]) for k in range(n)]
    opt.zero_grad()
    emb(ids[r]).sum().backward()
    assert emb.weight.grad.is_sparse
    opt.step()
    ref_opt.zero_grad()
    (sum(ref(i).sum() for i in ids) / n).backward()  # the average over the ranks' batches
    ref_opt.step()
assert torch.allclose(emb.weight, ref.weight, atol=1e-6), (emb.weight - ref.weight).abs().max()

m = torch.nn.Linear(2, 2)
o = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
hvd.broadcast_optimizer_state(o, root_rank=0)
assert all(p.grad is not None and not p.grad.any() for p in m.parameters())
d = hvd.DistributedOptimizer(torch.optim.Adam(m.parameters()), named_parameters=m.named_parameters())
for p in m.parameters():
    p.grad = None
hvd.broadcast_optimizer_state(d, root_rank=0)
assert all(p.grad is not None and not p.grad.any() for p in m.parameters())
assert all(int(s["step"]) == 1 for s in d.state_dict()["state"].values())  # one step on zeros, as Horovod
print(f"sparse and state ok rank {r}", flush=True)
hvd.shutdown()
