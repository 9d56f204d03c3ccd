"""The ZeRO engine's Lion, Adagrad and LAMB: the torch-ops path a device engine takes
equals chorus's CPU kernels at ZeRO 1-3 on 2 ranks (workers/zero_torch_optimizers.py).
The kernels themselves are held to float64 updates (tests/unit/cpu_optimizer_test.cc)
and to the real DeepSpeed (tests/frameworks/test_optimizers_vs_deepspeed.py)."""
from conftest import ok


def test_torch_ops_path_equals_the_kernels(ranks):
    out = ok(ranks(2, "zero_torch_optimizers.py"))
    assert out.count("torch-ops optimizers ok") == 2, out


def test_a_torch_optimizers_state_survives_a_checkpoint(ranks, tmp_path):
    out = ok(ranks(2, "zero_client_state.py", str(tmp_path)))
    assert out.count("client state ok") == 2, out


def test_non_finite_steps_are_skipped_as_deepspeed_skips_them(ranks):
    out = ok(ranks(2, "zero_nonfinite.py"))
    assert out.count("non-finite steps ok") == 2, out


def test_muon_orthogonalizes_keeps_its_momentum_in_checkpoints_and_skips_cleanly(ranks, tmp_path):
    out = ok(ranks(2, "zero_muon.py", str(tmp_path)))
    assert out.count("muon ok") == 2, out
