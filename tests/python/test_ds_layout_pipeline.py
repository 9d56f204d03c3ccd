"""DeepSpeed's pipeline layout read at another stage count where a layer holds only frozen
parameters (workers/ds_layout_pipe_frozen.py). Against the real DeepSpeed: tests/frameworks/
test_ds_parallel_vs_deepspeed.py."""
import pytest

from conftest import ok


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from conftest import Ranks
    folder = tmp_path_factory.mktemp("ds_layout_pipe_frozen")
    ok(Ranks()(4, "ds_layout_pipe_frozen.py", "save", str(folder)))
    return folder


@pytest.mark.parametrize("ranks_pp", [(4, 2), (2, 2), (3, 1)])
def test_frozen_pipeline_layer_comes_back_from_deepspeeds_layer_files(ranks, saved, ranks_pp):
    """A frozen first layer (no stage's trained parameters claim it) saved at pp 2 x dp 2 comes
    back at pp 2 and pp 1, and the next step's loss equals the saving run's."""
    n, pp = ranks_pp
    out = ok(ranks(n, "ds_layout_pipe_frozen.py", "load", str(saved), str(pp)))
    assert out.count(f"frozen layer pp {pp} ok") == n, out
