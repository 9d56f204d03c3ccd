"""What the elastic test workers share: rank r's batch at step s, the fault that
FAULT=kill:WORKER:STEP asks for, the end of a step, and the result file."""
import json
import os
import signal
import time

import torch

import chorus.torch as hvd

ME = os.environ.get("CHORUS_ELASTIC_WORKER", "")
_FAULT = os.environ.get("FAULT", "").split(":")


def data(step, r, dtype=torch.float64):
    g = torch.Generator().manual_seed(1000 * step + r)
    x = torch.randn(8, 4, generator=g, dtype=dtype)
    return x, x.sum(1, keepdim=True) * 0.5 + 1.0


def maybe_fault(step):
    """Kills this worker with signal 9 when FAULT names it and this step (mid-step:
    the others wait in the gradient reduction)."""
    if _FAULT[0] == "kill" and _FAULT[1] + ":" + _FAULT[2] == ME and int(_FAULT[3]) == step:
        os.kill(os.getpid(), signal.SIGKILL)


def finish_step(state, loss, pause):
    state.sizes.append(hvd.size())
    state.step += 1
    if hvd.rank() == 0:
        print(f"step {state.step} size {hvd.size()} loss {loss.item():.6f}", flush=True)
    time.sleep(pause)
    state.commit()


def write_result(path, **result):
    with open(path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
