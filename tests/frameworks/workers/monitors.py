"""The monitors a DeepSpeed config switches on (tensorboard, csv_monitor, wandb offline)
with wall_clock_breakdown, over STEPS optimizer steps of 2 micro-batches each under a
WarmupLR schedule, written under OUT. Runs under whatever `import deepspeed` is: the real
DeepSpeed (the reference) or chorus.deepspeed; the test compares what each wrote.

    monitors.py OUT
"""
import os
import sys

import torch

import deepspeed

STEPS = 6


def main():
    out = sys.argv[1]
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_DIR", out)
    deepspeed.init_distributed()
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 10 ** 6,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01,
                                                        "warmup_num_steps": 4, "warmup_type": "linear"}},
           "wall_clock_breakdown": True,
           "tensorboard": {"enabled": True, "output_path": os.path.join(out, "tb"), "job_name": "job"},
           "csv_monitor": {"enabled": True, "output_path": os.path.join(out, "csv"), "job_name": "job"},
           "wandb": {"enabled": True, "project": "chorus-test"}}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS * 2):
        loss = engine(torch.randn(4, 6, generator=gen)).square().mean()
        engine.backward(loss)
        engine.step()
    for m in (engine.monitor.tb_monitor,):
        if m is not None:
            m.summary_writer.flush()
    import wandb
    if wandb.run is not None:
        wandb.finish()
    print("monitors done", flush=True)


if __name__ == "__main__":
    main()
