"""Gradients through the collectives, as Horovod defines them."""
import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
W = [torch.arange(6, dtype=torch.float64).reshape(3, 2) * (k + 1) for k in range(n)]  # per-rank loss weights

# allreduce Sum: d(sum_k loss_k)/dx_r = c_r * sum_k W_k
x = torch.ones(3, 2, dtype=torch.float64, requires_grad=True)
c = float(r + 1)
(hvd.allreduce(x * c, op=hvd.Sum, name="g.ar") * W[r]).sum().backward()
assert torch.allclose(x.grad, c * sum(W)), x.grad

x = torch.ones(3, 2, dtype=torch.float64, requires_grad=True)
(hvd.allreduce(x * c, op=hvd.Average, name="g.avg") * W[r]).sum().backward()
assert torch.allclose(x.grad, c * sum(W) / n), x.grad

# allgather: gradients averaged across ranks, then this rank's rows.
x = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)
rows = sum(k + 1 for k in range(n))
Wg = [torch.arange(rows * 2, dtype=torch.float64).reshape(rows, 2) * (k + 1) for k in range(n)]
(hvd.allgather(x, name="g.ag") * Wg[r]).sum().backward()
start = sum(k + 1 for k in range(r))
assert torch.allclose(x.grad, (sum(Wg) / n)[start:start + r + 1]), x.grad

# broadcast: the root gets the averaged gradient, the others zero.
x = torch.ones(3, 2, dtype=torch.float64, requires_grad=True)
(hvd.broadcast(x, root_rank=1, name="g.bc") * W[r]).sum().backward()
assert torch.allclose(x.grad, sum(W) / n if r == 1 else torch.zeros(3, 2, dtype=torch.float64)), x.grad

# alltoall: the gradient of the rows sent to rank k is what rank k's loss puts on them.
splits = [1] * n
x = torch.ones(n, 2, dtype=torch.float64, requires_grad=True)
out, received = hvd.alltoall(x, splits=splits, name="g.a2a")
Wa = [torch.arange(n * 2, dtype=torch.float64).reshape(n, 2) + 100 * k for k in range(n)]
(out * Wa[r]).sum().backward()
expect = torch.stack([Wa[k][r] for k in range(n)])
assert torch.allclose(x.grad, expect), x.grad

# reducescatter, as Horovod defines its gradient (and chorus.tensorflow's): every
# rank's output gradient gathered, a Sum's scaled by the set's size; uneven blocks too.
for rows in (n + 1, 2 * n, 1):
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    Wr = [torch.full((counts[k], 2), float(k + 1), dtype=torch.float64) for k in range(n)]
    for op, scale in ((hvd.Sum, n), (hvd.Average, 1)):
        x = torch.ones(rows, 2, dtype=torch.float64, requires_grad=True)
        (hvd.reducescatter(x, op=op, name=f"g.rs.{rows}.{op}") * Wr[r]).sum().backward()
        assert torch.allclose(x.grad, torch.cat(Wr) * scale), (rows, op, x.grad)
        # grouped: each tensor's gradient as the single op's
        a = torch.ones(rows, 2, dtype=torch.float64, requires_grad=True)
        b = torch.ones(rows, 2, dtype=torch.float64, requires_grad=True)
        ga, gb = hvd.grouped_reducescatter([a, b], op=op, name=f"g.grs.{rows}.{op}")
        ((ga + 2 * gb) * Wr[r]).sum().backward()
        assert torch.allclose(a.grad, torch.cat(Wr) * scale) and torch.allclose(b.grad, 2 * torch.cat(Wr) * scale)

# grouped allgather: each tensor's gradient as allgather's.
x = torch.ones(r + 1, 2, dtype=torch.float64, requires_grad=True)
y = torch.ones(1, 2, dtype=torch.float64, requires_grad=True)
rows = sum(k + 1 for k in range(n))
gx, gy = hvd.grouped_allgather([x, y], name="g.gag")
((gx * Wg[r]).sum() + (gy * 3.0).sum()).backward()
start = sum(k + 1 for k in range(r))
assert torch.allclose(x.grad, (sum(Wg) / n)[start:start + r + 1]), x.grad
assert torch.allclose(y.grad, torch.full((1, 2), 3.0, dtype=torch.float64)), y.grad
rows = n + 1
counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]

# Without gradients to track (no requires_grad, or under no_grad) the results are
# the same values and carry no graph.
for grad_on in (False, True):
    x = torch.full((n + 1, 2), float(r + 1), dtype=torch.float64, requires_grad=grad_on)
    with torch.no_grad():
        outs = {
            "allreduce": hvd.allreduce(x, op=hvd.Sum, name="ng.ar"),
            "grouped": hvd.grouped_allreduce([x, x], op=hvd.Sum, name="ng.gar")[1],
            "allgather": hvd.allgather(x, name="ng.ag"),
            "broadcast": hvd.broadcast(x, root_rank=0, name="ng.bc"),
            "alltoall": hvd.alltoall(x, splits=[1] * (n - 1) + [2], name="ng.a2a")[0],
            "reducescatter": hvd.reducescatter(x, op=hvd.Sum, name="ng.rs"),
        }
    total = float(sum(k + 1 for k in range(n)))
    assert torch.equal(outs["allreduce"], torch.full((n + 1, 2), total, dtype=torch.float64))
    assert torch.equal(outs["grouped"], outs["allreduce"])
    assert torch.equal(outs["allgather"][:, 0], torch.tensor(
        [float(k + 1) for k in range(n) for _ in range(n + 1)], dtype=torch.float64))
    assert torch.equal(outs["broadcast"], torch.ones(n + 1, 2, dtype=torch.float64))
    assert torch.equal(outs["alltoall"][:, 0], torch.tensor(
        [float(k + 1) for k in range(n) for _ in range(2 if r == n - 1 else 1)], dtype=torch.float64))
    assert torch.equal(outs["reducescatter"], torch.full((counts[r], 2), total, dtype=torch.float64))
    for what, t in outs.items():
        assert t.grad_fn is None and not t.requires_grad, (what, grad_on)

hvd.shutdown()
print(f"rank {r}: autograd ok")
