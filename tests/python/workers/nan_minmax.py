"""Max and Min allreduces with a NaN on one rank per element: NaN there on every
rank, as torch.maximum / torch.minimum of the ranks' tensors give it."""
import torch

import chorus.torch as hvd

hvd.init()
r, n = hvd.rank(), hvd.size()
for dtype in (torch.float32, torch.float64, torch.bfloat16):
    rows = [torch.arange(40, dtype=torch.float32).mul(0.5 * (k + 1)).sub(7 * k) for k in range(n)]
    for k in range(n):
        rows[k][k::n + 1] = float("nan")  # element i: NaN on rank i % (n + 1), if that is a rank
    for op, fold in ((hvd.Max, torch.maximum), (hvd.Min, torch.minimum)):
        got = hvd.allreduce(rows[r].to(dtype), op=op)
        want = rows[0].to(dtype)
        for k in range(1, n):
            want = fold(want, rows[k].to(dtype))
        assert torch.equal(torch.isnan(got), torch.isnan(want)), (dtype, op, got, want)
        assert torch.equal(got[~torch.isnan(got)], want[~torch.isnan(want)]), (dtype, op)
print(f"nan ok rank {r}", flush=True)
hvd.shutdown()
