"""PyTorch's distributed checkpoint (DCP) between plain torch and chorus:

    dcp_roundtrip.py plain-save DIR     (one plain process: AdamW, 3 steps on the global batch, then
                                         dcp.save of {"model", "optimizer"} as torchtitan/FSDP2 code
                                         saves it, into DIR/torch_full, and of model.state_dict() into
                                         DIR/torch_plain; 3 more steps: DIR/plain.json)
    dcp_roundtrip.py chorus-load DIR OUT (chorus, any ranks: each case loads DIR/torch_full and
                                         trains those 3 steps; DIR/torch_plain's weights)
    dcp_roundtrip.py chorus-save DIR    (chorus: each case trains 3 steps, saves with checkpoint.format
                                         "dcp" into DIR/CASE, keeps its module at the save, trains 3 more)
    dcp_roundtrip.py plain-read DIR     (one plain process: dcp_to_torch_save and dcp.load of each chorus
                                         save into a plain model and torch's AdamW, 3 more steps)
Every step trains on the same global batch of 8, split evenly over the ranks; the loss
reported is the global batch's."""
import json
import os
import sys

import torch

CASES = [(2, "fp32"), (3, "fp32"), (2, "bf16"), (0, "fp32")]
LR, WD = 0.02, 0.01


def model_of():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def plain_steps(model, opt, first, n):
    out = []
    for step in range(first, first + n):
        x, y = batch(step)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def engine_of(stage, dtype, world, fmt="chorus"):
    import deepspeed
    cfg = {"train_micro_batch_size_per_gpu": 8 // world, "steps_per_print": 10 ** 6,
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": WD}},
           "zero_optimization": {"stage": stage}, "checkpoint": {"format": fmt}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    engine, _, _, _ = deepspeed.initialize(model=model_of(), config=cfg)
    return engine


def chorus_steps(engine, first, n, dtype):
    import chorus.torch as hvd
    rank, world = hvd.rank(), hvd.size()
    out = []
    for step in range(first, first + n):
        x, y = batch(step)
        share = slice(rank * 8 // world, (rank + 1) * 8 // world)
        loss = torch.nn.functional.cross_entropy(
            engine(x[share].to(torch.bfloat16 if dtype == "bf16" else torch.float32)).float(), y[share])
        engine.backward(loss)
        engine.step()
        out.append(hvd.allreduce(loss.detach().float(), op=hvd.Average, name=f"loss{step}").item())
    return out


def plain_save(folder):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    model = model_of()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    plain_steps(model, opt, 0, 3)
    dcp.save({"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, opt)},
             checkpoint_id=os.path.join(folder, "torch_full"), no_dist=True)
    dcp.save(model.state_dict(), checkpoint_id=os.path.join(folder, "torch_plain"), no_dist=True)
    weights = {k: v.tolist() for k, v in model.state_dict().items()}
    cont = plain_steps(model, opt, 3, 3)
    with open(os.path.join(folder, "plain.json"), "w") as f:
        json.dump({"continued": cont, "weights": weights}, f)


def chorus_load(folder, out):
    import chorus.torch as hvd
    hvd.init()
    want = json.load(open(os.path.join(folder, "plain.json")))
    results = {}
    for stage, dtype in CASES:
        key = f"stage {stage} {dtype}"
        engine = engine_of(stage, dtype, hvd.size())
        engine.load_checkpoint(folder, tag="torch_plain")
        weights = {k: v.float().tolist() for k, v in engine.module_state_dict().items()}
        engine = engine_of(stage, dtype, hvd.size())
        engine.load_checkpoint(folder, tag="torch_full")
        results[key] = {"resumed": chorus_steps(engine, 3, 3, dtype), "optimizer_steps": engine.core.optimizer_steps,
                        "plain_weights_equal": all(
                            torch.equal(torch.tensor(weights[k]).to(torch.bfloat16 if dtype == "bf16" else
                                                                    torch.float32).float(),
                                        torch.tensor(v).to(torch.bfloat16 if dtype == "bf16" else
                                                           torch.float32).float())
                            for k, v in want["weights"].items())}
    if hvd.rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)


def chorus_save(folder):
    import chorus.torch as hvd
    hvd.init()
    results = {}
    for stage, dtype in CASES:
        case = os.path.join(folder, f"z{stage}_{dtype}")
        engine = engine_of(stage, dtype, hvd.size(), fmt="dcp")
        chorus_steps(engine, 0, 3, dtype)
        engine.save_checkpoint(case, tag="t", client_state={"epoch": 4})
        module = {k: v.detach().float().clone() for k, v in engine.module_state_dict().items()}
        if hvd.rank() == 0:
            torch.save(module, os.path.join(case, "module_at_save.pt"))
        cont = chorus_steps(engine, 3, 3, dtype)
        fresh = engine_of(stage, dtype, hvd.size(), fmt="dcp")
        _, client = fresh.load_checkpoint(case)
        results[f"stage {stage} {dtype}"] = {"continued": cont, "resumed": chorus_steps(fresh, 3, 3, dtype),
                                             "client": client.get("epoch"), "global_steps": fresh.global_steps}
    if hvd.rank() == 0:
        with open(os.path.join(folder, "chorus.json"), "w") as f:
            json.dump(results, f)


def plain_read(folder):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    chorus = json.load(open(os.path.join(folder, "chorus.json")))
    results = {}
    for stage, dtype in CASES:
        case = os.path.join(folder, f"z{stage}_{dtype}")
        at_save = torch.load(os.path.join(case, "module_at_save.pt"))
        dcp_to_torch_save(os.path.join(case, "t"), os.path.join(case, "whole.pt"))
        whole = torch.load(os.path.join(case, "whole.pt"))["model"]
        model = model_of()
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
        sd = {"model": model.state_dict(), "optimizer": get_optimizer_state_dict(model, opt)}
        plain_steps(model, opt, 0, 1)  # (the optimizer's state exists to be loaded into)
        sd = {"model": model.state_dict(), "optimizer": get_optimizer_state_dict(model, opt)}
        dcp.load(sd, checkpoint_id=os.path.join(case, "t"), no_dist=True)
        model.load_state_dict(sd["model"])
        set_optimizer_state_dict(model, opt, sd["optimizer"])
        rounded = (lambda t: t.to(torch.bfloat16).float()) if dtype == "bf16" else (lambda t: t)
        results[f"stage {stage} {dtype}"] = {
            "converted_equal": sorted(whole) == sorted(at_save) and all(
                torch.equal(rounded(whole[k].float()), at_save[k]) for k in at_save),
            "loaded_equal": all(torch.equal(rounded(v.float()), at_save[k]) for k, v in model.state_dict().items()),
            "continued": plain_steps(model, opt, 3, 3), "chorus_continued": chorus[f"stage {stage} {dtype}"]["continued"]}
    with open(os.path.join(folder, "plain_read.json"), "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    mode, folder = sys.argv[1], sys.argv[2]
    {"plain-save": lambda: plain_save(folder), "chorus-load": lambda: chorus_load(folder, sys.argv[3]),
     "chorus-save": lambda: chorus_save(folder), "plain-read": lambda: plain_read(folder)}[mode]()
