"""checkpoint.tag_validation on 2 ranks (workers/ds_tag_validation.py)."""
from conftest import ok


def test_tag_validation_modes(ranks, tmp_path):
    out = ok(ranks(2, "ds_tag_validation.py", str(tmp_path)))
    assert out.count("tag validation ok") == 2, out
