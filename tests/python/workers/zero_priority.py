"""set_gradient_priority: the ZeRO engine's gradient collectives carry their
parameters' priority, and those ready together run highest first. Each layer is
a unit of its own; at the accumulation boundary every unit's reduce-scatter is
submitted at once, last layer first (gradients arrive back to front). With the
first layer marked critical, its reduce-scatter must run first on rank 0's
timeline; unmarked, it runs last; with "layer_order" the four run first layer
first. argv: the trace path."""
import json
import sys

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd

deepspeed.init_distributed()
path = sys.argv[1]


def unit_order(critical):
    """Rank 0's reduce-scatters in the order they started, as unit numbers."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64, bias=False) for _ in range(4)])
    if critical == "layer_order":
        deepspeed.set_gradient_priority(model, "layer_order")
    elif critical:
        deepspeed.set_gradient_priority(model[0], 1)
    config = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "zero_optimization": {"stage": 1, "reduce_bucket_size": 64 * 64}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    trace = f"{path}.{critical}"
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
    op_span = [e for e in events if e.get("ph") == "B" and "transport" in e.get("args", {})]
    starts = sorted((e["ts"], names[e["pid"]]) for e in op_span
                    if e["name"].endswith("_REDUCESCATTER") and ".rs." in names.get(e["pid"], ""))
    order = [n for _, n in starts]
    assert len(order) == 4, order
    return [int(n.rsplit(".", 1)[1]) for n in order]


# Unit 3 holds the first layer (units are packed from the last layer back).
plain = unit_order(False)
critical = unit_order(True)
layers = unit_order("layer_order")
if hvd.rank() == 0:
    assert plain.index(3) == 3 and critical.index(3) == 0, (plain, critical)
    assert layers == [3, 2, 1, 0], layers
print(f"rank {hvd.rank()}: priority ok", flush=True)
