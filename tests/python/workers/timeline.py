"""hvd.start_timeline / stop_timeline: rank 0 writes a Chrome trace naming every tensor."""
import json
import os
import sys

import torch

import chorus.torch as hvd

hvd.init()
path = sys.argv[1]
hvd.start_timeline(path, mark_cycles=True)
t = torch.ones(3)
for _ in range(2):
    hvd.allreduce(t, name="py.t")
hvd.allgather(t, name="py.g")
hvd.barrier()
# Rank 0 writes the trace; another rank may look only after rank 0 has already stopped.
if hvd.rank() == 0:
    assert not os.path.exists(path), "the trace must appear only when complete"
hvd.stop_timeline()
if hvd.rank() == 0:
    trace = json.load(open(path))
    pids = {e["args"]["name"]: e["pid"] for e in trace if e.get("ph") == "M" and e["name"] == "process_name"}
    assert {"py.t", "py.g"} <= set(pids), pids
    spans = [e.get("name") for e in trace if e.get("pid") == pids["py.t"] and e["ph"] == "B"]
    assert spans == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE"] * 2, spans
    assert any(e.get("name") == "CYCLE_START" for e in trace)
hvd.shutdown()
print("timeline ok")
