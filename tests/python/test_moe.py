"""deepspeed.moe and deepspeed.sequence over chorus process sets, on 4 ranks: the
MoE layer and training under ZeRO 0-2 at ep 1, 2 and 4, checkpoints across
expert-parallel sizes, Ulysses attention; each against one process holding the
whole model."""
from conftest import ok


def test_moe_layer_matches_one_process_with_every_expert(ranks):
    out = ok(ranks(4, "moe_layer.py"))
    assert out.count("moe layer ok rank") == 4, out


def test_moe_training_under_zero_matches_one_process(ranks):
    out = ok(ranks(4, "moe_train.py"))
    assert out.count("moe training ok rank") == 4, out
    assert out.count("stage=2 ep=4 k=1") == 4, out  # the matrix ran


def test_moe_checkpoint_at_ep2_loads_at_ep1_and_ep4(ranks, tmp_path):
    out = ok(ranks(4, "moe_checkpoint.py", env={"ZERO_TMP": str(tmp_path)}))
    for ep, stage in ((1, 2), (4, 2), (2, 1), (4, 0)):
        assert out.count(f"ep=2 -> ep={ep} stage {stage}") == 4, out


def test_ulysses_attention_matches_full_attention_and_trains_under_zero2(ranks):
    out = ok(ranks(4, "ulysses.py"))
    for what in ("ulysses attention ok", "ulysses refusal ok", "ulysses zero2 ok"):
        assert out.count(what) == 4, out
