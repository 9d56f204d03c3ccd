"""Muon with per_head_muon on an attention block whose config gives its head counts
(4 query heads, 2 key/value heads of width 6): q_proj, k_proj and v_proj are
orthogonalized head by head, o_proj and the MLP whole. ZeRO stages 0-2, fp32 and bf16,
and the same config without per_head_muon; 2 ranks, STEPS steps, rank 0's losses. Then a
model with nothing to split into heads, which per_head_muon must refuse.
Runs under whatever `import deepspeed` is; the test compares DeepSpeed 0.19.8 and chorus.

    muon_heads.py OUT.json
"""
import json
import sys
import types

import torch

STEPS = 12


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(24, 24, bias=False)
        self.k_proj = torch.nn.Linear(24, 12, bias=False)
        self.v_proj = torch.nn.Linear(24, 12, bias=False)
        self.o_proj = torch.nn.Linear(24, 24, bias=False)

    def forward(self, x):  # [batch, seq, 24]
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, 4, 6).transpose(1, 2)
        k = self.k_proj(x).view(b, s, 2, 6).transpose(1, 2).repeat_interleave(2, dim=1)
        v = self.v_proj(x).view(b, s, 2, 6).transpose(1, 2).repeat_interleave(2, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / 6 ** 0.5, dim=-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(b, s, 24))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.config = types.SimpleNamespace(num_attention_heads=4, num_key_value_heads=2, hidden_size=24)
        self.self_attn = Attention()
        self.mlp = torch.nn.Linear(24, 24)
        self.head = torch.nn.Linear(24, 3)

    def forward(self, x):
        h = x + self.self_attn(x)
        h = h + torch.tanh(self.mlp(h))
        return self.head(h.mean(1))


def config(stage, dtype, per_head):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 6,
           "optimizer": {"type": "Muon", "params": {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.01,
                                                    "adam_lr": 3e-3, "per_head_muon": per_head}},
           "zero_optimization": {"stage": stage}, "gradient_clipping": 1.0}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def train(cfg, rank):
    import deepspeed
    engine, _, _, _ = deepspeed.initialize(model=Model(), config=cfg)
    dtype = torch.bfloat16 if "bf16" in cfg else torch.float32
    gen = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(4, 5, 24, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        loss = torch.nn.functional.cross_entropy(engine(x.to(dtype)).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def main():
    import deepspeed
    deepspeed.init_distributed()
    rank = torch.distributed.get_rank()
    results = {}
    for stage in (0, 1, 2):
        for dtype in ("fp32", "bf16"):
            for per_head in ((True, False) if stage < 2 and dtype == "fp32" else (True,)):
                key = f"stage {stage} {dtype} per_head={per_head}"
                try:
                    results[key] = {"losses": train(config(stage, dtype, per_head), rank)}
                except Exception as e:  # noqa: BLE001 - recorded, judged by the test
                    results[key] = {"error": f"{type(e).__name__}: {e}"}
    try:  # nothing named or shaped as attention: per_head_muon would change nothing
        deepspeed.initialize(model=torch.nn.Sequential(torch.nn.Linear(24, 24), torch.nn.Linear(24, 3)),
                             config=config(1, "fp32", True))
        results["untaggable"] = {"error": None}
    except ValueError as e:
        results["untaggable"] = {"error": str(e)}
    if rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"deepspeed": deepspeed.__file__, "results": results}, f)


if __name__ == "__main__":
    main()
