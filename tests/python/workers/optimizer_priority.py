"""DistributedOptimizer(gradient_priorities=...): each gradient's allreduce carries
its parameter's priority (read back from rank 0's timeline, whose op spans record
it), and the averaged gradients are unchanged by it. argv: the trace path."""
import json
import sys

import torch

import chorus.torch as hvd

hvd.init()
path = sys.argv[1]


def step(priorities, trace):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8, bias=False) for _ in range(4)])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), gradient_priorities=priorities)
    torch.manual_seed(1 + hvd.rank())
    x = torch.randn(4, 8)
    hvd.barrier()
    hvd.start_timeline(trace)
    model(x).pow(2).sum().backward()
    opt.synchronize()
    hvd.stop_timeline()
    grads = [p.grad.clone() for p in model.parameters()]
    if hvd.rank() != 0:
        return None, grads
    events = json.load(open(trace))
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    ops = [e for e in events if e.get("ph") == "B" and "transport" in e.get("args", {})]
    got = {names[e["pid"]]: e["args"]["priority"] for e in ops}
    # The run's events as a user reads them: per gradient, NEGOTIATE, QUEUE, then the
    # transport's op, with what it carried; tensors fused together start together.
    for e in ops:
        a = e["args"]
        assert e["name"] == a["transport"] + "_ALLREDUCE" and a["transport"] in ("SHM", "INLINE"), e
        assert a["bytes"] == 8 * 8 * 4 and a["dtype"] == "float32" and a["process_set"] == 0, e
        together = [o for o in ops if o["ts"] == e["ts"]]
        assert a["fused_tensors"] >= len(together) >= 1, (e, together)
        spans = [x["name"] for x in events if x.get("pid") == e["pid"] and x.get("ph") == "B"]
        assert spans == ["NEGOTIATE_ALLREDUCE", "QUEUE", e["name"]], spans
    assert len(ops) == 4, ops
    return got, grads


# Expected gradients: the mean of every rank's, from each rank's own backward pass.
def local_grads(rank):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8, bias=False) for _ in range(4)])
    torch.manual_seed(1 + rank)
    model(torch.randn(4, 8)).pow(2).sum().backward()
    return [p.grad for p in model.parameters()]


want = [sum(g) / hvd.size() for g in zip(*[local_grads(r) for r in range(hvd.size())])]
plain, g0 = step(None, path + ".plain")
layered, g1 = step("layer_order", path + ".layers")
custom, g2 = step({"2.weight": 7}, path + ".custom")
for grads in (g0, g1, g2):
    for got, exp in zip(grads, want):
        assert torch.allclose(got, exp, atol=1e-6), (got - exp).abs().max()
if hvd.rank() == 0:
    names = [f"allreduce.{i}.weight" for i in range(4)]
    assert [plain[n] for n in names] == [0, 0, 0, 0], plain
    assert [layered[n] for n in names] == [4, 3, 2, 1], layered  # the first layer highest
    assert [custom[n] for n in names] == [0, 0, 7, 0], custom
try:
    hvd.DistributedOptimizer(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1),
                             gradient_priorities={"no.such": 1})
    raise AssertionError("an unknown parameter name was accepted")
except ValueError as e:
    assert "no.such" in str(e), e
hvd.shutdown()
print("optimizer priority ok", flush=True)
