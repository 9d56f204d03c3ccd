"""A small causal Transformer whose feed-forward layers are mixtures of experts,
trained on 4 ranks as expert-parallel 2 x data-parallel 2 under ZeRO-2: each MoE
layer's 4 experts are split over the expert-parallel sets {0,1} and {2,3}; the
ranks holding the same experts ({0,2} and {1,3}) reduce those experts' gradients
and partition their optimizer states; the other weights are reduced over all 4.
Tokens travel to their experts and back with alltoall over the expert-parallel
set. The task: continue arithmetic progressions of tokens; the loss must fall.

    PYTHONPATH=build/python ./build/chorusrun -np 4 /usr/bin/python3 examples/deepspeed/moe_transformer.py

CHORUS_TIMELINE=moe.%r.json writes each rank's timeline (every set it is in, the
MoE alltoalls among them: moe.<layer>.ep_size_2.dispatch / .combine)."""
import argparse
import math

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
from chorus.deepspeed.moe.layer import MoE
from chorus.deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

VOCAB, DIM, HEADS, SEQ = 32, 32, 4, 16


class Block(torch.nn.Module):
    def __init__(self, args):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        expert = torch.nn.Sequential(torch.nn.Linear(DIM, 2 * DIM), torch.nn.GELU(), torch.nn.Linear(2 * DIM, DIM))
        self.moe = MoE(DIM, expert, num_experts=args.experts, ep_size=args.ep, k=args.top_k, min_capacity=4,
                       capacity_factor=1.25)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(DIM // HEADS)
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, DIM))
        h, l_aux, _ = self.moe(self.norm2(x))
        return x + h, l_aux


class MoETransformer(torch.nn.Module):
    def __init__(self, args):
        super().__init__()
        self.embed, self.pos = torch.nn.Embedding(VOCAB, DIM), torch.nn.Embedding(SEQ, DIM)
        self.blocks = torch.nn.ModuleList([Block(args) for _ in range(args.layers)])
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens, targets):
        x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
        aux = 0.0
        for block in self.blocks:
            x, l_aux = block(x)
            aux = aux + l_aux
        return F.cross_entropy(self.head(x).reshape(-1, VOCAB), targets.reshape(-1)) + 0.01 * aux


def progressions(batch, generator):
    start = torch.randint(0, VOCAB, (batch, 1), generator=generator)
    step = torch.randint(1, 4, (batch, 1), generator=generator)
    seq = (start + step * torch.arange(SEQ + 1)) % VOCAB
    return seq[:, :-1], seq[:, 1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--ep", type=int, default=2)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--zero", type=int, default=2)
    args = p.parse_args()
    deepspeed.init_distributed(dist_init_required=False)
    rank = deepspeed.comm.get_rank()
    torch.manual_seed(0)  # the same shared weights everywhere (each expert copy starts alike, as DeepSpeed's)
    model = MoETransformer(args)
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
              "zero_optimization": {"stage": args.zero}}
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters())})
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
    data = torch.Generator().manual_seed(1 + rank)
    first = None
    for step in range(args.steps):
        tokens, targets = progressions(8, data)
        loss = engine(tokens.to(engine.device), targets.to(engine.device))
        engine.backward(loss)
        engine.step()
        first = first if first is not None else float(loss)
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step} loss {float(loss):.4f}", flush=True)
    if rank == 0:
        print(f"moe transformer: loss {first:.3f} -> {float(loss):.3f} (ep {args.ep} x dp "
              f"{deepspeed.comm.get_world_size() // args.ep}, ZeRO-{args.zero}, on {engine.device.type})", flush=True)


if __name__ == "__main__":
    main()
