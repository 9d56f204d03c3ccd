"""The comet monitor under chorus and the real DeepSpeed 0.19.8 (workers/comet_monitor.py,
2 ranks, comet_ml offline, its backend address on loopback so nothing leaves the machine):
one archive (rank 0's), the same events at the same sample counts (samples_log_interval
thinning them as DeepSpeed's does), the same learning rates, the user's train_loss."""
import glob
import json
import zipfile

from conftest import chorusrun, real_deepspeed

LOOPBACK = "http://127.0.0.1:9/clientlib/"


def metrics(folder):
    archives = glob.glob(str(folder / "*.zip"))
    assert len(archives) == 1, archives
    with zipfile.ZipFile(archives[0]) as z:
        messages = [json.loads(line) for line in z.read("messages.json").decode().splitlines()]
    return [(m["payload"]["metric"]["metricName"], m["payload"]["metric"]["metricValue"],
             m["payload"]["metric"]["step"]) for m in messages
            if m.get("type") == "metric_msg" and m["payload"]["metric"]["metricName"].startswith("Train/")]


def test_comet_events_equal_deepspeeds(tmp_path):
    runs = {}
    for who, start in (("deepspeed", real_deepspeed), ("chorus", chorusrun)):
        folder = tmp_path / who
        folder.mkdir()
        extra = {"COMET_OFFLINE_DIRECTORY": str(folder), "COMET_URL_OVERRIDE": LOOPBACK}
        if who == "deepspeed":
            start(2, "comet_monitor.py", env_extra=extra)
        else:
            start(2, "comet_monitor.py", **extra)
        runs[who] = metrics(folder)
    want, got = runs["deepspeed"], runs["chorus"]
    assert [(n, s) for n, _, s in got] == [(n, s) for n, _, s in want], (got, want)
    lrs = [v for n, v, _ in want if n == "Train/Samples/lr"]
    assert len(lrs) >= 2 and len(set(lrs)) > 1  # (the warmup moves the rate between logged steps)
    steps = [s for n, _, s in want if n == "Train/Samples/train_loss"]
    assert steps[0] == 4 and all(b - a >= 8 for a, b in zip(steps, steps[1:]))  # (both ranks' samples)
    for (name, a, _), (_, b, _) in zip(got, want):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (name, a, b)
