"""One rank: chorus's allreduce of a CUDA tensor over its NCCL path beside a raw
ncclAllReduce (the same libnccl, called through ctypes) on the same tensor
and stream, at 8 B and 64 MiB. Per-op time, median of rounds.

    CHORUS_GPU_OPERATIONS=nccl chorusrun -np 1 python3 tests/gpu/bench_nccl.py
"""
import ctypes
import json
import os
import statistics
import sys
import time

import torch

import chorus.torch as hvd
from chorus.common.basics import _nccl_folders


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def raw_nccl():
    path = os.environ.get("CHORUS_NCCL_LIBRARY") or next(
        (os.path.join(f, "libnccl.so.2") for f in _nccl_folders()), "libnccl.so.2")
    lib = ctypes.CDLL(path)
    uid = UniqueId()
    assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
    comm = ctypes.c_void_p()
    assert lib.ncclCommInitRank(ctypes.byref(comm), 1, uid, 0) == 0
    lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p]
    return lib, comm


def per_op(fn, iters):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def main():
    hvd.init()
    torch.cuda.set_device(0)
    lib, comm = raw_nccl()
    rows = []
    for nbytes, iters in ((8, 2000), (64 << 20, 50)):
        x = torch.ones(nbytes // 4, device="cuda")
        stream = torch.cuda.current_stream().cuda_stream
        raw, ours = [], []
        for _ in range(5):  # alternate, so drift affects both alike
            raw.append(per_op(lambda: lib.ncclAllReduce(x.data_ptr(), x.data_ptr(), x.numel(), 7, 0, comm, stream),
                              iters))
            ours.append(per_op(lambda: hvd.allreduce_(x, op=hvd.Sum, name="bench"), iters))
        raw_us, ours_us = statistics.median(raw) * 1e6, statistics.median(ours) * 1e6
        row = {"bytes": nbytes, "raw_nccl_us": raw_us, "chorus_us": ours_us, "diff_us": ours_us - raw_us,
               "ratio": ours_us / raw_us}
        rows.append(row)
        print(f"{nbytes:>10} B: raw ncclAllReduce {raw_us:9.2f} us | chorus {ours_us:9.2f} us | "
              f"+{ours_us - raw_us:.2f} us ({ours_us / raw_us:.3f}x)", flush=True)
    print(f"path: {hvd.stats()['gpu_path']}", flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1] + ".tmp", "w") as f:
            json.dump(rows, f, indent=2)
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    hvd.shutdown()


main()
