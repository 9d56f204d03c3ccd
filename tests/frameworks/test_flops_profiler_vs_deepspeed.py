"""deepspeed.profiling.flops_profiler under chorus and under the real DeepSpeed 0.19.8
(workers/flops_profile.py: get_model_profile on a small transformer-like model, and an
engine whose config switches the profiler on): the totals equal hand counts and
PyTorch's own FLOP counter, and both printouts are DeepSpeed's, module for module,
once the measured times (and DeepSpeed's prose, which chorus words its own way) are
set aside."""
import json
import re

from conftest import PYTHON, WORKERS, run, under_both

B, T, D, H = 2, 5, 16, 2


def hand_counts():
    """(flops, macs, params) of workers/flops_profile.py's Net, counted by hand."""
    tokens = B * T
    linear = lambda n_in, n_out, rows=tokens: rows * n_in * n_out  # noqa: E731  (MACs; bias not counted)
    macs = {"conv": 3 * D * D * B * T, "qkv": linear(D, 3 * D), "scores": B * H * T * (D // H) * T,
            "context": B * H * T * T * (D // H), "out": linear(D, D), "fc1": linear(D, 4 * D),
            "fc2": linear(4 * D, D), "head": linear(D, 3, rows=B)}
    flops = 2 * sum(macs.values())
    flops += D * B * T  # the convolution's bias, once per output
    flops += 5 * tokens * D  # LayerNorm with weights: 5 per element
    flops += B * H * T * T  # softmax: 1 per element
    flops += tokens * 4 * D  # GELU: 1 per element
    params = (D * D * 3 + D) + 2 * D + (D * 3 * D + 3 * D) + (D * D + D) + (D * 4 * D + 4 * D) + (4 * D * D + D) \
        + (D * 3 + 3)
    return flops, sum(macs.values()), params


TORCH_COUNT = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from flops_profile import Net, B, T, D
from torch.utils.flop_counter import FlopCounterMode
torch.manual_seed(0)
with FlopCounterMode(display=False) as counter:
    Net()(torch.randn(B, T, D))
print(json.dumps(counter.get_total_flops()))
"""


def masked(text):
    """The printout without what varies between runs (times, rates, DeepSpeed's prose)."""
    text = re.sub(r"[0-9.]+ (G|m|u|)s\b", "T", text)
    text = re.sub(r"[0-9.]+ [KMGT]?FLOPS", "F", text)
    text = re.sub(r"= [0-9.]+% latency", "= P% latency", text)
    text = re.sub(r"samples/second: +[0-9.]+", "samples/second: S", text)
    lines = [line.rstrip() for line in text.splitlines() if "fwd latency -" not in line]
    start = next(i for i, line in enumerate(lines) if line.startswith("Profile Summary"))
    body = [line for line in lines[start:] if re.match(r"^(\S.*:\s{2,}|depth|    |[A-Za-z]+\(|\s+\(|\)|-{20,})",
                                                        line) or line.startswith("Top ")]
    return body


def test_flops_profiler_equals_deepspeeds(tmp_path):
    folders, _ = under_both(1, "flops_profile.py", tmp_path)
    ds, ch = folders["deepspeed"], folders["chorus"]
    flops, macs, params = hand_counts()
    for folder in (ds, ch):
        totals = json.loads((folder / "totals.json").read_text())
        assert (totals["flops"], totals["macs"], totals["params"]) == (flops, macs, params), (folder, totals)
    torch_flops = json.loads(run([PYTHON, "-c", TORCH_COUNT, WORKERS]))
    assert torch_flops == 2 * macs  # PyTorch counts the matrix products only: 2 per MAC
    for name in ("profile.txt", "engine.txt"):
        want, got = masked((ds / name).read_text()), masked((ch / name).read_text())
        assert len(want) > 30 and got == want, "\n".join(f"{a!r} | {b!r}" for a, b in zip(want, got) if a != b)
    engine = (ch / "engine.txt").read_text()
    assert "Profile Summary at step 3:" in engine and "bwd latency:" in engine and "samples/second:" in engine


def test_autotuning_experiment_writes_deepspeeds_metrics_and_ends(tmp_path):
    """autotuning.enabled: the profile at start_profile_step, the metrics after end_profile_step, then the end."""
    folders, outs = under_both(1, "autotuning_experiment.py", tmp_path)
    for folder in folders.values():
        metrics = json.loads((folder / "metrics.json").read_text())
        assert sorted(metrics) == ["FLOPS_per_gpu", "bwd", "fwd", "latency", "rank", "step", "throughput"]
        assert metrics["rank"] == 0
        assert abs(metrics["latency"] - 2 * (metrics["fwd"] + metrics["bwd"] + metrics["step"])) < 1e-6 * \
            metrics["latency"]
        # FLOPS per GPU: 3 x the forward's flops, per micro-batch, over the step's latency (microseconds).
        flops = 3 * hand_counts()[0]
        assert abs(metrics["FLOPS_per_gpu"] - flops * 1e6 * 2 / metrics["latency"]) < 1e-6 * metrics["FLOPS_per_gpu"]
        assert abs(metrics["throughput"] - 2 * B * 1e6 / metrics["latency"]) < 1e-6 * metrics["throughput"]
    for out in outs.values():
        steps = [int(s) for s in re.findall(r"finished step (\d+)", out)]
        assert steps == [1, 2, 3, 4, 5], out[-3000:]
