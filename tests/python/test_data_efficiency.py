"""Random-LTD (data_efficiency.data_routing.random_ltd) under chorus: its layers against
plain indexing, forward and backward; an engine converted with convert_to_random_ltd on
2 ranks trains while the schedule grows, checkpoints the schedule, and names the
parameters as the plain model (workers/random_ltd_layers.py). The schedule itself is held
to DeepSpeed's in tests/frameworks/test_random_ltd_vs_deepspeed.py."""
from conftest import ok


def test_random_ltd_layers_and_engine(ranks, tmp_path):
    out = ok(ranks(2, "random_ltd_layers.py", str(tmp_path)))
    assert out.count("random-LTD layers ok") == 2, out


def test_index_files_and_schedules_refuse_bad_input_by_name(tmp_path):
    import numpy as np
    import pytest
    from chorus.deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler
    from chorus.deepspeed.runtime.data_pipeline.data_sampling.indexed_dataset import MMapIndexedDataset, write_rows
    from chorus.deepspeed.runtime.dataloader import RepeatingLoader

    rows = [np.arange(5), np.arange(3) * 7, np.zeros(0)]
    write_rows(str(tmp_path / "x"), rows, np.uint16)
    back = MMapIndexedDataset(str(tmp_path / "x"))
    assert [list(r) for r in back] == [list(r) for r in rows] and back.dtype is np.uint16
    with open(tmp_path / "x.idx", "r+b") as f:  # a truncated index is named, not misread
        f.truncate(40)
    with pytest.raises(ValueError, match="x.idx is 40 bytes"):
        MMapIndexedDataset(str(tmp_path / "x"))

    linear = CurriculumScheduler({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
                                  "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 16}})
    # floor(step/10 * 56 + 8) down to a multiple of 16, at least 16 (the first multiple >= 8), at most 64
    assert [linear.get_difficulty(s) for s in (0, 3, 5, 10, 20)] == [16, 16, 32, 64, 64]
    discrete = CurriculumScheduler({"min_difficulty": 1, "max_difficulty": 3, "schedule_type": "fixed_discrete",
                                    "schedule_config": {"difficulty": [1, 2, 3], "max_step": [2, 4]}})
    assert [discrete.get_difficulty(s) for s in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match="'schedule_config.total_curriculum_step'"):
        CurriculumScheduler({"min_difficulty": 1, "max_difficulty": 3, "schedule_type": "fixed_root",
                             "schedule_config": {"difficulty_step": 8, "root_degree": 2}})
    assert [x for _, x in zip(range(5), RepeatingLoader([1, 2]))] == [1, 2, 1, 2, 1]
