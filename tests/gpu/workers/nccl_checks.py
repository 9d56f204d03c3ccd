"""NCCL with a one-rank communicator (the lent machine has one GPU, and NCCL
refuses two ranks on one): every op, several in flight at once, the path
named in stats(), and results against references.

    CHORUS_GPU_OPERATIONS=nccl chorusrun -np 1 python3 tests/gpu/workers/nccl_checks.py
"""
import sys

import torch

import chorus.torch as hvd

hvd.init()
torch.cuda.set_device(0)
dev = torch.device("cuda")
# Several ops in flight at once, on two streams, then synchronized.
s = torch.cuda.Stream()
handles = []
xs = [torch.randn(n, device=dev) for n in (1, 100, 4096, 1 << 20)]
for i, x in enumerate(xs):
    handles.append(("ar", x, hvd.allreduce_async(x, op=hvd.Sum, name=f"ar{i}")))
with torch.cuda.stream(s):
    y = torch.randn(257, 3, device=dev)
    handles.append(("ag", y, hvd.allgather_async(y, name="ag")))
    handles.append(("bc", y, hvd.broadcast_async(y, 0, name="bc")))
    handles.append(("a2a", y, hvd.alltoall_async(y, name="a2a")))
    handles.append(("rs", y, hvd.reducescatter_async(y, op=hvd.Sum, name="rs")))
    for kind, x, h in handles[len(xs):]:
        out = hvd.synchronize(h)
        out = out[0] if isinstance(out, tuple) else out
        assert torch.equal(out, x), f"{kind} on a side stream"
for kind, x, h in handles[:len(xs)]:
    assert torch.equal(hvd.synchronize(h), x), kind
for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8):
    t = (torch.arange(1000, device=dev) % 7).to(dtype)
    for op in (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product):
        out = hvd.allreduce(t, op=op, prescale_factor=1.0, name=f"{dtype}.{op}")
        assert torch.equal(out, t), f"{dtype} {op}"
    scaled = hvd.allreduce(t.float(), op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25, name=f"{dtype}.scaled")
    assert torch.allclose(scaled, t.float() * 0.5), f"{dtype} scaled"
hvd.barrier()
st = hvd.stats()
print(f"path {st['gpu_path']}: {st['gpu_path_reason']}", flush=True)
if st["gpu_path"] != "NCCL":
    print("FAILED: the set did not take NCCL", flush=True)
    sys.exit(1)
print("nccl checks OK", flush=True)
hvd.shutdown()
