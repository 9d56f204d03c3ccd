"""set_gradient_priority: the ZeRO engine's gradient collectives carry their
parameters' priority, and those ready together run highest first. Each layer is
a unit of its own; at the accumulation boundary every unit's reduce-scatter is
submitted at once, last layer first (gradients arrive back to front). With the
first layer marked critical, its reduce-scatter must run first on rank 0's
timeline; unmarked, it runs last. argv: the trace path."""
import json
import sys

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd

deepspeed.init_distributed()
path = sys.argv[1]


def first_layer_position(critical):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64, bias=False) for _ in range(4)])
    if critical:
        deepspeed.set_gradient_priority(model[0], 1)
    config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_optimization": {"stage": 1, "reduce_bucket_size": 64 * 64}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    trace = f"{path}.{int(critical)}"
    hvd.barrier()
    hvd.start_timeline(trace)
    loss = engine(torch.randn(4, 64)).pow(2).sum()
    engine.backward(loss)
    engine.step()
    hvd.stop_timeline()
    if hvd.rank() != 0:
        return None
    events = json.load(open(trace))
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    starts = sorted((e["ts"], names[e["pid"]]) for e in events
                    if e.get("ph") == "B" and e.get("name") == "REDUCESCATTER" and ".rs." in names.get(e["pid"], ""))
    order = [n for _, n in starts]
    assert len(order) == 4, order
    # Unit 3 holds the first layer (units are packed from the last layer back).
    return [i for i, n in enumerate(order) if n.endswith(".rs.3")][0]


plain = first_layer_position(False)
critical = first_layer_position(True)
if hvd.rank() == 0:
    assert plain == 3 and critical == 0, (plain, critical)
print(f"rank {hvd.rank()}: priority ok", flush=True)
