"""DeepSpeedEngine's attributes and methods that DeepSpeed scripts use, on 2 ranks."""
import math
import os

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from zero_common import chunk, data, loss_fn, make_model, reference, tmpdir, train

hvd.init()
world, rank = hvd.size(), hvd.rank()
x, y = data(4 * world, 3)
tmp = tmpdir()

# Names from DeepSpeed's engine API that scripts and tutorials reach for.
NAMES = """global_rank world_size local_rank dp_world_size mp_world_size global_steps global_samples micro_steps
skipped_steps module optimizer lr_scheduler training_dataloader client_lr_scheduler device loss_scale
train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps get_batch_info set_train_batch_size
set_train_micro_batch_size is_gradient_accumulation_boundary set_gradient_accumulation_boundary
zero_optimization zero_optimization_stage zero_optimization_partition_gradients zero_optimization_partition_weights
zero_offload_optimizer zero_offload_param zero_cpu_offload zero_reduce_bucket_size fp16_enabled bfloat16_enabled
amp_enabled dynamic_loss_scale initial_dynamic_scale gradient_clipping steps_per_print wall_clock_breakdown
get_lr get_mom get_type get_global_grad_norm was_step_applied optimizer_name scheduler_name forward backward step
zero_grad train eval deepspeed_io save_checkpoint load_checkpoint save_16bit_model save_fp16_model
module_state_dict destroy train_batch eval_batch no_sync compile curriculum_learning_enabled
sparse_gradients_enabled flops_profiler_enabled""".split()

for stage in (1, 3):
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.0,
           "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": stage},
           "fp16": {"enabled": False, "initial_scale_power": 12}, "steps_per_print": 7}
    model = make_model()
    engine, opt, loader, sched = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    missing = [n for n in NAMES if not hasattr(engine, n)]
    assert not missing, missing
    assert (engine.global_rank, engine.world_size, engine.local_rank) == (rank, world, hvd.local_rank())
    assert engine.dp_world_size == world and engine.mp_world_size == 1
    assert engine.module is not engine and isinstance(engine.module, torch.nn.Sequential)
    assert engine.optimizer is opt and engine.lr_scheduler is sched is None and loader is None
    assert engine.train_batch_size() == 2 * 2 * world and engine.get_batch_info() == (4 * world, 2, 2)
    assert engine.zero_optimization_stage() == stage and engine.zero_optimization()
    assert engine.zero_optimization_partition_weights() == (stage == 3)
    assert not engine.fp16_enabled() and not engine.bfloat16_enabled() and not engine.dynamic_loss_scale()
    assert engine.initial_dynamic_scale() == 2.0 ** 12 and engine.steps_per_print() == 7
    assert engine.get_lr() == [0.1] and engine.optimizer_name() == "sgd"

    # One step, checked against the norm of the gradient computed here from every rank's data.
    boundaries = []
    for micro in range(2):
        boundaries.append(engine.is_gradient_accumulation_boundary())
        xb, yb = chunk(x, y, 0, micro, rank, 2, world, 2)
        engine.backward(loss_fn(engine(xb), yb))
        engine.step()
    assert boundaries == [False, True]
    assert (engine.global_steps, engine.micro_steps, engine.global_samples) == (1, 2, 2 * 2 * world)
    assert engine.was_step_applied()
    ref_model = make_model()
    for micro in range(2):
        for k in range(world):
            xb, yb = chunk(x, y, 0, micro, k, 2, world, 2)
            (loss_fn(ref_model(xb), yb) / (2 * world)).backward()
    norm = math.sqrt(sum(float((p.grad ** 2).sum()) for p in ref_model.parameters()))
    assert abs(engine.get_global_grad_norm() - norm) < 1e-4 * norm, (engine.get_global_grad_norm(), norm)

    # save_16bit_model writes the whole model (gathered at stage 3) that torch.load reads.
    train(engine, x, y, 3, start=1)
    path = os.path.join(tmp, f"api{stage}")
    engine.save_16bit_model(path, "model.bin")
    expect = reference(make_model(), cfg, torch.float32, x, y, 3, world)[0]
    saved = torch.load(os.path.join(path, "model.bin"))
    plain = make_model()
    plain.load_state_dict(saved)
    for p, q in zip(plain.parameters(), expect):
        assert torch.allclose(p, q, atol=2e-5)

    # Batch-size changes go through gradient accumulation, as in DeepSpeed.
    engine.set_train_batch_size(2 * 3 * world)
    assert engine.gradient_accumulation_steps() == 3
    try:
        engine.set_train_batch_size(2 * world + 1)
    except ValueError as e:
        assert "multiple" in str(e)
    else:
        raise AssertionError("a train batch that is not a multiple was accepted")
    engine.set_gradient_accumulation_boundary(True)
    assert engine.is_gradient_accumulation_boundary()

    if not hasattr(torch.nn.Module, "compile"):  # engine.compile() says which torch it needs
        try:
            engine.compile()
        except RuntimeError as e:
            assert "compile is not supported" in str(e) and torch.__version__ in str(e), e
        else:
            raise AssertionError("compile() went through without nn.Module.compile")
    for name in ("train_batch", "no_sync"):
        try:
            getattr(engine, name)()
        except NotImplementedError as e:
            assert "does not support" in str(e) and name in str(e), e
        else:
            raise AssertionError(f"{name}() did not raise")
hvd.shutdown()
print(f"rank {rank}: engine api ok", flush=True)
