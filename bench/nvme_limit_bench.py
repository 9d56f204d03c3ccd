"""ZeRO-Infinity's reach on this host: a bf16 ZeRO-3 model (AdamW) with the optimizer state, the
reduced gradients and the 16-bit slices on disk, built under zero.Init(remote_device="nvme"),
trained in a memory cgroup whose limit is a quarter of its optimizer state (the issue's 4x);
the same model with its state in memory is run under that limit too (it must be killed: the
limit binds) and without it (the losses to match). Root (a cgroup is made); uses the build's disk.

    /usr/bin/python3 bench/nvme_limit_bench.py [--layers 48] [--ratio 4]
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from test_nvme_offload import BUILD, _memory_cgroup, _run  # noqa: E402 (the test's cgroup and worker)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=48, help="2048x2048 layers (48: 201M parameters)")
    p.add_argument("--ratio", type=float, default=4.0, help="optimizer state / memory limit")
    args = p.parse_args()
    folder = tempfile.mkdtemp(prefix="nvme-limit-bench-", dir=BUILD)
    cgroup = None
    try:
        swap = os.path.join(folder, "swap")
        t = time.time()
        free, m = _run("memory", swap, layers=args.layers, timeout=1200)
        free_s = time.time() - t
        assert free.returncode == 0, free.stdout[-3000:]
        state = m["state bytes"]
        limit = int(state / args.ratio)
        cgroup, knob = _memory_cgroup()
        with open(os.path.join(cgroup, knob), "w") as f:
            f.write(str(limit))
        t = time.time()
        capped, c = _run("nvme", swap, cgroup, layers=args.layers, timeout=1200)
        capped_s = time.time() - t
        killed, _ = _run("memory", swap, cgroup, layers=args.layers, timeout=1200)
        print(f"layers {args.layers}: optimizer state {state >> 20} MiB, limit {limit >> 20} MiB "
              f"(state / limit = {state / limit:.2f})")
        print(f"  in memory, no limit: peak {m['peak rss bytes'] >> 20} MiB, {free_s:.0f} s")
        print(f"  in memory, limited:  {'killed' if killed.returncode != 0 else 'FINISHED (the limit did not bind)'}")
        if capped.returncode != 0:
            print(f"  nvme, limited: FAILED\n{capped.stdout[-3000:]}")
            return 1
        same = c["losses"] == m["losses"]
        print(f"  nvme, limited:       peak {c['peak rss bytes'] >> 20} MiB, {capped_s:.0f} s, "
              f"losses {'equal to' if same else 'DIFFERENT from'} the in-memory run's")
        return 0 if same and killed.returncode != 0 else 1
    finally:
        if cgroup:
            for _ in range(50):
                try:
                    os.rmdir(cgroup)
                    break
                except OSError:
                    time.sleep(0.1)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
