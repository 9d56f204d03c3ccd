"""A pipeline whose first layer is frozen (a layer holding no trained parameter, at a stage's
edge), saved in DeepSpeed's layout (ZeRO-1, pp 2 x dp 2) and loaded at other stage counts: the
frozen layer's weights come back from its layer file (zeroed before the load, so a layer left
out keeps zeros), and the next step's loss equals the saving run's.

    ds_layout_pipe_frozen.py save DIR     (4 ranks)
    ds_layout_pipe_frozen.py load DIR PP  (any ranks, PP dividing them)"""
import json
import os
import sys

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.pipe import PipelineModule

D = 8


def engine_of(pp):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(D, D), torch.nn.Tanh(), torch.nn.Linear(D, D), torch.nn.Tanh(), torch.nn.Linear(D, D),
              torch.nn.Tanh(), torch.nn.Linear(D, 3)]
    layers[0].requires_grad_(False)
    module = PipelineModule(layers=layers, num_stages=pp, partition_method="uniform",
                            loss_fn=torch.nn.CrossEntropyLoss())
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 1},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "checkpoint": {"format": "deepspeed"}}
    engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=[p for p in module.parameters()
                                                                           if p.requires_grad], config=cfg)
    return engine


def batches(step):
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(8, D, generator=g), torch.randint(0, 3, (8,), generator=g)
    return iter([(x[:4], y[:4]), (x[4:], y[4:])])


mode, folder = sys.argv[1], sys.argv[2]
deepspeed.init_distributed()
if mode == "save":
    engine = engine_of(2)
    for step in range(2):
        engine.train_batch(batches(step))
    engine.save_checkpoint(folder, tag="t")
    loss = float(engine.train_batch(batches(2)))
    if hvd.rank() == 0:
        with open(os.path.join(folder, "next.json"), "w") as f:
            json.dump(loss, f)
    hvd.barrier()
else:
    pp = int(sys.argv[3])
    engine = engine_of(pp)
    frozen = [p for p in engine.module.parameters() if not p.requires_grad]
    saved = torch.load(os.path.join(folder, "t", "layer_00-model_states.pt"))
    with torch.no_grad():
        for p in frozen:
            p.zero_()
    engine.load_checkpoint(folder, tag="t")
    if engine.stage_id == 0:
        assert frozen and torch.equal(frozen[0], saved["weight"]) and torch.equal(frozen[1], saved["bias"]), pp
    with open(os.path.join(folder, "next.json")) as f:
        want = json.load(f)
    got = float(engine.train_batch(batches(2)))
    assert abs(got - want) <= 1e-6, (pp, got, want)
    print(f"frozen layer pp {pp} ok ({got:.6f} = {want:.6f})", flush=True)
