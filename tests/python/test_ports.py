"""Ports chorus chooses stay usable: 3 jobs at once, 10 rounds, each starting
torch.distributed beside chorus on the MASTER_PORT chorusrun chose, while another
thread keeps taking ports from the kernel (bind to port 0) and giving them back.
Every job must succeed (a port chosen by bind-and-release used to be lost to such
a neighbour or to the job beside it: 8 of 30 failed with EADDRINUSE)."""
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

ROUNDS, JOBS = 10, 3


def churn(stop):
    held = []
    while not stop.is_set():
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        held.append(s)
        if len(held) > 64:
            held.pop(0).close()
    for s in held:
        s.close()


def test_concurrent_jobs_keep_their_ports(ranks):
    stop = threading.Event()
    churner = threading.Thread(target=churn, args=(stop,), daemon=True)
    churner.start()
    failures = []
    try:
        with ThreadPoolExecutor(JOBS) as pool:
            for round_ in range(ROUNDS):
                for proc in pool.map(lambda _: ranks(2, "torch_beside.py", timeout=120), range(JOBS)):
                    if proc.returncode != 0 or "[1]<stdout>:ok 1" not in proc.stdout:
                        failures.append((round_, proc.stdout[-2000:]))
    finally:
        stop.set()
        churner.join()
    assert not failures, f"{len(failures)} of {ROUNDS * JOBS} jobs failed; the first:\n{failures[0]}"
