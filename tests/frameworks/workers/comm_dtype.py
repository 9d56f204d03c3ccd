"""communication_data_type under every ZeRO stage: an fp32 model whose gradients are
reduced in bf16 or fp16, a bf16 model whose gradients are reduced in fp32, and the
model's own dtype as the baseline; two micro-batches per step, so that the
accumulation meets the rounding. Each case trains the same small model on the same
per-rank batches for STEPS steps and records rank 0's losses, or the error raised.
Runs under whatever `import deepspeed` is (the real DeepSpeed under torchrun, or
chorus.deepspeed under chorusrun); the test compares the two. The comms logger
records the bytes each case's gradient reductions sent (messages over 64 bytes:
not the norm's or the overflow check's), which a smaller communication dtype halves.

    comm_dtype.py OUT.json
"""
import sys

import torch

from optimizer_matrix import model, record  # (the same small model and recording)

STEPS = 12
CASES = [("fp32", None), ("fp32", "bf16"), ("fp32", "fp16"), ("bf16", None), ("bf16", "fp32")]


def config(stage, dtype, comm):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 10 ** 6,
           "optimizer": {"type": "AdamW", "params": {"lr": 5e-3, "weight_decay": 0.01}},
           "zero_optimization": {"stage": stage}, "gradient_clipping": 1.0,
           "comms_logger": {"enabled": True, "prof_all": True}}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if comm is not None:
        cfg["communication_data_type"] = comm
    return cfg


def train(cfg, rank):
    import deepspeed
    engine, _, _, _ = deepspeed.initialize(model=model(), config=cfg)
    dtype = torch.bfloat16 if "bf16" in cfg else torch.float32
    gen = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(STEPS * 2):
        x, y = torch.randn(4, 12, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        loss = torch.nn.functional.cross_entropy(engine(x.to(engine.device, dtype)).float(), y.to(engine.device))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def reduced_bytes(dist):
    """Bytes of the reduction messages logged so far (over 64 bytes each)."""
    summary = dist.log_summary(return_dict=True)["summary"]
    return sum(int(size) * row["count"] for name, sizes in summary.items() if "reduce" in name
               for size, row in sizes.items() if int(size) > 64)


def run(cfg, rank):
    from deepspeed import comm as dist
    before = reduced_bytes(dist)
    losses = train(cfg, rank)
    return {"losses": losses, "reduced_bytes": reduced_bytes(dist) - before}


def main():
    record(sys.argv[1], ((f"stage {stage} {dtype} comm {comm or 'model'}",
                          lambda rank, c=config(stage, dtype, comm): run(c, rank))
                         for stage in (0, 1, 2, 3) for dtype, comm in CASES))


if __name__ == "__main__":
    main()
