"""A DeepSpeed training script as the autotuner runs it: the config from --deepspeed_config,
a batch of the config's micro-batch size per step, 8 steps. A micro-batch larger than
--fits does not fit (it raises as an out-of-memory error would), so the experiments above
it fail. At the end it prints the micro-batch size and ZeRO stage it trained with."""
import argparse

import torch

import chorus.deepspeed as deepspeed

parser = argparse.ArgumentParser()
parser.add_argument("--fits", type=int, default=12)
parser.add_argument("--local_rank", type=int, default=-1)
deepspeed.add_config_arguments(parser)
args = parser.parse_args()
deepspeed.init_distributed()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
engine, _, _, _ = deepspeed.initialize(model=model, config=args.deepspeed_config)
mbs = engine.train_micro_batch_size_per_gpu()
for step in range(8):
    x, y = torch.randn(mbs, 32), torch.randint(0, 4, (mbs,))
    if mbs > args.fits:
        raise RuntimeError(f"out of memory: micro-batch {mbs} > {args.fits}")
    loss = torch.nn.functional.cross_entropy(engine(x), y)
    engine.backward(loss)
    engine.step()
print(f"trained mbs={mbs} stage={engine.zero_optimization_stage()} rank={deepspeed.comm.get_rank()}", flush=True)
