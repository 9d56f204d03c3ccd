"""Curriculum learning (workers/curriculum.py) on 2 ranks, under chorus and under the real
DeepSpeed 0.19.8: the data analyzer's index files are the same bytes, and training over
them (by value with fixed_linear, by percentile with fixed_discrete) draws the same
samples on every rank at every step, to the same losses; chorus's resumed run draws what
the uninterrupted one drew."""
import filecmp
import json
import os

from conftest import under_both


def test_curriculum_learning_equals_deepspeeds(tmp_path):
    folders, _ = under_both(2, "curriculum.py", tmp_path)
    ds, ch = folders["deepspeed"], folders["chorus"]
    compared = 0
    for metric in ("difficulty", "labels"):
        for name in sorted(os.listdir(ds / "analysis" / metric)):
            if (ds / "analysis" / metric / name).is_file():
                assert filecmp.cmp(ds / "analysis" / metric / name, ch / "analysis" / metric / name, shallow=False), name
                compared += 1
    assert compared == 16, compared  # (7 index files of the difficulty in .bin/.idx, the label counts')
    for rank in (0, 1):
        want = json.loads((ds / f"result_{rank}.json").read_text())
        got = json.loads((ch / f"result_{rank}.json").read_text())
        assert "/overlays/deepspeed/" in want["deepspeed"] and "chorus" in got["deepspeed"]
        for case in ("value", "percentile"):
            assert got[case]["seen"] == want[case]["seen"], (rank, case)
            assert len({i for batch in got[case]["seen"] for i in batch}) > 8  # (the curriculum opens up)
            assert max(abs(a - b) for a, b in zip(got[case]["losses"], want[case]["losses"])) < 1e-5
        assert got["resumed_equal"] is True
