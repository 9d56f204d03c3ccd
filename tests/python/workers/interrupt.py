"""A rank blocked in a collective that its peer has not started sees SIGINT and a
Python signal handler's exception; the op stays in flight and finishes later."""
import os
import signal
import threading
import time

import torch

import chorus.torch as hvd
from chorus.torch import mpi_ops

hvd.init()
r = hvd.rank()
assert hvd.size() == 2
if r == 1:
    def timed_out(*_):
        raise TimeoutError("python-level timeout")
    signal.signal(signal.SIGALRM, timed_out)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    start = time.monotonic()
    try:
        hvd.allreduce(torch.ones(4), op=hvd.Sum, name="never.1")  # rank 0 has not sent it
        raise AssertionError("allreduce returned without its peer")
    except TimeoutError:
        print(f"handler interrupted after {time.monotonic() - start:.1f}s", flush=True)

    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        hvd.allgather(torch.ones(2, 1), name="never.2")
        raise AssertionError("allgather returned without its peer")
    except KeyboardInterrupt:
        print("SIGINT interrupted the blocking call", flush=True)

    inplace = torch.ones(3)
    h = hvd.allreduce_async_(inplace, op=hvd.Sum, name="never.3")
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    try:
        hvd.synchronize(h)
        raise AssertionError("synchronize returned without its peer")
    except KeyboardInterrupt:
        print("SIGINT interrupted synchronize", flush=True)
    assert len(mpi_ops._abandoned) == 3
    hvd.barrier()
    # Rank 0 now runs the three ops: the abandoned ones finish, writing where they should.
    deadline = time.monotonic() + 30
    while not all(w.poll() for w, _ in mpi_ops._abandoned):
        assert time.monotonic() < deadline, "the abandoned ops never finished"
        time.sleep(0.01)
    assert inplace.tolist() == [2.0, 2.0, 2.0], inplace
else:
    hvd.barrier()  # waits for rank 1's interrupted calls
    assert hvd.allreduce(torch.ones(4), op=hvd.Sum, name="never.1").tolist() == [2.0] * 4
    assert hvd.allgather(torch.zeros(2, 1), name="never.2").flatten().tolist() == [0, 0, 1, 1]
    hvd.allreduce_(torch.ones(3), op=hvd.Sum, name="never.3")
hvd.barrier()
assert hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name="after").item() == 2.0
hvd.shutdown()
print(f"rank {r}: interrupt ok", flush=True)
