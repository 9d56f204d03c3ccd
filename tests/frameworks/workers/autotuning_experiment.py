"""One experiment as DeepSpeed's autotuner runs it: a config with autotuning enabled
(profile from step 3, metrics after step 5) and a loop of 10 steps; the engine writes
the metrics to OUT_DIR/metrics.json and ends the process after step 6. Prints each step.

    autotuning_experiment.py OUT_DIR
"""
import os
import sys

import torch

import deepspeed
from flops_profile import B, D, T, Net


def main():
    out = sys.argv[1]
    deepspeed.init_distributed()
    cfg = {"train_micro_batch_size_per_gpu": B, "gradient_accumulation_steps": 2, "steps_per_print": 100,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "autotuning": {"enabled": True, "start_profile_step": 3, "end_profile_step": 5,
                          "metric_path": os.path.join(out, "metrics.json")}}
    torch.manual_seed(0)
    engine, _, _, _ = deepspeed.initialize(model=Net(), config=cfg)
    x = torch.randn(B, T, D)
    for step in range(1, 11):
        for _ in range(2):
            engine.backward(engine(x).square().mean())
            engine.step()
        print(f"finished step {step}", flush=True)


if __name__ == "__main__":
    main()
