"""chorus.deepspeed under chorusrun: ZeRO stages 0-3 against a single-process
reference, loss scaling, checkpoints (same and other world size, damaged shards,
consolidation), memory against the ZeRO formulas, and the seed's example."""
import os
import subprocess
import sys

import pytest

from conftest import BUILD, REPO, ok


@pytest.fixture
def zero_env(tmp_path):
    return {"ZERO_TMP": str(tmp_path)}


@pytest.mark.parametrize("n", [2, 3])
def test_stages_match_single_process_training(ranks, n, zero_env):
    out = ok(ranks(n, "zero_parity.py", env=zero_env))
    assert out.count("zero parity ok") == n
    assert out.count("stage=3 bf16 offload=True adam gas=1") == n  # the matrix ran


@pytest.mark.parametrize("n", [2, 3])
def test_zero_init_hooks_as_deepspeeds(ranks, n):
    """zero.Init: rank 0's values everywhere, Module.apply on whole parameters, a
    subclass's changes kept, skip_init's meta children partitioned (workers/zero_init_hooks.py)."""
    out = ok(ranks(n, "zero_init_hooks.py"))
    assert all(f"[{r}]<stdout>:ok {r}" in out for r in range(n)), out


@pytest.mark.parametrize("stage", [0, 3])
def test_the_model_stays_in_host_memory_without_a_gpu(ranks, stage):
    out = ok(ranks(2, "ds_placement.py", str(stage), env={"DS_ACCELERATOR": "cpu"}))
    assert out.count("placement ok") == 2


def test_zero3_leaf_modules_gather_their_children(ranks):
    """set_z3_leaf_modules(model, [nn.MultiheadAttention]): a TransformerEncoderLayer at stage 3."""
    out = ok(ranks(2, "zero_leaf.py"))
    assert out.count("zero leaf ok") == 2, out


def test_loss_scaler_follows_deepspeeds_schedule(ranks):
    out = ok(ranks(2, "zero_scaler.py"))
    assert out.count("zero scaler ok") == 2


def test_checkpoint_resume_same_world_and_damaged_shards(ranks, zero_env):
    out = ok(ranks(2, "zero_checkpoint.py", "same", env=zero_env))
    assert out.count("zero checkpoint ok") == 2
    assert "truncate shard refused" in out and "flip shard refused" in out


def test_checkpoints_in_deepspeeds_layout_resume_exactly(ranks, tmp_path):
    """checkpoint.format "deepspeed" with tied, frozen and buffer state at ZeRO 0-3; a failed write
    on one rank (workers/zero_ds_layout.py). Against the real DeepSpeed: tests/frameworks."""
    out = ok(ranks(2, "zero_ds_layout.py", str(tmp_path)))
    assert out.count("ds layout refusals ok") == 2 and out.count("ds layout z3 bf16 ok") == 2, out


def test_asynchronous_saves_write_what_a_blocking_save_writes(ranks, tmp_path):
    """save_checkpoint(async_save=True), both formats: the same files as a blocking save at
    that step, `latest` only once all ranks wrote, a failed background write raised on every
    rank with `latest` kept (workers/zero_async_save.py)."""
    out = ok(ranks(2, "zero_async_save.py", str(tmp_path)))
    assert out.count("async failures ok") == 2 and out.count("async deepspeed stage 1 ok") == 2, out


def test_node_local_checkpoint_loads_only_where_it_was_saved(ranks, tmp_path):
    out = ok(ranks(2, "zero_node_local.py", str(tmp_path)))
    assert out.count("node-local refusal ok") == 2, out


@pytest.mark.parametrize("before,after", [(2, 3), (3, 2)])
def test_checkpoint_moves_to_another_world_size(ranks, zero_env, before, after):
    ok(ranks(before, "zero_checkpoint.py", "save", env=zero_env))
    out = ok(ranks(after, "zero_checkpoint.py", "resume", env=zero_env))
    assert out.count("zero resume ok") == after


def test_zero_to_fp32_loads_into_the_plain_model(ranks, tmp_path):
    ok(ranks(2, "zero_checkpoint.py", "save", env={"ZERO_TMP": str(tmp_path)}))
    out_file = tmp_path / "model.pt"
    proc = subprocess.run([os.path.join(BUILD, "chorus-zero-to-fp32"), str(tmp_path / "moved-3"), str(out_file)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "workers"))
    import torch
    from zero_common import make_model
    model = make_model(seed=3)
    model.load_state_dict(torch.load(out_file, weights_only=True))  # strict: every name and shape matches
    # The consolidated weights are the trained ones, not the initial ones.
    assert any((a - b).abs().max() > 1e-4 for a, b in zip(model.parameters(), make_model().parameters()))
    proc = subprocess.run([os.path.join(BUILD, "chorus-zero-to-fp32"), str(tmp_path / "nothing"), str(out_file)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 1 and "latest" in proc.stdout


def test_initialize_paths_and_errors(ranks, zero_env):
    out = ok(ranks(3, "zero_api.py", env=zero_env))
    assert out.count("zero api ok") == 3


def test_engine_attributes_and_methods(ranks, zero_env):
    out = ok(ranks(2, "zero_engine_api.py", env=zero_env))
    assert out.count("engine api ok") == 2


@pytest.mark.parametrize("n", [2, 3])
def test_memory_report_matches_zero_formulas(ranks, n):
    out = ok(ranks(n, os.path.join(REPO, "bench", "zero_memory.py"), "--params", "3M", "--width", "384", "--check"))
    assert out.count("ratio 1.0") == 4 or out.count("ratio 0.9") + out.count("ratio 1.0") == 4, out


def test_seed_deepspeed_example(ranks):
    out = ok(ranks(2, os.path.join(REPO, "examples", "deepspeed", "seed_simple.py")))
    assert out.count("Epoch [5/5], Step [31/32]") == 2, out


@pytest.mark.parametrize("n,stages,dtype,act_ckpt", [(2, 2, "fp32", 0), (2, 2, "bf16", 0), (4, 2, "fp32", 0),
                                                     (4, 4, "fp32", 0), (4, 4, "bf16", 0), (2, 2, "fp32", 2),
                                                     (4, 2, "fp16", 0)])
def test_pipeline_matches_single_process_training(ranks, tmp_path, n, stages, dtype, act_ckpt):
    if dtype == "fp16":
        import torch
        try:
            torch.nn.functional.linear(torch.ones(2, 2, dtype=torch.float16), torch.ones(2, 2, dtype=torch.float16))
        except RuntimeError:
            pytest.skip(f"torch {torch.__version__} has no float16 matmul on the CPU (scripts/test-torch2.sh runs it)")
    out = ok(ranks(n, "pipe_parity.py", str(stages), dtype, str(tmp_path / "ckpt"), env={"ACT_CKPT": str(act_ckpt)}))
    assert out.count("pipe parity ok") == n


def test_activation_checkpointing_same_gradients_less_memory(ranks):
    out = ok(ranks(2, "act_ckpt.py"))
    assert out.count("checkpointing ok") == 2


def test_pipeline_schedule_is_1f1b():
    from chorus.deepspeed.runtime.pipe.schedule import train_steps
    for stages in (1, 2, 4):
        for micro in (1, 3, 8):
            for stage in range(stages):
                steps = train_steps(micro, stages, stage)
                # Every micro-batch once forward, once backward, backward after forward.
                assert sorted(steps) == sorted([("forward", i) for i in range(micro)] +
                                               [("backward", i) for i in range(micro)])
                assert all(steps.index(("forward", i)) < steps.index(("backward", i)) for i in range(micro))
                # At most stages - stage activations alive at once (1F1B's memory bound).
                alive = peak = 0
                for kind, _ in steps:
                    alive += 1 if kind == "forward" else -1
                    peak = max(peak, alive)
                assert peak == min(stages - stage, micro), (stages, micro, stage, steps)


@pytest.mark.parametrize("n,dtype", [(2, "fp32"), (4, "fp32"), (4, "bf16")])
def test_tensor_parallel_matches_single_process(ranks, n, dtype):
    out = ok(ranks(n, "tensor_parallel.py", dtype))
    assert out.count("tensor parallel ok") == n


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_data_pipeline_tensor_3d_on_8_ranks(ranks, dtype):
    out = ok(ranks(8, "pipe_3d.py", dtype, env={"CHORUS_TIMEOUT_SECONDS": "60"}))
    assert out.count("3d ok") == 8


@pytest.mark.parametrize("tp", [1, 2])
def test_distributed_transformer_example_trains(ranks, tp):
    out = ok(ranks(8, os.path.join(REPO, "examples", "parallel", "distributed_transformer.py"),
                   "--tensor-parallel", str(tp), "--steps", "30", env={"CHORUS_TIMEOUT_SECONDS": "60"}))
    assert f"4 stages x {tp} tensor-parallel" in out, out


def test_gradient_priority_orders_the_engines_collectives(ranks, tmp_path):
    out = ok(ranks(2, "zero_priority.py", str(tmp_path / "trace.json")))
    assert out.count("priority ok") == 2


@pytest.mark.parametrize("n", [2, 3])
def test_deepspeed_client_surface(ranks, n, tmp_path):
    """deepspeed.comm, zero.Init, GatheredParameters, client configs, checkpoints (workers/ds_clients.py)."""
    out = ok(ranks(n, "ds_clients.py", str(tmp_path)))
    assert out.count("ds clients ok") == n, out
