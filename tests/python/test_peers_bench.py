"""bench/peers/run.py at its smallest size, with the frameworks that need no venv
(chorus, DDP, chorus.deepspeed): it must run end to end, and the ZeRO runs it times
must train the model that plain torch trains on the global batch."""
import json
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from conftest import BUILD, REPO

PEERS = os.path.join(REPO, "bench", "peers")
sys.path.insert(0, PEERS)
from models import ZeroMLP  # noqa: E402
from zero import batches  # noqa: E402


def reference_losses(width, depth, batch, steps, ranks):
    """Rank 0's loss at every step of one process training on all ranks' batches with
    torch's Adam (the config's Adam with weight decay 0 is AdamW with weight decay 0)."""
    torch.manual_seed(0)
    model = ZeroMLP(width, depth)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    per_rank = [batches(width, batch, steps, r) for r in range(ranks)]
    losses = []
    for i in range(steps):
        opt.zero_grad()
        rank_losses = [F.cross_entropy(model(x[i]), y[i]) for x, y in per_rank]
        torch.stack(rank_losses).mean().backward()
        opt.step()
        losses.append(rank_losses[0].item())
    return losses


def test_quick_peer_benchmark(tmp_path):
    out = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, os.path.join(PEERS, "run.py"), "--quick", "--build-dir", BUILD,
                           "--frameworks", "chorus", "ddp", "--zero-frameworks", "chorus", "--json", str(out),
                           "--png", str(tmp_path / "peers.png")],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout
    result = json.loads(out.read_text())
    training = [r for r in result["rows"] if r["kind"] == "training"]
    assert {(r["model"], r["framework"]) for r in training} == {
        (m, f) for m in ("deep_mlp", "wide_mlp", "convnet") for f in ("chorus", "ddp")}
    assert all(r["median"] > 0 and r["median_peak_rss_bytes"] > 0 for r in training)
    assert {r["model"] for r in result["ratios"] if "vs_ddp" in r} == {"deep_mlp", "wide_mlp", "convnet"}
    zero = [r for r in result["rows"] if r["kind"] == "zero"]
    assert sorted(r["stage"] for r in zero) == [1, 3]
    # --quick: width 256, depth 2, batch 16, 3 steps on 2 ranks.
    expected = reference_losses(256, 2, 16, 3, 2)
    for row in zero:
        assert row["median"] > 0
        for got, want in zip(row["losses"], expected, strict=True):
            assert abs(got - want) <= 1e-4 * abs(want), (row["stage"], row["losses"], expected)
    assert (tmp_path / "peers.png").stat().st_size > 10000
