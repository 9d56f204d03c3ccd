"""deepspeed.moe and deepspeed.sequence over chorus process sets, on 4 ranks: the
MoE layer and training under ZeRO 0-2 at ep 1, 2 and 4, beside tensor parallelism,
checkpoints across expert-parallel sizes, Ulysses attention; each against one process holding the
whole model."""
import json
import os
import re

import pytest

from conftest import REPO, ok


def test_moe_layer_matches_one_process_with_every_expert(ranks):
    out = ok(ranks(4, "moe_layer.py"))
    assert out.count("moe layer ok rank") == 4, out


def test_moe_training_under_zero_matches_one_process(ranks):
    out = ok(ranks(4, "moe_train.py"))
    assert out.count("moe training ok rank") == 4, out
    assert out.count("stage=2 ep=4 k=1") == 4 and out.count("SGD") == 8, out  # the matrix ran


def test_moe_data_before_expert_layout(ranks):
    """DeepSpeed's use_data_before_expert_parallelism: expert-parallel sets {0,2}, {1,3}."""
    out = ok(ranks(4, "moe_train.py", "--data-first"))
    assert out.count("moe training ok rank") == 4, out


def test_moe_beside_tensor_parallelism_matches_one_process(ranks):
    """tp 2 x dp 2: whole experts (expert-parallel sets across the slices) and sliced ones
    (enable_expert_tensor_parallelism), each with a checkpoint joined by zero_to_fp32."""
    out = ok(ranks(4, "moe_tensor_parallel.py"))
    assert out.count("moe tensor parallel ok rank") == 4, out
    assert out.count("moe tp ok rank") == 4 * 7 and out.count("moe tp checkpoint ok") == 4 * 3, out
    assert out.count("moe tp random gate ok") == 4 * 2, out


def test_moe_checkpoint_at_ep2_loads_at_ep1_and_ep4(ranks, tmp_path):
    out = ok(ranks(4, "moe_checkpoint.py", env={"ZERO_TMP": str(tmp_path)}))
    for ep, stage in ((1, 2), (4, 2), (2, 1), (4, 0)):
        assert out.count(f"ep=2 -> ep={ep} stage {stage}") == 4, out
    assert out.count("moe checkpoint refused ok") == 4 and out.count("moe frozen experts ok") == 4, out
    assert out.count("moe zero_to_fp32 ok") == 4, out


def test_ulysses_attention_matches_full_attention_and_trains_under_zero2(ranks):
    out = ok(ranks(4, "ulysses.py"))
    for what in ("ulysses attention ok", "ds comm on a process set ok", "ulysses refusal ok", "ulysses zero2 ok"):
        assert out.count(what) == 4, out


def _timeline_alltoalls(path):
    """{op name: set of process set ids} of the alltoalls in one rank's timeline."""
    events = json.load(open(path))
    rows = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    found = {}
    for e in events:
        name = e.get("name", "")
        if name.endswith("_ALLTOALL") and not name.startswith("NEGOTIATE") and e.get("ph") == "B":
            found.setdefault(rows[e["pid"]], set()).add(e["args"]["process_set"])
    return found


@pytest.mark.parametrize("script,marker", [("moe_transformer.py", ".dispatch"), ("ulysses_transformer.py", ".q")])
def test_examples_train_and_each_ranks_timeline_shows_its_sets_alltoalls(ranks, tmp_path, script, marker):
    out = ok(ranks(4, os.path.join(REPO, "examples", "deepspeed", script), "--steps", "60",
                   env={"CHORUS_TIMELINE": str(tmp_path / "tl.%r.json")}))
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", out).groups())
    assert last < first / 3, out
    sets = []
    for r in range(4):
        ops = _timeline_alltoalls(tmp_path / f"tl.{r}.json")
        mine = {s for name, ids in ops.items() if name.endswith(marker) for s in ids}
        assert len(mine) == 1, (r, ops)  # every forward alltoall on this rank's one set
        assert any(name.endswith(marker + ".grad") for name in ops), ops  # and the backward's
        sets.append(mine.pop())
    # Ranks 0,1 share one set, 2,3 another: two sets' alltoalls, each in its members' timelines.
    assert sets[0] == sets[1] and sets[2] == sets[3] and sets[0] != sets[2], sets


def test_muon_with_moe_resumes(ranks, tmp_path):
    out = ok(ranks(4, "moe_muon_resume.py", str(tmp_path / "ckpt")))
    assert out.count("moe muon resume ok rank") == 4, out
