"""Dynamic batching (workers/dynamic_batching.py, 2 ranks): DeepSpeed's loader and LR
scheduler for batches packed by sequence length, under chorus and the real DeepSpeed
0.19.8: each picking order (dataloader, seqlen, random) gives every rank the same
micro-batches (the same sample ids), the same batch-size-scaled learning rates and the
same losses. The lengths measured into the metrics folder and read back from its files
give what the lengths passed in give."""
import json

import pytest

from conftest import chorusrun, real_deepspeed, run, PYTHON

CASES = ("dataloader", "seqlen", "random")


def test_dynamic_batching_equals_deepspeeds(tmp_path):
    real_deepspeed(2, "dynamic_batching.py", tmp_path / "ds.json", tmp_path / "ds_metrics", *CASES)
    chorusrun(2, "dynamic_batching.py", tmp_path / "ch.json", tmp_path / "ch_metrics", *CASES, "seqlen-measured",
              "seqlen-files")
    want, got = (json.loads((tmp_path / f).read_text()) for f in ("ds.json", "ch.json"))
    assert "/overlays/deepspeed/" in want["deepspeed"] and "chorus" in got["deepspeed"]
    for rank in range(2):
        for case in CASES:
            a, b = got["ranks"][rank][case], want["ranks"][rank][case]
            assert "ids" in a and "ids" in b, (rank, case, a, b)
            assert len(a["ids"]) >= 6 and a["ids"] == b["ids"], (rank, case)
            assert a["lrs"] == pytest.approx(b["lrs"], rel=1e-12, abs=0), (rank, case)
            assert max(abs(x - y) for x, y in zip(a["losses"], b["losses"])) <= 1e-6, (rank, case)
        # Packing really varies the batch: several sizes, and the rate follows them.
        sizes = {len(ids) for ids in got["ranks"][rank]["dataloader"]["ids"]}
        assert len(sizes) > 1 and len(set(got["ranks"][rank]["dataloader"]["lrs"])) > 1
        for case in ("seqlen-measured", "seqlen-files"):
            files = got["ranks"][rank][case]
            assert files.get("ids") == got["ranks"][rank]["seqlen"]["ids"], (rank, case, files)
            assert files["losses"] == got["ranks"][rank]["seqlen"]["losses"]
    assert (tmp_path / "ch_metrics" / "seqlen" / "seqlen_sample_to_metric.idx").exists()


def test_dynamic_batching_needs_max_tokens():
    code = ("from chorus.deepspeed.runtime.config_features import refuse_unsupported\n"
            "try:\n refuse_unsupported({'data_efficiency': {'data_sampling': {'dynamic_batching': {'enabled': True}}}})\n"
            "except ValueError as e:\n print('refused:', e)\n")
    out = run([PYTHON, "-c", code])
    assert "refused:" in out and "dynamic_batching.max_tokens" in out
