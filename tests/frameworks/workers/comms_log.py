"""The communication logger as a DeepSpeed user switches it on (the config's comms_logger):
a ZeRO-2 engine trains STEPS steps, the program makes 5 all_reduce calls of 1024 floats
of its own through deepspeed.comm, then log_summary prints the table on rank 0 and every
rank gets it as a dict, written to OUT on rank 0. Runs under whatever `import deepspeed`
is (the real DeepSpeed or chorus).

    comms_log.py OUT.json
"""
import json
import sys

import torch

import deepspeed
from deepspeed import comm as dist

STEPS = 3


def main():
    deepspeed.init_distributed()
    cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 100,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2},
           "comms_logger": {"enabled": True, "verbose": False, "prof_all": True, "debug": False}}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    for _ in range(STEPS):
        engine.backward(engine(torch.randn(4, 32)).square().mean())
        engine.step()
    for _ in range(5):
        t = torch.ones(1024)
        dist.all_reduce(t)
        assert t[0].item() == dist.get_world_size()
    summary = dist.log_summary(return_dict=True)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"deepspeed": deepspeed.__file__, "summary": summary["summary"],
                       "world_size": summary["metadata"]["world_size"]}, f)


if __name__ == "__main__":
    main()
