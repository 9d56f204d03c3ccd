"""Ulysses sequence parallelism: a causal Transformer trained on 4 ranks as
sequence-parallel 2 x data-parallel 2 under ZeRO-2. Each rank holds half of each
sequence; DistributedAttention turns q, k and v into the whole sequence for half
of the heads with an alltoall over the sequence-parallel set ({0,1} or {2,3}),
attends, and turns the result back. The gradients are reduced, and ZeRO
partitions, over all 4 ranks (the sequence- and data-parallel ranks together).
The task: continue arithmetic progressions of tokens; the loss must fall.

    PYTHONPATH=build/python ./build/chorusrun -np 4 /usr/bin/python3 examples/deepspeed/ulysses_transformer.py

CHORUS_TIMELINE=ulysses.%r.json writes each rank's timeline (ulysses.<n>.q/.k/.v/.out
are the layer's alltoalls)."""
import argparse
import math

import torch
import torch.nn.functional as F

import chorus.deepspeed as deepspeed
from chorus.deepspeed.sequence.layer import DistributedAttention
from chorus.deepspeed.utils import groups

VOCAB, DIM, HEADS, SEQ = 32, 32, 4, 32


def causal_attention(q, k, v):
    """[s, b, h, d] with the whole sequence: softmax attention, each position on those before it."""
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    n = att.shape[-1]
    att = att.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf")).softmax(-1)
    return (att @ v).permute(2, 0, 1, 3)


class Layer(torch.nn.Module):
    def __init__(self, sp_group):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.qkv, self.proj = torch.nn.Linear(DIM, 3 * DIM), torch.nn.Linear(DIM, DIM)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))
        self.attn = DistributedAttention(causal_attention, sp_group)  # scatter heads (2), gather sequence (0)

    def forward(self, x):  # x: [this rank's s, b, DIM]
        s, b, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(s, b, 3, HEADS, DIM // HEADS).unbind(2)
        x = x + self.proj(self.attn(q, k, v).reshape(s, b, DIM))
        return x + self.mlp(self.norm2(x))


class Model(torch.nn.Module):
    def __init__(self, layers, sp_group):
        super().__init__()
        self.embed, self.pos = torch.nn.Embedding(VOCAB, DIM), torch.nn.Embedding(SEQ, DIM)
        self.layers = torch.nn.ModuleList([Layer(sp_group) for _ in range(layers)])
        self.head = torch.nn.Linear(DIM, VOCAB)

    def forward(self, tokens, targets, first_position):  # tokens [s, b]: this rank's slice
        positions = first_position + torch.arange(tokens.shape[0])
        x = self.embed(tokens) + self.pos(positions).unsqueeze(1)
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(x).reshape(-1, VOCAB), targets.reshape(-1))


def progressions(batch, generator):
    start = torch.randint(0, VOCAB, (1, batch), generator=generator)
    step = torch.randint(1, 4, (1, batch), generator=generator)
    seq = (start + step * torch.arange(SEQ + 1).unsqueeze(1)) % VOCAB  # [SEQ + 1, batch]
    return seq[:-1], seq[1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--sp", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--zero", type=int, default=2)
    args = p.parse_args()
    deepspeed.init_distributed(dist_init_required=False)
    dp = deepspeed.comm.get_world_size() // args.sp
    mesh = deepspeed.comm.initialize_mesh_device((dp, args.sp), ("data_parallel", "sequence_parallel"))
    sp_rank, dp_rank = groups._get_sequence_parallel_rank(), groups._get_data_parallel_rank()
    torch.manual_seed(0)
    model = Model(args.layers, mesh.get_group(mesh_dim="sequence_parallel"))
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 1.0,
              "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
              "zero_optimization": {"stage": args.zero}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config,
                                           mesh_param=(dp, args.sp))
    data = torch.Generator().manual_seed(1 + dp_rank)  # the ranks of a sequence-parallel set share sequences
    local = SEQ // args.sp
    mine = slice(sp_rank * local, (sp_rank + 1) * local)
    first = None
    for step in range(args.steps):
        tokens, targets = progressions(8, data)
        loss = engine(tokens[mine].to(engine.device), targets[mine].to(engine.device), sp_rank * local)
        engine.backward(loss)
        engine.step()
        first = first if first is not None else float(loss)
        if deepspeed.comm.get_rank() == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step} loss {float(loss):.4f}", flush=True)
    if deepspeed.comm.get_rank() == 0:
        print(f"ulysses transformer: loss {first:.3f} -> {float(loss):.3f} (sp {args.sp} x dp "
              f"{groups._get_data_parallel_world_size()}, ZeRO-{args.zero}, on {engine.device.type})", flush=True)


if __name__ == "__main__":
    main()
