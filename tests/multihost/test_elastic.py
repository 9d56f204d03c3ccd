"""Elastic training on namespace hosts, 2 hosts x 2 slots: a worker killed with
signal 9 mid-step, a host's link taken down in a large allreduce, a host added
through discovery, and hosts lost until fewer than --min-np remain. The final
parameters must equal a fault-free replay of the committed schedule of world sizes."""
import json
import os
import re
import subprocess
import time

import pytest
import torch

from conftest import WORKERS, chorusrun
from test_launch import no_leftovers

TRAIN = os.path.join(WORKERS, "elastic_train.py")
# These tests follow the job through a host's loss: its first failed worker takes the
# host out (by default a host goes after 3 failures, or when all its workers die).
BLACKLIST_AT_ONCE = ["--blacklist-after-failures", "1"]
FORWARD = ["-x", "FAULT", "-x", "STEPS", "-x", "STEP_PAUSE", "-x", "PROCESS_SETS", "-x", "ZERO_STAGE"]  # to the workers on node2 too


def reference(sizes, data_dtype=torch.float64):
    """elastic_train.py without faults: at step s, the mean gradient of ranks 0..n-1
    (computed in float64; data_dtype: the dtype the workers draw their data in)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, n in enumerate(sizes):
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for r in range(n):
            g = torch.Generator().manual_seed(1000 * step + r)
            x = torch.randn(8, 4, generator=g, dtype=data_dtype).double()
            y = x.sum(1, keepdim=True) * 0.5 + 1.0
            model.zero_grad()
            ((model(x) - y) ** 2).mean().backward()
            for acc, p in zip(grads, model.parameters()):
                acc += p.grad
        for acc, p in zip(grads, model.parameters()):
            p.grad = acc / n
        opt.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def discovery(tmp_path, hosts):
    listing = tmp_path / "hosts"
    listing.write_text("".join(f"{h}\n" for h in hosts))
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listing}\n")
    script.chmod(0o755)
    return listing, script


def start(bed, env, script, result, *extra, fault=None, steps=24, pause=0.25, sets=False):
    e = dict(env, STEPS=str(steps), STEP_PAUSE=str(pause), CHORUS_TIMEOUT_SECONDS="10",
             PROCESS_SETS={False: "0", True: "1"}.get(sets, sets))
    if fault:
        e["FAULT"] = fault
    cmd = [chorusrun(), "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
           "--slots-per-host", "2", *bed.ssh_args(), "--elastic-timeout", "20", *BLACKLIST_AT_ONCE, *extra, *FORWARD,
           "python", TRAIN, str(result)]
    return bed.popen("node1", cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def watch(proc, until=None, timeout=240):
    """Reads proc's output to its end (or until a line matches `until`); returns it."""
    lines = []
    deadline = time.time() + timeout
    for line in proc.stdout:
        lines.append(line)
        if until and re.search(until, line):
            return "".join(lines)
        assert time.time() < deadline, "".join(lines)
    proc.wait(timeout=60)
    return "".join(lines)


def check_result(result, out):
    res = json.loads(result.read_text())
    want = reference(res["sizes"])
    for got, exp in zip(res["params"], want):
        assert got == pytest.approx(exp, rel=1e-9, abs=1e-12), out
    return res["sizes"]


def test_killed_worker(bed, env, tmp_path):
    _, script = discovery(tmp_path, ["node1", "node2"])
    result = tmp_path / "result.json"
    proc = start(bed, env, script, result, fault="kill:node2:1:8", sets=True)
    out = watch(proc)
    assert proc.returncode == 0, out
    assert "worker node2:1 (rank 3) was killed by signal 9 (Killed) on host node2" in out, out
    assert "host node2 is blacklisted" in out and "round 2: 2 workers (node1:0, node1:1)" in out, out
    assert re.search(r"resuming from commit 8 with 2 ranks", out), out
    sizes = check_result(result, out)
    assert sizes == [4] * 8 + [2] * 16, sizes  # nothing committed was lost or done twice
    # Static process sets across the reset: [2, 3] is gone with node2, [0, 1] works on.
    assert out.index("process sets: [[0, 1], [2, 3]]") < out.index("process sets: [[0, 1]]\n"), out
    no_leftovers(bed)


def test_link_down_in_a_large_allreduce(bed, env, tmp_path):
    _, script = discovery(tmp_path, ["node1", "node2"])
    result = tmp_path / "result.json"
    proc = start(bed, env, script, result, steps=16)
    out = watch(proc, until=r"step 6 size 4")
    bed.link("node2", up=False)  # (how long recovery takes: bench/elastic_faults.py)
    try:
        out += watch(proc, until=r"resuming from commit \d+ with 2 ranks")
        out += watch(proc)
    finally:
        bed.link("node2", up=True)
    assert proc.returncode == 0, out
    sizes = check_result(result, out)
    assert sizes[:6] == [4] * 6 and sizes[-1] == 2 and len(sizes) == 16, sizes
    no_leftovers(bed)


def test_host_added_through_discovery(bed, env, tmp_path):
    listing, script = discovery(tmp_path, ["node1"])
    result = tmp_path / "result.json"
    proc = start(bed, env, script, result, steps=20, sets="dynamic")
    out = watch(proc, until=r"step 4 size 2")
    listing.write_text("node1\nnode2\n")
    out += watch(proc)
    assert proc.returncode == 0, out
    assert "host node2 joins the job" in out and re.search(r"round 2: 4 workers", out), out
    sizes = check_result(result, out)
    assert sizes[:4] == [2] * 4 and sizes[-1] == 4 and len(sizes) == 20, sizes
    # Dynamic sets added again over the new ranks in a reset callback.
    assert out.index("process sets: [[0], [1]]") < out.index("process sets: [[0, 2], [1, 3]]"), out
    no_leftovers(bed)


def test_fewer_than_min_np_fails_cleanly(bed, env, tmp_path):
    _, script = discovery(tmp_path, ["node1", "node2"])
    result = tmp_path / "result.json"
    e = dict(env, STEPS="200", STEP_PAUSE="0.1", CHORUS_TIMEOUT_SECONDS="10")
    cmd = [chorusrun(), "--min-np", "3", "--max-np", "4", "--host-discovery-script", str(script),
           "--slots-per-host", "2", *bed.ssh_args(), "--elastic-timeout", "3", *BLACKLIST_AT_ONCE, *FORWARD, "python", TRAIN,
           str(result)]
    proc = bed.popen("node1", cmd, env=dict(e, FAULT="kill:node2:0:3"), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
    out = watch(proc)
    assert proc.returncode != 0, out
    assert "only 2 workers remain, fewer than --min-np 3, for more than 3 s" in out, out
    no_leftovers(bed)


def test_elastic_example_says_who_joined_and_left(bed, env, tmp_path):
    """examples/elastic/digits_elastic.py: node2 joins after the first epoch, then
    one of its workers is killed; the example names both and the commit it resumed from."""
    from conftest import REPO
    listing, script = discovery(tmp_path, ["node1:1"])
    example = os.path.join(REPO, "examples", "elastic", "digits_elastic.py")
    cmd = [chorusrun(), "--min-np", "1", "--max-np", "3", "--host-discovery-script", str(script),
           *bed.ssh_args(), "-x", "EPOCHS", "-x", "BATCH_PAUSE", "python", example]
    proc = bed.popen("node1", cmd, env=dict(env, EPOCHS="5", BATCH_PAUSE="0.02"), stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
    out = watch(proc, until=r"epoch 0: loss")
    listing.write_text("node1:1\nnode2:2\n")
    out += watch(proc, until=r"joined: node2:0, node2:1")
    out += watch(proc, until=r"epoch \d: loss .* on 3 workers")
    assert bed.kill("node2", "digits_elastic.py", one=True)
    out += watch(proc)
    assert proc.returncode == 0, out
    assert re.search(r"resuming from commit epoch \d+ batch \d+ with \d workers; left: node2:", out), out
    acc = float(re.search(r"done: accuracy ([0-9.]+)", out).group(1))
    assert acc > 0.85, out
    no_leftovers(bed)


def test_blacklist_cooldown_and_reset_limit(bed, env, tmp_path):
    # With a cooldown, node2 comes back after its worker was killed and rejoins.
    _, script = discovery(tmp_path, ["node1", "node2"])
    result = tmp_path / "result.json"
    proc = start(bed, env, script, result, "--blacklist-cooldown-range", "1", "2", fault="kill:node2:1:4", steps=30)
    out = watch(proc)
    assert proc.returncode == 0, out
    assert "host node2 is blacklisted for" in out and "host node2 is back from its blacklist cooldown" in out, out
    sizes = check_result(result, out)
    assert sizes[:4] == [4] * 4 and 2 in sizes and sizes[-1] == 4, sizes
    no_leftovers(bed)
    # --reset-limit 0: the first failure ends the job.
    proc = start(bed, env, script, result, "--reset-limit", "0", fault="kill:node2:1:4")
    out = watch(proc)
    assert proc.returncode != 0 and "more than --reset-limit 0" in out, out
    no_leftovers(bed)


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_engine_resumes_from_its_commit(bed, env, tmp_path, stage):
    """A ZeRO-2 or ZeRO-3 engine: node2's worker killed mid-step; the survivors re-partition and
    load the last commit (a checkpoint on storage every host reads)."""
    _, script = discovery(tmp_path, ["node1", "node2"])
    result, commits = tmp_path / "result.json", tmp_path / "commits"
    cmd = [chorusrun(), "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
           "--slots-per-host", "2", *bed.ssh_args(), "--elastic-timeout", "20", *BLACKLIST_AT_ONCE, *FORWARD, "python",
           os.path.join(WORKERS, "ds_elastic.py"), str(result), str(commits)]
    proc = bed.popen("node1", cmd, env=dict(env, FAULT="kill:node2:0:6", STEPS="16", CHORUS_TIMEOUT_SECONDS="10",
                                            ZERO_STAGE=str(stage)),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = watch(proc)
    assert proc.returncode == 0, out
    assert "resuming from commit 6 with 2 ranks" in out, out
    res = json.loads(result.read_text())
    assert res["sizes"] == [4] * 6 + [2] * 10 and res["global_steps"] == 16, res
    want = reference(res["sizes"], torch.float32)  # float64 reference of the same schedule
    for got, exp in zip(res["params"], want):
        assert got == pytest.approx(exp, rel=1e-4, abs=1e-5), out
    assert len([t for t in os.listdir(commits) if t.startswith("elastic_commit")]) <= 2  # old commits removed
    no_leftovers(bed)


def test_libtorch_program_resumes(bed, env, tmp_path):
    """The C++ elastic API (chorus/elastic.h, TorchState) in examples/cpp/train_torch_elastic.cc."""
    from conftest import BUILD
    if not os.path.exists(os.path.join(BUILD, "train_torch_elastic")):
        pytest.skip("built without libtorch (CHORUS_BUILD_TORCH)")
    _, script = discovery(tmp_path, ["node1", "node2"])
    result = tmp_path / "result.json"
    cmd = [chorusrun(), "--min-np", "2", "--max-np", "4", "--host-discovery-script", str(script),
           "--slots-per-host", "2", *bed.ssh_args(), "--elastic-timeout", "20", *BLACKLIST_AT_ONCE, *FORWARD,
           os.path.join(BUILD, "train_torch_elastic"), str(result)]
    proc = bed.popen("node1", cmd, env=dict(env, FAULT="kill:node2:1:7", STEPS="20", CHORUS_TIMEOUT_SECONDS="10"),
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = watch(proc)
    assert proc.returncode == 0, out
    assert "resuming from commit 7 with 2 ranks" in out, out
    sizes = check_result(result, out)
    assert sizes == [4] * 7 + [2] * 13, sizes
    no_leftovers(bed)


def test_training_through_a_lossy_slow_link(bed, env, tmp_path):
    """3% of node2's incoming packets dropped and its link limited to 200 Mbit/s: TCP
    carries on, nothing resets, and the result is the fault-free one."""
    _, script = discovery(tmp_path, ["node1", "node2"])
    result = tmp_path / "result.json"
    bed.loss("node2", 3)
    bed.rate("node2", 200)
    try:
        proc = start(bed, env, script, result, steps=12, pause=0.05)
        out = watch(proc)
    finally:
        bed.loss("node2", 0)
        bed.rate("node2", 0)
    assert proc.returncode == 0, out
    assert "round 2" not in out, out
    assert check_result(result, out) == [4] * 12
    no_leftovers(bed)
