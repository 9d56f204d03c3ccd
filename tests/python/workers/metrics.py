"""hvd.stats()'s per-op counters against the ops run here, and the same numbers
scraped over HTTP from CHORUS_METRICS_PORT (+ the local rank) in Prometheus' text
format; a stranger that connects and sends nothing, or POSTs, does not stop it."""
import os
import re
import socket
import time
import urllib.request

import torch

import chorus.torch as hvd

hvd.init()
for i in range(5):
    hvd.allreduce(torch.ones(1000), name=f"ar{i}", op=hvd.Sum)
for i in range(3):
    hvd.allgather(torch.ones(2, 3), name=f"ag{i}")
ops = {(o["op"], o["path"]): o for o in hvd.stats()["ops"]}
ar = [o for (op, _), o in ops.items() if op == "allreduce"]
ag = [o for (op, _), o in ops.items() if op == "allgather"]
assert sum(o["count"] for o in ar) == 5 and sum(o["bytes"] for o in ar) == 5 * 4000, ar
assert sum(o["tensors"] for o in ag) == 3 and sum(o["bytes"] for o in ag) == 3 * 6 * 4, ag
assert all(o["seconds"] > 0 for o in ar), ar

port = int(os.environ["CHORUS_METRICS_PORT"]) + hvd.local_rank()
idle = socket.create_connection(("127.0.0.1", port))  # a stranger that sends nothing
post = socket.create_connection(("127.0.0.1", port))
post.sendall(b"POST /metrics HTTP/1.1\r\n\r\n")
t0 = time.time()
page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
assert time.time() - t0 < 8, "the idle stranger held the metrics port"
assert b"405" in post.recv(200)
idle.close()
post.close()


def metric(name, **labels):
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    total = 0.0
    for m in re.finditer(rf"^{name}{{([^}}]*)}} (\S+)$", page, re.M):
        if all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            total += float(m.group(2))
    return total


r = hvd.rank()
assert metric("chorus_ops_total", rank=r, process_set=0, op="allreduce") == 5, page
assert metric("chorus_op_bytes_total", rank=r, op="allgather") == 3 * 24, page
assert metric("chorus_world_size", rank=r) == hvd.size(), page
assert metric("chorus_cycles_total", rank=r, process_set=0) >= 1, page
assert "# TYPE chorus_op_seconds_total counter" in page
print(f"metrics ok rank {r}", flush=True)
hvd.shutdown()
