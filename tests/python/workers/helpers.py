"""broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object."""
import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
torch.manual_seed(r)  # every rank starts different
model = torch.nn.Linear(5, 3)
hvd.broadcast_parameters(model.state_dict(), root_rank=1)
torch.manual_seed(1)
expect = torch.nn.Linear(5, 3)
assert torch.equal(model.weight, expect.weight) and torch.equal(model.bias, expect.bias)

hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)

opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
model(torch.ones(2, 5) * (r + 1)).sum().backward()
opt.step()
hvd.broadcast_optimizer_state(opt, root_rank=2)
state = opt.state_dict()
assert state["param_groups"][0]["lr"] == 0.01 * 3
exp_avg = state["state"][0]["exp_avg"]
gathered = hvd.allgather(exp_avg.unsqueeze(0), name="exp_avg")
assert all(torch.equal(gathered[k], exp_avg) for k in range(n))

# A stateless optimizer (plain SGD) with a gradient left from an earlier step, as after
# an elastic reset: broadcasting its (empty) state must not move any rank's weights.
sgd_model = torch.nn.Linear(5, 3)
hvd.broadcast_parameters(sgd_model.state_dict(), root_rank=0)
before = [p.detach().clone() for p in sgd_model.parameters()]
sgd = torch.optim.SGD(sgd_model.parameters(), lr=0.5)
sgd_model(torch.ones(2, 5) * (r + 1)).sum().backward()  # a different gradient on every rank
hvd.broadcast_optimizer_state(sgd, root_rank=0)
assert all(torch.equal(a, b) for a, b in zip(before, sgd_model.parameters()))

obj = hvd.broadcast_object({"epoch": 7 + r, "name": f"rank{r}"}, root_rank=2)
assert obj == {"epoch": 9, "name": "rank2"}
assert hvd.allgather_object((r, "x" * r)) == [(k, "x" * k) for k in range(n)]
hvd.shutdown()
print(f"rank {r}: helpers ok")
