"""Muon over a model with MoE layers (ep 2, 4 ranks, ZeRO-2) resumes from a checkpoint
onto the same training: 6 steps straight against 3, save, a new engine, load, 3 more;
the shared and the experts' momentum both come back (a run that loses either differs).
Prints 'moe muon resume ok rank R'."""
import sys

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from chorus.deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
from moe_common import Net, batch

STEPS, SAVE_AT = 6, 3


def engine():
    deepspeed.init_distributed()
    model = Net(2, 2, True, hvd.rank() // 2)
    for p in model.parameters():
        p.use_muon = p.dim() >= 2
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()), "name": "all"})
    cfg = {"train_micro_batch_size_per_gpu": 8, "steps_per_print": 10 ** 6, "zero_optimization": {"stage": 2},
           "optimizer": {"type": "Muon", "params": {"lr": 0.02, "momentum": 0.9, "adam_lr": 1e-2}}}
    eng, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=cfg)
    return eng


def train(eng, steps):
    losses = []
    for step in steps:
        loss = eng(*batch(step, hvd.rank()))
        eng.backward(loss)
        eng.step()
        losses.append(loss.item())
    return losses


def main():
    straight = train(engine(), range(STEPS))
    first = engine()
    head = train(first, range(SAVE_AT))
    first.save_checkpoint(sys.argv[1], tag="t")
    again = engine()
    again.load_checkpoint(sys.argv[1], tag="t")
    resumed = head + train(again, range(SAVE_AT, STEPS))
    assert resumed == straight, (resumed, straight)
    assert len({round(v, 6) for v in straight}) > 1
    print(f"moe muon resume ok rank {hvd.rank()}", flush=True)


if __name__ == "__main__":
    main()
