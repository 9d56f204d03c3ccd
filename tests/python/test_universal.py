"""Universal checkpoints across tensor-parallel layouts (workers/universal_tp.py): saved at
tp 2 x dp 2, loaded at tp 1 x dp 3, tp 4 x dp 1 and tp 2 x dp 1; the loss after loading equals
a plain model's from the checkpoint's whole weights, and training goes on as it did.
(Against the real DeepSpeed: tests/frameworks/test_universal_vs_deepspeed.py.)"""
import pytest

from conftest import ok


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from conftest import Ranks
    folder = tmp_path_factory.mktemp("universal_tp")
    ok(Ranks()(4, "universal_tp.py", "save", str(folder)))
    return folder


@pytest.mark.parametrize("ranks_tp", [(3, 1), (4, 4), (2, 2)])
def test_universal_checkpoint_loads_at_other_tensor_parallel_sizes(ranks, saved, ranks_tp):
    n, tp = ranks_tp
    out = ok(ranks(n, "universal_tp.py", "load", str(saved), str(tp)))
    assert out.count(f"universal tp {tp} x dp {n // tp} ok") == n, out
