"""Checkpoints of tensor- and pipeline-parallel engines in DeepSpeed's layout, under whatever
`import deepspeed` is (the real DeepSpeed 0.19.8, or chorus through the venv's alias):

    ds_parallel_checkpoint.py tp|pipe|moe save FOLDER          (each case: 3 steps, save FOLDER/CASE, 3 more;
                                                           results in FOLDER/saved.json)
    ds_parallel_checkpoint.py tp|pipe|moe load FOLDER OUT SIZE (load FOLDER/CASE at tensor-parallel,
                                                           pipeline or expert-parallel size SIZE, the
                                                           rest data-parallel; the same 3 steps)
tp: a Megatron-style MLP (a replicated LayerNorm, a column- then a row-parallel linear) over an
mpu, the same whole weights sliced at any size. pipe: a 7-layer PipelineModule cut into SIZE
stages. moe: a MoE layer of 4 experts at ep SIZE (top-2). Each step trains on the same global batch of 8 samples; the loss reported is the
global batch's. Under chorus the save is in DeepSpeed's layout (checkpoint.format)."""
import json
import os
import sys

import torch
import torch.distributed as dist

import deepspeed

CHORUS = "chorus" in deepspeed.__file__
CASES = {"tp": [(0, "fp32"), (1, "bf16"), (3, "bf16")],  # (ZeRO-2's files are laid out as ZeRO-1's)
         "pipe": [(0, "fp32"), (1, "fp32"), (1, "bf16")],
         "moe": [(0, "fp32"), (1, "fp32"), (2, "bf16")]}
D, H, OUT = 8, 16, 4


class TorchMPU:
    """The mpu a Megatron user hands DeepSpeed: tensor-parallel groups of neighbouring ranks."""

    def __init__(self, tp):
        rank, world = dist.get_rank(), dist.get_world_size()
        self.tp = tp
        for start in range(0, world, tp):
            g = dist.new_group(list(range(start, start + tp)))
            if start <= rank < start + tp:
                self.tp_group = g
        for first in range(tp):
            g = dist.new_group(list(range(first, world, tp)))
            if rank % tp == first:
                self.dp_group = g

    def get_model_parallel_rank(self):
        return dist.get_rank() % self.tp

    def get_model_parallel_world_size(self):
        return self.tp

    def get_model_parallel_group(self):
        return self.tp_group

    def get_data_parallel_rank(self):
        return dist.get_rank() // self.tp

    def get_data_parallel_world_size(self):
        return dist.get_world_size() // self.tp

    def get_data_parallel_group(self):
        return self.dp_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group


def make_mpu(tp):
    if CHORUS:
        from chorus.parallel import mpu
        mpu.initialize_model_parallel(tp)
        return mpu
    return TorchMPU(tp)


def tp_sum(x, mpu):
    if mpu.get_model_parallel_world_size() == 1:
        return x
    if CHORUS:
        import chorus.torch as hvd
        return hvd.allreduce(x, op=hvd.Sum, process_set=mpu.get_model_parallel_group())
    x = x.clone()
    dist.all_reduce(x, group=mpu.get_model_parallel_group())
    return x


class Copy(torch.autograd.Function):  # forward as it is, gradients summed over the slices
    @staticmethod
    def forward(ctx, x, mpu):
        ctx.mpu = mpu
        return x

    @staticmethod
    def backward(ctx, g):
        return tp_sum(g, ctx.mpu), None


class Reduce(torch.autograd.Function):  # partial sums summed over the slices
    @staticmethod
    def forward(ctx, x, mpu):
        return tp_sum(x, mpu)

    @staticmethod
    def backward(ctx, g):
        return g, None


def sliced(full, dim, mpu):
    n, r = mpu.get_model_parallel_world_size(), mpu.get_model_parallel_rank()
    p = torch.nn.Parameter(full.detach().chunk(n, dim=dim)[r].clone())
    p.model_parallel = p.tensor_model_parallel = True
    p.partition_dim = dim
    return p


class TPNet(torch.nn.Module):
    def __init__(self, mpu):
        super().__init__()
        torch.manual_seed(0)
        self.mpu = mpu
        self.norm = torch.nn.LayerNorm(D)
        with torch.no_grad():  # (a LayerNorm that is not the identity at the start)
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.2, 0.2)
        up, down = torch.nn.Linear(D, H), torch.nn.Linear(H, OUT)
        self.up_w, self.up_b = sliced(up.weight, 0, mpu), sliced(up.bias, 0, mpu)
        self.down_w, self.down_b = sliced(down.weight, 1, mpu), torch.nn.Parameter(down.bias.detach().clone())

    def forward(self, x):
        h = torch.tanh(torch.nn.functional.linear(Copy.apply(self.norm(x), self.mpu), self.up_w, self.up_b))
        return Reduce.apply(torch.nn.functional.linear(h, self.down_w), self.mpu) + self.down_b


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, D, generator=g), torch.randint(0, OUT, (8,), generator=g)


def config(stage, dtype, micro, gas=1):
    cfg = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": gas, "steps_per_print": 10 ** 6,
           "optimizer": {"type": "AdamW", "params": {"lr": 0.02, "weight_decay": 0.01}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.02,
                                                        "warmup_num_steps": 10}},
           "zero_optimization": {"stage": stage}, "gradient_clipping": 1.0}
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    if CHORUS:
        cfg["checkpoint"] = {"format": "deepspeed"}
    if os.environ.get("UNIVERSAL"):  # (load FOLDER/CASE's latest_universal: ds_to_universal's output)
        cfg.setdefault("checkpoint", {})["load_universal"] = True
    return cfg


# What a Megatron-DeepSpeed model tells DeepSpeed's ds_to_universal of its parameters (the slices'
# dimension: 0 by default, 1 for a row-parallel weight; replicated ones are averaged over the slices).
UNIVERSAL_INFO = {"universal_checkpoint_version": 0.2, "tp_replicated_parameter_patterns": [r"^norm\.", r"^down_b$"],
                  "parameter_with_row_parallelism_patterns": [r"^down_w$"]}


def tp_engine(stage, dtype, size):
    mpu = make_mpu(size)
    dp = dist.get_world_size() // size
    model = TPNet(mpu)
    model.universal_checkpoint_info = UNIVERSAL_INFO
    engine, _, _, _ = deepspeed.initialize(model=model, config=config(stage, dtype, 8 // dp), mpu=mpu)
    return engine


def tp_steps(engine, first, count, dtype):
    dp = dist.get_world_size() // engine.module.mpu.get_model_parallel_world_size()
    r = engine.module.mpu.get_data_parallel_rank()
    out = []
    for step in range(first, first + count):
        x, y = batch(step)
        share = slice(r * 8 // dp, (r + 1) * 8 // dp)
        loss = torch.nn.functional.cross_entropy(
            engine(x[share].to(torch.bfloat16 if dtype == "bf16" else torch.float32)).float(), y[share])
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # (every slice of every replica: the global batch's mean, counted tp times)
        out.append(mean.item() / dist.get_world_size())
    return out


def fp32_loss(out, y):  # (the loss in fp32 under bf16 too: what the test compares)
    return torch.nn.functional.cross_entropy(out.float(), y)


def pipe_engine(stage, dtype, size):
    from deepspeed.pipe import PipelineModule
    torch.manual_seed(0)
    layers = [torch.nn.Linear(D, H), torch.nn.Tanh(), torch.nn.Linear(H, H), torch.nn.Tanh(), torch.nn.Linear(H, H),
              torch.nn.Tanh(), torch.nn.Linear(H, OUT)]
    module = PipelineModule(layers=layers, num_stages=size, partition_method="parameters", loss_fn=fp32_loss)
    module.universal_checkpoint_info = {"universal_checkpoint_version": 0.2}  # (ds_to_universal needs it)
    dp = dist.get_world_size() // size
    engine, _, _, _ = deepspeed.initialize(model=module, model_parameters=module.parameters(),
                                           config=config(stage, dtype, 2, 4 // dp))
    return engine


def pipe_steps(engine, first, count, dtype):
    dp = dist.get_world_size() // engine.num_stages
    r = dist.get_rank() % dp  # (PipeDataParallelTopology: rank = stage x dp + data)
    out = []
    for step in range(first, first + count):
        x, y = batch(step)
        x = x.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
        share = 8 // dp
        mine = [(x[i:i + 2], y[i:i + 2]) for i in range(r * share, (r + 1) * share, 2)]
        loss = engine.train_batch(iter(mine))
        mean = loss.detach().float().clone().reshape(())
        dist.all_reduce(mean)  # (every stage holds its replica's loss)
        out.append(mean.item() / dist.get_world_size())
    return out


class MoENet(torch.nn.Module):
    def __init__(self, ep):
        super().__init__()
        from deepspeed.moe.layer import MoE
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(D, D)
        expert = torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.GELU(), torch.nn.Linear(H, D))
        self.moe = MoE(D, expert, num_experts=4, ep_size=ep, k=2, min_capacity=4, top2_2nd_expert_sampling=False)
        self.out = torch.nn.Linear(D, OUT)

    def forward(self, x):
        h, l_aux, _ = self.moe(torch.tanh(self.inp(x)))
        return self.out(h), l_aux


def moe_engine(stage, dtype, size):
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
    model = MoENet(size)
    params = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()),
                                                                   "name": "all"})
    cfg = config(stage, dtype, 16 // dist.get_world_size())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=cfg)
    return engine


def moe_steps(engine, first, count, dtype):
    world, r = dist.get_world_size(), dist.get_rank()
    out = []
    for step in range(first, first + count):
        g = torch.Generator().manual_seed(100 + step)
        x, y = torch.randn(16, D, generator=g), torch.randint(0, OUT, (16,), generator=g)
        share = slice(r * 16 // world, (r + 1) * 16 // world)
        logits, l_aux = engine(x[share].to(torch.bfloat16 if dtype == "bf16" else torch.float32))
        loss = torch.nn.functional.cross_entropy(logits.float(), y[share]) + 0.01 * l_aux.float()
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        out.append(mean.item() / world)
    return out


def main():
    kind, mode, folder = sys.argv[1], sys.argv[2], sys.argv[3]
    deepspeed.init_distributed(dist_backend="gloo")
    size = int(sys.argv[5]) if mode == "load" else 2
    make, steps = {"tp": (tp_engine, tp_steps), "pipe": (pipe_engine, pipe_steps), "moe": (moe_engine, moe_steps)}[kind]
    only = [c for c in os.environ.get("CASES", "").split(",") if c]
    results = {}
    for stage, dtype in CASES[kind]:
        key = f"z{stage}_{dtype}"
        if only and key not in only:
            continue
        where = f"{folder}/{key}"
        if mode == "save":
            engine = make(stage, dtype, size)
            steps(engine, 0, 3, dtype)
            engine.save_checkpoint(where, client_state={"epoch": 5})
            cont = steps(engine, 3, 3, dtype)
            fresh = make(stage, dtype, size)
            _, client = fresh.load_checkpoint(where)
            results[key] = {"continued": cont, "resumed": steps(fresh, 3, 3, dtype), "client": client.get("epoch")}
        else:
            try:
                fresh = make(stage, dtype, size)
                _, client = fresh.load_checkpoint(where)
                results[key] = {"resumed": steps(fresh, 3, 3, dtype), "client": client.get("epoch"),
                                "global_steps": fresh.global_steps}
            except Exception as e:  # recorded: the test says which cases must load
                results[key] = {"error": f"{type(e).__name__}: {str(e)[:600]}"}
                print(f"rank {dist.get_rank()}: {key}: {results[key]['error']}", file=sys.stderr)
        dist.barrier()
    if dist.get_rank() == 0:
        with open(sys.argv[4] if mode == "load" else f"{folder}/saved.json", "w") as f:
            json.dump({"deepspeed": deepspeed.__file__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
