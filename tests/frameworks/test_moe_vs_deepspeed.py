"""MoE (ep 2 x dp 2; with Adam, and with Muon on every matrix, the experts' too) and Ulysses (sp 2 x dp 2, over torch.distributed groups) under
ZeRO-2 on 4 ranks: the same program's losses under chorus equal the real DeepSpeed
0.19.8's, step for step (workers/moe_ulysses_peer.py)."""
import pytest

from conftest import chorusrun, losses, real_deepspeed


@pytest.mark.parametrize("mode", ["moe", "moe-top3", "moe-muon", "ulysses"])
def test_losses_equal_deepspeeds_step_for_step(mode):
    want = losses(real_deepspeed(4, "moe_ulysses_peer.py", mode))
    out = chorusrun(4, "moe_ulysses_peer.py", mode)
    got = losses(out)
    assert "chorus" in out and len(want) == 5, (want, out[-3000:])
    assert sorted(got) == sorted(want), (got, want)
    for step in want:
        assert abs(got[step] - want[step]) <= 1e-4 * abs(want[step]), (step, got, want)
