"""elastic_train.py's loop on a ZeRO-2 (ZERO_STAGE) DeepSpeed engine (SGD, float32): commits are
checkpoints in argv[2]; after a reset the engine is re-partitioned and loads the
last one. Rank 0 writes the committed schedule of world sizes and the final
parameters to argv[1]. FAULT=kill:WORKER:STEP as in elastic_train.py."""
import os
import sys

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd
from elastic_common import ME, data, finish_step, maybe_fault, write_result

STEPS = int(os.environ.get("STEPS", "16"))


torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
# (no clipping: the test's float64 reference does not clip; DeepSpeed 0.19.8 would clip at 1.0)
config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
          "zero_optimization": {"stage": int(os.environ.get("ZERO_STAGE", "2"))}}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                       config=config)


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print(f"resuming from commit {state.step} with {hvd.size()} ranks", flush=True)
    while state.step < STEPS:
        x, y = data(state.step, hvd.rank(), torch.float32)
        loss = ((engine(x) - y) ** 2).mean()
        engine.backward(loss)
        maybe_fault(state.step)
        engine.step()
        finish_step(state, loss, 0.2)


state = deepspeed.elastic.DeepSpeedState(engine, sys.argv[2], step=0, sizes=[])
train(state)
whole = engine.module_state_dict()  # every rank: ZeRO-3 gathers the partitioned parameters
if hvd.rank() == 0:
    write_result(sys.argv[1], sizes=state.sizes, params=[whole[n].flatten().tolist() for n in ("weight", "bias")],
                 global_steps=engine.global_steps)
print(f"worker {ME}: done as rank {hvd.rank()} of {hvd.size()}", flush=True)
