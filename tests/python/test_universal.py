"""Universal checkpoints across tensor-parallel, pipeline and expert-parallel layouts: saved at
tp 2 x dp 2 (workers/universal_tp.py), loaded at tp 1 x dp 3, tp 4 x dp 1 and tp 2 x dp 1; a
pipeline at pp 2 x dp 2 and a MoE model at ep 2 x dp 2 (workers/universal_pipe_moe.py), loaded at
other stage counts and expert-parallel sizes. The loss after loading equals a plain model's from
the checkpoint's whole weights (MoE: the saving run's, every expert equal to its global number's),
and training goes on as it did. (Against the real DeepSpeed: tests/frameworks/test_universal_vs_deepspeed.py.)"""
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


@pytest.fixture(scope="module", params=["pipe", "moe"])
def saved_pipe_moe(request, tmp_path_factory):
    from conftest import Ranks
    folder = tmp_path_factory.mktemp(f"universal_{request.param}")
    ok(Ranks()(4, "universal_pipe_moe.py", request.param, "save", str(folder)))
    return request.param, folder


@pytest.mark.parametrize("ranks_size", [(3, 1), (4, 4), (2, 2)])
def test_universal_checkpoint_recuts_stages_and_replaces_experts(ranks, saved_pipe_moe, ranks_size):
    """workers/universal_pipe_moe.py: a pipeline saved at pp 2 x dp 2 loads at pp 1 x dp 3, pp 4 and
    pp 2 x dp 1 (a plain nn.Sequential's loss from the whole weights); a MoE model saved at ep 2 x dp 2
    loads at ep 1, 4 and 2 on 4 ranks (every expert by its global number; MoE at another rank count
    routes other batches)."""
    kind, folder = saved_pipe_moe
    n, size = ranks_size if kind == "pipe" else (4, ranks_size[1])
    out = ok(ranks(n, "universal_pipe_moe.py", kind, "load", str(folder), str(size)))
    assert out.count(f"universal {kind} {size} x dp {n // size} ok") == n, out
