"""The timeline: rank 0 writes a Chrome trace as the job runs, with Horovod's names.
argv: the trace path given to start_timeline, and one the HOROVOD_TIMELINE setting opened at init."""
import json
import os
import sys
import time

import torch

import chorus.torch as hvd

hvd.init()
path, at_init = sys.argv[1], os.environ.get("HOROVOD_TIMELINE")


def running(p):
    """A trace still being written: already a closed array (each write ends with the bracket)."""
    with open(p) as f:
        text = f.read()
    return json.loads(text)  # valid JSON while the job runs (and if it is killed)


def spans(trace, name):
    """The tensor's span names; an op span's transport prefix (SHM_, TCP_, INLINE_: the path it took) reads T_."""
    pids = {e["args"]["name"]: e["pid"] for e in trace if e.get("ph") == "M" and e["name"] == "process_name"}
    assert name in pids, sorted(pids)
    out = []
    for e in trace:
        if e.get("pid") != pids[name] or e["ph"] != "B":
            continue
        transport = e.get("args", {}).get("transport")
        out.append("T" + e["name"][len(transport):] if transport else e["name"])
    return out


if hvd.rank() == 0 and at_init:  # on disk from init on
    assert os.path.exists(at_init)
hvd.stop_timeline()  # the one HOROVOD_TIMELINE started, done before this test's own
hvd.start_timeline(path, mark_cycles=True)
t = torch.ones(3)
for _ in range(2):
    hvd.allreduce(t, name="py.t")
if hvd.rank() == 0:
    time.sleep(0.1)
    trace = running(path)  # read while the job runs
    assert spans(trace, "allreduce.py.t") == ["NEGOTIATE_ALLREDUCE", "QUEUE", "T_ALLREDUCE"] * 2, spans(trace, "allreduce.py.t")
hvd.allgather(t, name="py.g")
hvd.broadcast(t, root_rank=1, name="py.b")
hvd.barrier()
hvd.stop_timeline()
if hvd.rank() == 0:
    trace = json.load(open(path))  # complete now
    assert spans(trace, "allgather.py.g")[-1] == "T_ALLGATHER"
    assert spans(trace, "broadcast.py.b")[-1] == "T_BROADCAST"
    assert any(e.get("name") == "CYCLE_START" for e in trace)
    assert json.load(open(at_init))[0]["args"]["name"] == "chorus"
hvd.shutdown()
print("timeline ok")
