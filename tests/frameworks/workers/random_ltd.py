"""Random-LTD as a DeepSpeed config switches it on: the schedule's kept sequence length
and consumed layer tokens over 60 steps (DeepSpeed's RandomLTDScheduler, built from the
config as its engine builds it), and an engine trained 4 steps with the section on (no
layer converted: DeepSpeed's token kernels are CUDA-only), its losses and the engine's
schedule after them. Writes JSON to OUT. Runs under whatever `import deepspeed` is.

    random_ltd.py OUT.json
"""
import json
import sys

import torch

import deepspeed
from deepspeed.runtime.data_pipeline.data_routing.scheduler import RandomLTDScheduler

SECTION = {"enabled": True, "total_layer_num": 12, "random_ltd_layer_num": 10,
           "random_ltd_layer_id": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "model_mask_name": "attention_mask",
           "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
           "random_ltd_schedule": {"min_value": 128, "max_value": 2048, "schedule_type": "fixed_linear",
                                   "schedule_config": {"require_steps": 50, "seq_per_step": 16}},
           "layer_token_lr_schedule": {"enabled": False}}


def main():
    out = {}
    schedule = RandomLTDScheduler(dict(SECTION, global_batch_size=8, micro_batch_size=4))
    seqs = []
    for step in range(60):
        schedule.update_seq(step)
        seqs.append(schedule.get_current_seq())
    out["schedule"] = {"seq": seqs, "consumed": schedule.state_dict()["consumed_layer_tokens"]}
    deepspeed.init_distributed()
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
           "data_efficiency": {"enabled": True, "data_routing": {"enabled": True, "random_ltd": SECTION}}}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    gen = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(engine(torch.randn(4, 8, generator=gen)),
                                                 torch.randint(0, 3, (4,), generator=gen))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    out["losses"] = losses
    out["engine_schedule"] = engine.random_ltd_scheduler.state_dict()
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
