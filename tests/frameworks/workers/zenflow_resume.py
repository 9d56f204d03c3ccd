"""chorus's ZenFlow resumes from a checkpoint onto the same training: a bf16 model with
biases, the overlapped step (a CPU step in flight at the save) and the sequential one,
20 micro-steps straight against 8, save, a new engine, load, 12 more. Then the configs chorus refuses, each error recorded.

    zenflow_resume.py OUT.json SAVE_DIR
"""
import json
import sys

import torch

# Saved after micro-step 7's boundary, which used the second moments set: the next reselection
# (24) is past the end, so the resumed run needs the saved selection, selective moments,
# trajectory and both moment sets (the second is used again at 15, its result reaching the model at 19).
MICRO, SAVE_AT = 20, 8


def config(**zenflow):
    return {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10 ** 6,
            "bf16": {"enabled": True}, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
            "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                  "zenflow": dict({"topk_ratio": 0.25, "update_interval": 4, "overlap_step": True,
                                                   "select_strategy": "step", "select_interval": 24}, **zenflow)}}


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 20), torch.nn.GELU(), torch.nn.Linear(20, 4))


def batches(rank):
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(MICRO):
        xs, ys = torch.randn(2, 4, 16, generator=gen), torch.randn(2, 4, 4, generator=gen)
        out.append((xs[rank].to(torch.bfloat16), ys[rank].to(torch.bfloat16)))
    return out


def train(engine, data):
    losses = []
    for x, y in data:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def main():
    import deepspeed
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    data = batches(rank)
    out = {}
    for overlap in (True, False):
        cfg = config(overlap_step=overlap)
        engine, _, _, _ = deepspeed.initialize(model=model(), config=cfg)
        straight = train(engine, data)
        straight_params = [p.detach().float().reshape(-1).tolist() for p in engine.module.parameters()]
        engine, _, _, _ = deepspeed.initialize(model=model(), config=cfg)
        first = train(engine, data[:SAVE_AT])
        engine.save_checkpoint(sys.argv[2], tag=f"t{overlap}")
        torch.manual_seed(5)  # (other starting values: the checkpoint must bring all of them back)
        engine, _, _, _ = deepspeed.initialize(model=torch.nn.Sequential(
            torch.nn.Linear(16, 20), torch.nn.GELU(), torch.nn.Linear(20, 4)), config=cfg)
        engine.load_checkpoint(sys.argv[2], tag=f"t{overlap}")
        out[f"overlap={overlap}"] = {"straight": straight, "straight_params": straight_params,
                                     "resumed": first + train(engine, data[SAVE_AT:]),
                                     "resumed_params": [p.detach().float().reshape(-1).tolist()
                                                        for p in engine.module.parameters()]}

    refused = {}
    bad = {"auto": config(update_interval="auto"), "topk": config(topk_ratio=1.5),
           "select-short": config(select_interval=2), "warm-up": config(full_warm_up_rounds=-1),
           "not-a-number": config(update_interval=2.5)}
    fp16 = config()
    fp16.pop("bf16")
    fp16["fp16"] = {"enabled": True}
    bad["fp16"] = fp16
    stage3 = config()
    stage3["zero_optimization"]["stage"] = 3
    bad["stage3"] = stage3
    gpu_side = config()
    gpu_side["zero_optimization"]["offload_optimizer"] = {"device": "none"}
    bad["no-offload"] = gpu_side
    for name, cfg in bad.items():
        try:
            deepspeed.initialize(model=model(), config=cfg)
            refused[name] = None
        except ValueError as e:
            refused[name] = str(e)
    try:
        conv = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.Flatten(), torch.nn.Linear(8, 4))
        deepspeed.initialize(model=conv, config=config())
        refused["conv"] = None
    except ValueError as e:
        refused["conv"] = str(e)
    out["refused"] = refused
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
