"""DeepSpeed's checkpoints resumed, under whatever `import deepspeed` is:

    ds_checkpoint_resume.py save FOLDER     (for each case, train 3 steps, save FOLDER/CASE, train 3
                                             more; then a fresh engine loads the save and trains those
                                             3 steps again; results in FOLDER/saved.json. Under chorus
                                             the save is in DeepSpeed's layout: checkpoint.format)
    ds_checkpoint_resume.py load FOLDER OUT (at any number of ranks: load FOLDER/CASE, train the same
                                             3 steps)
Each step trains on the same global batch of 8 samples, split evenly over the ranks; the
loss reported is the mean over the ranks (so the global batch's). Cases: ZeRO stages 0-3,
fp32 and bf16, AdamW with a WarmupLR schedule; AdamW with the optimizer offloaded, Lion and
Adagrad; the client state {"epoch": 5}."""
import json
import os
import sys

import torch

import deepspeed

# (stage, dtype, optimizer, offload_optimizer[, extra]): extra "frozen" (the first bias not trained,
# which DeepSpeed's own optimizer still holds without ZeRO), "subgroups" (ZeRO-3 sub-groups)
CASES = [(stage, dtype, "AdamW", False) for stage in (0, 1, 2, 3) for dtype in ("fp32", "bf16")]
# (DeepSpeed runs Lion and Adagrad on the CPU through its CPU optimizers, offloaded, only.)
CASES += [(2, "fp32", "AdamW", True), (3, "bf16", "AdamW", True), (2, "fp32", "Lion", True),
          (1, "fp32", "Adagrad", True), (3, "fp32", "Lion", True)]
CASES += [(0, "fp32", "AdamW", False, "frozen"), (2, "bf16", "AdamW", False, "frozen"),
          (3, "fp32", "AdamW", False, "subgroups")]
PARAMS = {"AdamW": {"lr": 0.02, "weight_decay": 0.01}, "Lion": {"lr": 0.003, "weight_decay": 0.01},
          "Adagrad": {"lr": 0.05, "weight_decay": 0.001}}


def folder_of(key):
    return key.replace("stage ", "z").replace(" ", "_")


def chosen():
    """CASES, or those of them the CASES environment variable names (their folders, comma-separated)."""
    only = [c for c in os.environ.get("CASES", "").split(",") if c]
    return [c for c in CASES if not only or folder_of(name_of(*c)) in only]


def name_of(stage, dtype, opt, offload, extra=""):
    return f"stage {stage} {dtype}" + ("" if opt == "AdamW" else f" {opt}") + (" offload" if offload else "") + \
        (f" {extra}" if extra else "")


def config(stage, dtype, world, opt="AdamW", offload=False, extra=""):
    zero = {"stage": stage}
    if extra == "subgroups":
        zero["sub_group_size"] = 40  # (the 6x16 weight's half alone, then the rest)
    if offload:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {"train_micro_batch_size_per_gpu": 8 // world, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 6,
           "optimizer": {"type": opt, "params": PARAMS[opt]},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.02,
                                                        "warmup_num_steps": 10}},
           "zero_optimization": zero, "gradient_clipping": 1.0}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if "chorus" in deepspeed.__file__:  # (CKPT_FORMAT=chorus: chorus's own, for the converter)
        cfg["checkpoint"] = {"format": os.environ.get("CKPT_FORMAT", "deepspeed")}
    if os.environ.get("UNIVERSAL"):  # (load FOLDER/CASE's latest_universal: a universal checkpoint)
        cfg.setdefault("checkpoint", {})["load_universal"] = True
    return cfg


def engine_for(stage, dtype, world, opt, offload, extra=""):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    if extra == "frozen":
        model[0].bias.requires_grad_(False)
    engine, _, _, _ = deepspeed.initialize(model=model, config=config(stage, dtype, world, opt, offload, extra))
    return engine


def steps(engine, first, count, rank, world, dtype):
    out = []
    for step in range(first, first + count):
        g = torch.Generator().manual_seed(100 + step)
        x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
        share = slice(rank * 8 // world, (rank + 1) * 8 // world)
        loss = torch.nn.functional.cross_entropy(
            engine(x[share].to(torch.bfloat16 if dtype == "bf16" else torch.float32)).float(), y[share])
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        deepspeed.comm.all_reduce(mean)
        out.append(mean.item() / world)
    return out


def main():
    mode, folder = sys.argv[1], sys.argv[2]
    deepspeed.init_distributed()
    rank, world = deepspeed.comm.get_rank(), deepspeed.comm.get_world_size()
    results = {}
    for stage, dtype, opt, offload, *extra in chosen():
        key = name_of(stage, dtype, opt, offload, *extra)
        where = f"{folder}/{folder_of(key)}"
        if mode == "save":
            engine = engine_for(stage, dtype, world, opt, offload, *extra)
            steps(engine, 0, 3, rank, world, dtype)
            engine.save_checkpoint(where, client_state={"epoch": 5})
            if "chorus" in deepspeed.__file__:  # the module at the save, for zero_to_fp32's output
                module = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
                if rank == 0:
                    torch.save(module, f"{where}/module_at_save.pt")
            cont = steps(engine, 3, 3, rank, world, dtype)
            fresh = engine_for(stage, dtype, world, opt, offload, *extra)
            _, client = fresh.load_checkpoint(where)
            results[key] = {"continued": cont, "resumed": steps(fresh, 3, 3, rank, world, dtype),
                            "client": client.get("epoch")}
        else:
            try:
                fresh = engine_for(stage, dtype, world, opt, offload, *extra)
                _, client = fresh.load_checkpoint(where)
                results[key] = {"resumed": steps(fresh, 3, 3, rank, world, dtype), "client": client.get("epoch"),
                                "global_steps": fresh.global_steps}
            except Exception as e:  # recorded: the test says which cases must load
                results[key] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
        deepspeed.comm.barrier()
    if rank == 0:
        with open(sys.argv[3] if mode == "load" else f"{folder}/saved.json", "w") as f:
            json.dump({"deepspeed": deepspeed.__file__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
