"""Random-LTD (data_efficiency.data_routing.random_ltd) under chorus: its layers against
plain indexing, forward and backward; an engine converted with convert_to_random_ltd on
2 ranks trains while the schedule grows, checkpoints the schedule, and names the
parameters as the plain model (workers/random_ltd_layers.py). The schedule itself is held
to DeepSpeed's in tests/frameworks/test_random_ltd_vs_deepspeed.py."""
from conftest import ok


def test_random_ltd_layers_and_engine(ranks, tmp_path):
    out = ok(ranks(2, "random_ltd_layers.py", str(tmp_path)))
    assert out.count("random-LTD layers ok") == 2, out
