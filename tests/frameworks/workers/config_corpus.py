"""A corpus of DeepSpeed configs written from DeepSpeed's config documentation, one
per section and some combinations, each trained for STEPS steps of a small model on
one rank; rank 0's losses, or the error initialize or training raised, go to OUT as
JSON. Runs under whatever `import deepspeed` is: the real DeepSpeed 0.19.8 (the
reference) or chorus.deepspeed; the test compares the two.

    config_corpus.py OUT.json
"""
import json
import os
import sys
import tempfile

import torch

STEPS = 3
BASE = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 100,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}}}
SCRATCH = tempfile.mkdtemp(prefix="corpus")


def with_(base=None, **sections):
    cfg = json.loads(json.dumps(BASE if base is None else base))
    cfg.update(sections)
    return cfg


def zero(stage, **more):
    return {"stage": stage, **more}


CORPUS = {
    "minimal": with_(),
    "train_batch_size only": with_({"train_batch_size": 4, "optimizer": BASE["optimizer"]}),
    "comments and unknown keys": with_(_comment="from a tutorial", cuda_visible_devices="0",
                                       zero_optimization=zero(1)),
    "gradient accumulation": with_(gradient_accumulation_steps=2, train_batch_size=8),
    "gradient clipping off": with_(gradient_clipping=0.0),
    "gradient clipping 0.1": with_(gradient_clipping=0.1),
    "bf16": with_(bf16={"enabled": True}),
    "bfloat16 spelling": with_(bfloat16={"enabled": True}),
    "fp16": with_(fp16={"enabled": True, "initial_scale_power": 8}),
    "zero 1": with_(zero_optimization=zero(1)),
    "zero 2 tuned": with_(zero_optimization=zero(2, allgather_partitions=True, allgather_bucket_size=2e8,
                                                  overlap_comm=True, reduce_scatter=True, reduce_bucket_size=2e8,
                                                  contiguous_gradients=True, round_robin_gradients=False)),
    "zero 2 offload": with_(zero_optimization=zero(2, offload_optimizer={"device": "cpu", "pin_memory": True})),
    "zero 3 field names": with_(zero_optimization=zero(3, gather_16bit_weights_on_model_save=True,
                                                       prefetch_bucket_size=1000, param_persistence_threshold=10,
                                                       max_live_parameters=10 ** 6, sub_group_size=10 ** 6)),
    "zero 3 stage3_ names": with_(zero_optimization=zero(3, stage3_gather_16bit_weights_on_model_save=True,
                                                          stage3_prefetch_bucket_size=1000,
                                                          stage3_param_persistence_threshold=10)),
    "zero 3 offload both": with_(zero_optimization=zero(3, offload_optimizer={"device": "cpu"},
                                                         offload_param={"device": "cpu"})),
    "zero 3 auto values": with_(zero_optimization=zero(3, reduce_bucket_size="auto",
                                                        stage3_prefetch_bucket_size="auto")),
    "zero legacy true": with_(zero_optimization=True),
    "zero cpu_offload legacy": with_(zero_optimization=zero(2, cpu_offload=True)),
    "bf16 zero 2": with_(bf16={"enabled": True}, zero_optimization=zero(2)),
    "bf16 master weights and states zero 2": with_(bf16={"enabled": True, "bf16_master_weights_and_grads": True,
                                                         "bf16_optimizer_states": True},
                                                   zero_optimization=zero(2)),
    "bf16 master weights, autocast, zero 3": with_(bf16={"enabled": True, "bf16_master_weights_and_grads": True,
                                                         "bf16_optimizer_states": True},
                                                   torch_autocast={"enabled": True, "dtype": "torch.bfloat16"},
                                                   zero_optimization=zero(3, stage3_param_persistence_threshold=0)),
    "Adam adam_w_mode false": with_(optimizer={"type": "Adam", "params": {"lr": 1e-2, "weight_decay": 0.01,
                                                                          "adam_w_mode": False}}),
    "Adam bias_correction false": with_(optimizer={"type": "Adam", "params": {"lr": 1e-2,
                                                                              "bias_correction": False}},
                                       zero_optimization=zero(2)),
    "Adam torch_adam": with_(optimizer={"type": "Adam", "params": {"lr": 1e-2, "torch_adam": True}}),
    "Lion offload": with_(optimizer={"type": "Lion", "params": {"lr": 1e-3}},
                          zero_optimization=zero(1, offload_optimizer={"device": "cpu"})),
    "Adagrad": with_(optimizer={"type": "Adagrad", "params": {"lr": 0.05}}),
    "SGD momentum": with_(optimizer={"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9}}),
    "RMSprop": with_(optimizer={"type": "RMSprop", "params": {"lr": 1e-3}}),
    "Adamax zero 1": with_(optimizer={"type": "Adamax", "params": {"lr": 1e-2}}, zero_optimization=zero(1)),
    "WarmupLR": with_(scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01,
                                                                "warmup_num_steps": 2}}),
    "WarmupDecayLR": with_(scheduler={"type": "WarmupDecayLR", "params": {"total_num_steps": 10,
                                                                          "warmup_num_steps": 2}}),
    "WarmupCosineLR": with_(scheduler={"type": "WarmupCosineLR", "params": {"total_num_steps": 10,
                                                                            "warmup_num_steps": 2}}),
    "OneCycle": with_(scheduler={"type": "OneCycle", "params": {"cycle_min_lr": 1e-3, "cycle_max_lr": 1e-2,
                                                                "cycle_first_step_size": 2}}),
    "monitors": with_(tensorboard={"enabled": True, "output_path": SCRATCH, "job_name": "tb"},
                      csv_monitor={"enabled": True, "output_path": SCRATCH, "job_name": "csv"},
                      wall_clock_breakdown=True, memory_breakdown=False),
    "monitors off": with_(tensorboard={"enabled": False}, wandb={"enabled": False}, comet={"enabled": False},
                          csv_monitor={"enabled": False}),
    "torch_autocast bf16 zero 1": with_(torch_autocast={"enabled": True, "dtype": "bfloat16"},
                                        zero_optimization=zero(1)),
    "activation_checkpointing": with_(activation_checkpointing={"partition_activations": False,
                                                                "cpu_checkpointing": False,
                                                                "contiguous_memory_optimization": False,
                                                                "number_checkpoints": None,
                                                                "synchronize_checkpoint_boundary": False,
                                                                "profile": False}),
    "checkpoint section": with_(checkpoint={"tag_validation": "Warn", "parallel_write": {"pipeline_stage": False}}),
    "data_efficiency off": with_(data_efficiency={"enabled": False, "seed": 1234,
                                                  "data_sampling": {"enabled": False}}),
    "compile section": with_(compile={"deepcompile": False}),
    "hybrid_engine off": with_(hybrid_engine={"enabled": False}),
    "aio section": with_(aio={"block_size": 1048576, "queue_depth": 8, "single_submit": False,
                              "overlap_events": True}),
    "dataloader_drop_last and prescale": with_(dataloader_drop_last=True, prescale_gradients=True,
                                               gradient_predivide_factor=1.0),
    "communication_data_type fp32 with fp32": with_(communication_data_type="fp32"),
    "elasticity (removed)": with_(elasticity={"enabled": True, "max_train_batch_size": 8,
                                              "micro_batch_sizes": [4], "min_gpus": 1, "max_gpus": 1}),
    "progressive_layer_drop (removed)": with_(progressive_layer_drop={"enabled": True, "theta": 0.5,
                                                                      "gamma": 0.001}),
    "typo in zero (refused)": with_(zero_optimization={"stage": 1, "overlap_com": True}),
    "flops_profiler": with_(flops_profiler={"enabled": True, "profile_step": 2, "module_depth": -1,
                                            "top_modules": 1, "detailed": True,
                                            "output_file": os.path.join(SCRATCH, "flops.txt")}),
    "comms_logger": with_(comms_logger={"enabled": True, "verbose": False, "prof_all": True, "debug": False}),
    "communication_data_type fp32 with bf16": with_(bf16={"enabled": True}, communication_data_type="fp32"),
    "communication_data_type fp32 with bf16 zero 1": with_(bf16={"enabled": True}, communication_data_type="fp32",
                                                           zero_optimization=zero(1)),
    "communication_data_type bf16 with fp32 zero 2": with_(communication_data_type="bf16", zero_optimization=zero(2)),
    "engine.compile() zero 2": with_(zero_optimization=zero(2), compile={"deepcompile": False}),
}
COMPILED = {"engine.compile() zero 2"}  # these call engine.compile() (torch.compile) before training


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.GELU(), torch.nn.Linear(32, 32), torch.nn.GELU(),
                               torch.nn.Linear(32, 4))


def train(cfg, compile_=False):
    import deepspeed
    engine, _, _, _ = deepspeed.initialize(model=model(), model_parameters=None, config=cfg)
    if compile_:
        engine.compile()
        assert engine.is_compiled and engine.module._compiled_call_impl is not None
    dtype = torch.bfloat16 if (cfg.get("bf16") or cfg.get("bfloat16") or {}).get("enabled") else \
        torch.float16 if (cfg.get("fp16") or {}).get("enabled") else torch.float32
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(STEPS * engine.gradient_accumulation_steps()):
        x = torch.randn(4, 10, generator=gen).to(engine.device, dtype)
        y = torch.randint(0, 4, (4,), generator=gen).to(engine.device)
        loss = torch.nn.functional.cross_entropy(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def main():
    out = sys.argv[1]
    import deepspeed
    deepspeed.init_distributed()
    results = {}
    for name, cfg in CORPUS.items():
        try:
            results[name] = {"losses": train(cfg, name in COMPILED)}
        except BaseException as e:  # noqa: B036  (DeepSpeed's autotuner exits; record, go on)
            results[name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
    with open(out, "w") as f:
        json.dump({"deepspeed": deepspeed.__file__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
