"""ZeRO-Infinity's offload to disk (offload_optimizer and offload_param device nvme):
equal to the in-memory state on every stage and optimizer, checkpoints of it, its errors
(workers/zero_nvme.py); and a model whose optimizer state is larger than a memory limit
(a memory cgroup the test makes) trains under it, where the same model with its state in
memory is killed."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest

from conftest import BUILD, WORKERS, ok


def test_nvme_state_matches_memory_and_checkpoints(ranks, tmp_path):
    out = ok(ranks(2, "zero_nvme.py", env={"ZERO_TMP": str(tmp_path)}, timeout=600))
    assert out.count("zero nvme ok") == 2
    assert out.count("nvme == memory") == 2 * 12 and out.count("resumed from disk-held state") == 2 * 4


def _memory_cgroup():
    """A child of this process's memory cgroup (v1 or v2), or why there is none."""
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        if "memory" in controllers.split(","):
            base, limit = f"/sys/fs/cgroup/memory{path}", "memory.limit_in_bytes"
            break
    else:
        base, limit = f"/sys/fs/cgroup{open('/proc/self/cgroup').read().split('::', 1)[-1].strip()}", "memory.max"
    child = os.path.join(base, f"chorus-nvme-{uuid.uuid4().hex[:8]}")
    os.mkdir(child)  # (root on the build machines and CI: a failure here is the test's failure)
    return child, limit


def _run(mode, swap, cgroup=None, layers=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"), OMP_NUM_THREADS="1",
               # Big allocations mapped and unmapped whole: freed memory goes back rather than staying
               # in malloc's heap, so the peak is what the run needs.
               MALLOC_MMAP_THRESHOLD_="1000000")
    cmd = [sys.executable, os.path.join(WORKERS, "zero_nvme_limit.py"), mode, swap] + ([str(layers)] if layers else [])
    if cgroup:
        cmd = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh"] + cmd
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    found = {k: re.search(rf"^{k}: (.*)$", proc.stdout, re.M) for k in ("losses", "state bytes", "peak rss bytes")}
    return proc, {k: (eval(m.group(1)) if m else None) for k, m in found.items()}  # noqa: S307 - our worker's repr


def test_trains_under_a_memory_limit_smaller_than_its_optimizer_state(tmp_path):
    # The swap folder on the build's disk: where /tmp is a tmpfs its pages would count against the limit.
    folder = tempfile.mkdtemp(prefix="nvme-limit-", dir=BUILD)
    try:
        _limit_test(os.path.join(folder, "swap"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _limit_test(swap):
    disk, d = _run("nvme", swap)
    mem, m = _run("memory", swap)
    assert disk.returncode == 0, disk.stdout
    assert mem.returncode == 0, mem.stdout
    assert d["losses"] == m["losses"], (d, m)
    state = d["state bytes"]
    # The state left memory: the in-memory run's peak is at least most of the state above the disk run's.
    assert m["peak rss bytes"] - d["peak rss bytes"] >= 0.8 * state, (d, m)
    limit = int(d["peak rss bytes"] * 1.15)
    assert limit < state, f"the optimizer state ({state >> 20} MiB) fits in the limit ({limit >> 20} MiB)"
    cgroup, knob = _memory_cgroup()
    try:
        with open(os.path.join(cgroup, knob), "w") as f:
            f.write(str(limit))
        capped, c = _run("nvme", swap, cgroup)
        assert capped.returncode == 0, f"nvme offload under a {limit >> 20} MiB limit: {capped.stdout}"
        assert c["losses"] == m["losses"], (c, m)
        killed, _ = _run("memory", swap, cgroup)
        assert killed.returncode != 0 and "losses:" not in killed.stdout, \
            f"the in-memory run fit in {limit >> 20} MiB: the limit did not bind"
        print(f"limit {limit >> 20} MiB, optimizer state {state >> 20} MiB on disk; peaks: nvme {d['peak rss bytes'] >> 20} "
              f"MiB, in memory {m['peak rss bytes'] >> 20} MiB")
    finally:
        for _ in range(50):  # (the killed run's pages leave the group a moment after it exits)
            try:
                os.rmdir(cgroup)
                break
            except OSError:
                import time
                time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
