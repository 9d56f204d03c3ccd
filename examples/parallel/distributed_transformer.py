"""The first seed's DistributedTransformer, made real: a small Transformer cut into
four pipeline stages, one per process group of the seed (embedding 0-1, encoder
2-3, decoder 4-5, output 6-7). The ranks of a group are data-parallel replicas
of their stage (each group aggregates its gradients within itself, as the seed
says), or with --tensor-parallel 2 they split the stage's attention heads and
MLP between them. Each stage's first layer has its gradients reduced first (the
seed's priority=1 on critical gradients). Trained with DeepSpeed's 1F1B schedule on generated sequences
(continue an arithmetic progression of tokens); the loss must fall.

    chorusrun -np 8 python examples/parallel/distributed_transformer.py [--tensor-parallel 2] [--steps 60]
"""
import argparse
import math
import os

# The groups below are given at init; the pipeline adds its own sets at run time too.
os.environ.setdefault("HOROVOD_DYNAMIC_PROCESS_SETS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import chorus.deepspeed as deepspeed  # noqa: E402
import chorus.torch as hvd  # noqa: E402
from chorus.deepspeed.pipe import LayerSpec, PipelineModule, PipeModelDataParallelTopology  # noqa: E402
from chorus.parallel import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, mpu,  # noqa: E402
                             vocab_parallel_cross_entropy)

VOCAB, DIM, HEADS, SEQ = 64, 64, 4, 16


class DistributedTransformer:
    def __init__(self):  # the seed's, but for the import
        # 初始化进程组
        self.embed_group = hvd.ProcessSet([0, 1])
        self.encoder_group = hvd.ProcessSet([2, 3])
        self.decoder_group = hvd.ProcessSet([4, 5])
        self.output_group = hvd.ProcessSet([6, 7])
        hvd.init(process_sets=[
            self.embed_group, self.encoder_group, self.decoder_group, self.output_group
        ])


class Attention(torch.nn.Module):
    """Causal self-attention; with tensor parallelism each rank holds HEADS / n heads."""

    def __init__(self):
        super().__init__()
        n = mpu.get_model_parallel_world_size()
        self.heads = HEADS // n
        self.qkv = ColumnParallelLinear(DIM, 3 * DIM, gather_output=False)
        self.out = RowParallelLinear(DIM, DIM, input_is_parallel=True)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, DIM // HEADS).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(DIM // HEADS)
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, t, self.heads * (DIM // HEADS)))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(DIM), torch.nn.LayerNorm(DIM)
        self.attn = Attention()
        self.up = ColumnParallelLinear(DIM, 4 * DIM, gather_output=False)
        self.down = RowParallelLinear(4 * DIM, DIM, input_is_parallel=True)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Embed(torch.nn.Module):  # the embed group: token and position embeddings
    def __init__(self):
        super().__init__()
        self.tokens = VocabParallelEmbedding(VOCAB, DIM)
        self.positions = torch.nn.Parameter(torch.randn(SEQ, DIM) * 0.02)

    def forward(self, ids):
        return self.tokens(ids) + self.positions[: ids.shape[1]]


class Stack(torch.nn.Module):  # the encoder and decoder groups: two blocks each
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(Block(), Block())

    def forward(self, x):
        return self.blocks(x)


class Output(torch.nn.Module):  # the output group: logits split over the vocabulary
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = ColumnParallelLinear(DIM, VOCAB, bias=False, gather_output=False)

    def forward(self, x):
        return self.head(self.norm(x))


def loss_fn(logits, target):
    return vocab_parallel_cross_entropy(logits, target).mean()


def batches(seed, size):
    """Rows of an arithmetic progression of tokens (start and step drawn); the target is the next token."""
    g = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, VOCAB, (size, 1), generator=g)
        step = torch.randint(1, 4, (size, 1), generator=g)
        seq = (start + step * torch.arange(SEQ + 1)) % VOCAB
        yield seq[:, :-1], seq[:, 1:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tensor-parallel", type=int, default=1, choices=[1, 2])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--micro-batches", type=int, default=4)
    args = ap.parse_args()

    model = DistributedTransformer()
    world = hvd.size()
    if world % 8:
        raise SystemExit("distributed_transformer: run it on a multiple of 8 ranks (chorusrun -np 8)")
    tp = args.tensor_parallel
    topology = PipeModelDataParallelTopology(num_pp=4, num_mp=tp, num_dp=world // (4 * tp))
    mpu.initialize_model_parallel(topology=topology)
    net = PipelineModule(layers=[LayerSpec(Embed), LayerSpec(Stack), LayerSpec(Stack), LayerSpec(Output)],
                         topology=topology, loss_fn=loss_fn, partition_method="uniform", seed_layers=True)
    groups = [model.embed_group, model.encoder_group, model.decoder_group, model.output_group]
    mine = groups[net.stage_id]
    assert mine.included() and hvd.rank() in mine.ranks  # with 8 ranks each stage is one of the seed's groups
    # The seed's "critical gradients first" (priority=1): within each stage, the
    # gradients of the layer the next forward pass runs first are reduced first.
    first = net.forward_funcs[0]
    deepspeed.set_gradient_priority(first.blocks[0] if isinstance(first, Stack) else first, 1)
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": args.micro_batches,
              "optimizer": {"type": "Adam", "params": {"lr": 3e-3}}, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": 1}}
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    replica = engine.grid.index("data")
    data = batches(seed=replica, size=8)
    first = None
    for step in range(args.steps):
        loss = float(engine.train_batch(data))
        first = loss if first is None else first
        if hvd.rank() == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss:.4f}", flush=True)
    if hvd.rank() == 0:
        layout = f"4 stages x {tp} tensor-parallel x {world // (4 * tp)} data-parallel"
        print(f"{layout}: loss {first:.4f} -> {loss:.4f}", flush=True)
    if not loss < 0.5 * first:
        raise SystemExit(f"the loss did not fall enough: {first:.4f} -> {loss:.4f}")


if __name__ == "__main__":
    main()
