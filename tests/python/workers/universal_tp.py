"""Tensor-parallel resharding through a universal checkpoint: a model of chorus.parallel's
layers saved at tensor-parallel size 2 x data-parallel 2 (ZeRO-1), written as a universal
checkpoint (python -m chorus.deepspeed.checkpoint universal: the slices joined along each
layer's partition_dim), loads at other layouts. After loading, the loss on the next batch
equals a plain one-process model's loss from the universal checkpoint's whole weights, and
the next steps' losses equal the saving layout's.

    universal_tp.py save DIR       (tp 2 x dp 2: 4 ranks)
    universal_tp.py load DIR TP    (any ranks, TP dividing them)
Every rank trains on the same batch, so any data-parallel size computes the same step."""
import json
import os
import sys

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
from chorus.parallel import mpu
import chorus.torch as hvd
from tp_model import DIM, HIDDEN, VOCAB, Parallel

TOKENS, LR = 10, 0.01


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.up = torch.nn.Linear(DIM, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids, target):
        h = self.embed(ids)
        h = h + self.down(F.gelu(self.up(h)))
        return F.cross_entropy(self.head(h).float(), target)


def batch(step):
    g = torch.Generator().manual_seed(100 * step)
    return torch.randint(0, VOCAB, (TOKENS,), generator=g), torch.randint(0, VOCAB, (TOKENS,), generator=g)


def engine_of(tp, universal=False):
    mpu.initialize_model_parallel(tensor_model_parallel_size=tp)
    model = Parallel()
    config = {"train_micro_batch_size_per_gpu": TOKENS, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.01}},
              "zero_optimization": {"stage": 1}, "checkpoint": {"load_universal": universal}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config, mpu=mpu)
    return engine


def train(engine, first, n):
    out = []
    for step in range(first, first + n):
        loss = engine(*batch(step))
        engine.backward(loss)
        engine.step()
        out.append(loss.item())
    return out


mode, folder = sys.argv[1], sys.argv[2]
deepspeed.init_distributed()
if mode == "save":
    engine = engine_of(2)
    train(engine, 0, 3)
    engine.save_checkpoint(os.path.join(folder, "ckpt"), tag="t")
    went_on = train(engine, 3, 3)
    if hvd.rank() == 0:
        from chorus.deepspeed.checkpoint.__main__ import to_universal
        to_universal(os.path.join(folder, "ckpt"), os.path.join(folder, "uni"))
        with open(os.path.join(folder, "went_on.json"), "w") as f:
            json.dump(went_on, f)
    hvd.barrier()
else:
    tp = int(sys.argv[3])
    engine = engine_of(tp, universal=True)
    engine.load_checkpoint(os.path.join(folder, "uni"))
    # The plain model from the universal checkpoint's whole weights (read as DeepSpeed would).
    plain = Plain()
    whole = {n: torch.load(os.path.join(folder, "uni", "t", "zero", n, "fp32.pt"))["param"]
             for n, _ in plain.named_parameters()}
    plain.load_state_dict(whole)
    with torch.no_grad():
        ours, theirs = engine(*batch(3)).item(), plain(*batch(3)).item()
    assert abs(ours - theirs) <= 1e-5, (tp, ours, theirs)
    with open(os.path.join(folder, "went_on.json")) as f:
        want = json.load(f)
    got = train(engine, 3, 3)
    worst = max(abs(a - b) for a, b in zip(got, want))
    assert worst <= 1e-5, (tp, got, want)
    print(f"universal tp {tp} x dp {hvd.size() // tp} ok (loss {ours:.6f} = plain {theirs:.6f}; "
          f"3 steps within {worst:.1e})", flush=True)
