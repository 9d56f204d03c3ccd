"""chorus's fused device Adam (the ZeRO engine's optimizer kernel) beside torch's
Adam(fused=True) on the same 64M fp32 parameters in 64 tensors, one step's time,
median of rounds taken in turn. Also chorus's mixed-precision step (bfloat16
gradients in, the bfloat16 copy out in the same pass), which torch has no one
op for. Target: torch's time / chorus's >= 1.0.

    python3 tests/gpu/bench_adam.py [--json OUT]
"""
import argparse
import json
import os
import statistics

import torch

from chorus import _core
from chorus.torch.mpi_ops import _dtype_code

N, TENSORS, ITERS, ROUNDS = 64 << 20, 64, 20, 5


def timed(fn):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / ITERS  # ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_adam.py needs a GPU")
    dev = torch.device("cuda", 0)
    per = N // TENSORS
    params = [torch.randn(per, device=dev) for _ in range(TENSORS)]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    mine = [torch.randn(per, device=dev) for _ in range(TENSORS)]
    m = [torch.zeros_like(p) for p in mine]
    v = [torch.zeros_like(p) for p in mine]
    g32 = [p.grad.clone() for p in params]
    g16 = [g.to(torch.bfloat16) for g in g32]
    low = [torch.empty(per, dtype=torch.bfloat16, device=dev) for _ in range(TENSORS)]
    group = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    stream = torch.cuda.current_stream(dev).cuda_stream
    f32, bf16 = _dtype_code(g32[0], "bench"), _dtype_code(g16[0], "bench")

    def chorus_fp32():
        _core.device_adam(group, 2, 1.0, False,
                          [(a.data_ptr(), b.data_ptr(), c.data_ptr(), g.data_ptr(), 0, per)
                           for a, b, c, g in zip(mine, m, v, g32)], f32, bf16, 0, stream)

    def chorus_mixed():
        _core.device_adam(group, 2, 1.0, False,
                          [(a.data_ptr(), b.data_ptr(), c.data_ptr(), g.data_ptr(), lo.data_ptr(), per)
                           for a, b, c, g, lo in zip(mine, m, v, g16, low)], bf16, bf16, 0, stream)

    torch_ms, ours_ms, mixed_ms = [], [], []
    for _ in range(ROUNDS):
        torch_ms.append(timed(opt.step))
        ours_ms.append(timed(chorus_fp32))
        mixed_ms.append(timed(chorus_mixed))
    t, o, x = statistics.median(torch_ms), statistics.median(ours_ms), statistics.median(mixed_ms)
    gbps = N * 4 * 7 / (o / 1e3) / 1e9  # bytes moved per fp32 step: read p, m, v, g; write p, m, v
    row = {"params": N, "tensors": TENSORS, "torch_fused_ms": t, "chorus_ms": o, "chorus_mixed_ms": x,
           "ratio": t / o, "chorus_GBps": gbps, "gpu": torch.cuda.get_device_name(dev)}
    print(f"Adam on {N >> 20}M fp32 parameters in {TENSORS} tensors ({row['gpu']}): torch fused {t:.3f} ms | "
          f"chorus {o:.3f} ms ({gbps:.0f} GB/s) | ratio {t / o:.2f}x | chorus bf16 grads + bf16 copy {x:.3f} ms",
          flush=True)
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(row, f, indent=2)
        os.replace(args.json + ".tmp", args.json)


main()
