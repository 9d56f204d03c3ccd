"""ZenFlow (zero_optimization.zenflow) cases on a bias-free bf16 model, ZeRO-2 with the
optimizer on the CPU: the overlapped step, the sequential one, warm-up rounds with a
reselection every 4 micro-steps, the selective state on the CPU. Each case trains
MICRO micro-steps and records rank 0's losses and the parameters' sums after each.
Runs under whatever `import deepspeed` is; the test compares the real DeepSpeed 0.19.8
(under torchrun) with chorus.deepspeed (under chorusrun).

DeepSpeed 0.19.8's ZeRO-1/2 views ZenFlow's flat buffer, which holds each matrix
transposed, without transposing it back (`_update_model_bit16_weights`), so every
matrix of the model is scrambled at initialize (its main at 0.19.6 unflattens it);
the reference run puts that one function back as main has it. Its column selection
also skips vector parameters when it counts offsets in the gradient bucket, so it
selects from the wrong slice wherever a bias precedes a matrix: the model has none.
With zenflow.offload its boundary step restores the selected columns into a copy (an
indexed view), so they keep the CPU step's values: chorus's offload moves the state
only, and is held to DeepSpeed's run without it ("interval-3").

    zenflow.py OUT.json CASE...
"""
import json
import sys

import torch

MICRO = 12
CASES = {
    "overlap": {"update_interval": 4, "overlap_step": True},
    "sequential": {"update_interval": 4, "overlap_step": False},
    "warm-select": {"update_interval": 2, "overlap_step": True, "full_warm_up_rounds": 1,
                    "select_strategy": "step", "select_interval": 4},
    "interval-3": {"update_interval": 3, "overlap_step": True},
    "offload": {"update_interval": 3, "overlap_step": True, "offload": True},
}


def unscramble(deepspeed):
    if "chorus" in deepspeed.__file__:
        return
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    def update(self, gi):  # (DeepSpeed main's: through the optimizer's unflatten)
        views = self.unflatten(self.bit16_groups_flat[gi], self.round_robin_bit16_meta[gi])
        for p, q in zip(self.round_robin_bit16_groups[gi], views):
            p.data = q.data
        for pi, param in enumerate(self.bit16_groups[gi]):
            param.data = self.round_robin_bit16_groups[gi][self.round_robin_bit16_indices[gi][pi]].data

    DeepSpeedZeroOptimizer._update_model_bit16_weights = update


def model():
    torch.manual_seed(0)
    # Linear(20, 24)'s 480 elements straddle the 2-rank partition boundary mid-column.
    return torch.nn.Sequential(torch.nn.Linear(16, 20, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(20, 24, bias=False), torch.nn.GELU(),
                               torch.nn.Linear(24, 4, bias=False))


def config(zenflow, ranks):
    return {"train_batch_size": 4 * ranks, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10 ** 6,
            "bf16": {"enabled": True}, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8,
                                                      "weight_decay": 0.01}},
            "zero_optimization": {"stage": 2, "overlap_comm": True, "offload_optimizer": {"device": "cpu"},
                                  "zenflow": dict(zenflow, topk_ratio=0.2)}}


def train(case, rank, ranks):
    import deepspeed
    engine, _, _, _ = deepspeed.initialize(model=model(), config=config(CASES[case], ranks))
    gen = torch.Generator().manual_seed(1)
    out = {"losses": [], "sums": []}
    for _ in range(MICRO):
        xs, ys = torch.randn(ranks, 4, 16, generator=gen), torch.randn(ranks, 4, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(xs[rank].to(torch.bfloat16)), ys[rank].to(torch.bfloat16))
        engine.backward(loss)
        engine.step()
        out["losses"].append(loss.item())
        out["sums"].append([float(p.detach().double().sum()) for p in engine.module.parameters()])
    return out


def main():
    import deepspeed
    unscramble(deepspeed)
    deepspeed.init_distributed()
    rank, ranks = torch.distributed.get_rank(), torch.distributed.get_world_size()
    results = {}
    for case in sys.argv[2:]:
        try:
            results[case] = train(case, rank, ranks)
        except Exception as e:  # noqa: BLE001 - recorded, judged by the test
            results[case] = {"error": f"{type(e).__name__}: {e}"}
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"deepspeed": deepspeed.__file__, "results": results}, f)


if __name__ == "__main__":  # (DeepSpeed's overlapped step spawns its optimizer process)
    main()
