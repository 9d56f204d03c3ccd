"""chorus.torch.elastic's state objects and sampler on a fixed job (no driver):
save/restore/sync, reset callbacks, ElasticSampler's shards and its processed
indices merged across ranks; check_host_updates() is quiet outside elastic jobs."""
import torch

import chorus.torch as hvd
from chorus.torch.elastic.state import _SamplerHandler

hvd.init()
r, n = hvd.rank(), hvd.size()

# ObjectState: attributes, rolled back by restore(), rank 0's after sync().
s = hvd.elastic.ObjectState(epoch=r, seen=[r])
assert s.epoch == r and s.seen == [r]
s.epoch, s.seen = 5, [1, 2]
s.restore()
assert s.epoch == r and s.seen == [r]
s.seen.append(9)
s.commit()  # saves; no host updates outside an elastic job
s.seen.append(10)
s.restore()
assert s.seen == [r, 9]
s.sync()
assert s.epoch == 0 and s.seen == [0, 9]
called = []
s.register_reset_callbacks([lambda: called.append(hvd.size())])
s.on_reset()
assert called == [n]

# TorchState: model and optimizer rolled back and synced from rank 0.
torch.manual_seed(r)
model = torch.nn.Linear(3, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
state = hvd.elastic.TorchState(model, opt, batch=0)
before = [p.detach().clone() for p in model.parameters()]
model(torch.ones(1, 3)).sum().backward()
opt.step()
state.batch = 7
state.restore()
assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and state.batch == 0
assert opt.state_dict()["state"] == {}  # the momentum the step made is gone too
state.sync()
w = hvd.broadcast(model.weight.detach().clone(), root_rank=0)
assert torch.equal(w, model.weight)

# ElasticSampler: disjoint shards covering the data; processed indices merge across ranks.
data = list(range(23))
sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=3)
mine = list(iter(sampler))
every = hvd.allgather_object(mine)
assert len(mine) == len(sampler) == -(-23 // n)
assert set().union(*map(set, every)) == set(data)
sampler.record_batch(0, 2)  # this rank processed its first 2
handler = _SamplerHandler(sampler)
handler.sync()
done = set().union(*[set(x[:2]) for x in every])
assert sampler.processed_indices == done, (sampler.processed_indices, done)
rest = hvd.allgather_object(list(iter(sampler)))
assert set().union(*map(set, rest)) == set(data) - done
sampler.set_epoch(1)
assert sampler.processed_indices == set() and len(sampler) == -(-23 // n)
hvd.shutdown()
print(f"rank {r}: elastic api ok")
