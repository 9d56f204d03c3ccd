"""chorus.tensorflow and chorus.tensorflow.keras under chorusrun."""
import pytest

from conftest import ok


@pytest.mark.parametrize("n", [1, 2, 3])
def test_every_op_eager_and_graph(ranks, n):
    out = ok(ranks(n, "ops.py", timeout=600))
    assert out.count("tf ops ok") == n
