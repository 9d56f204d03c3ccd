"""chorus.tensorflow and chorus.tensorflow.keras under chorusrun."""
import pytest

from conftest import ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_op_eager_and_graph(ranks, n):
    out = ok(ranks(n, "ops.py", timeout=600))
    assert out.count("tf ops ok") == n


@pytest.mark.parametrize("n", [1, 3])
def test_gradients_are_horovods(ranks, n):
    out = ok(ranks(n, "grads.py"))
    assert out.count("tf grads ok") == n


@pytest.mark.parametrize("n", [2, 3])
def test_optimizers_match_one_process_on_the_global_batch(ranks, n):
    out = ok(ranks(n, "optimizer.py", timeout=600))
    assert out.count("tf optimizer ok") == n
