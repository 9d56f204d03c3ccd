"""A config's monitors (tensorboard, csv_monitor, wandb offline, wall_clock_breakdown)
under chorus and under the real DeepSpeed 0.19.8, the same script (workers/monitors.py):
the same files, the same events at the same steps, the same lr values, read back with
TensorBoard's reader, Python's csv and wandb's own record format; and on 2 ranks, one
writer (rank 0), its steps counting both ranks' samples."""
import csv
import glob
import json
import os
import struct

from conftest import PYTHON, chorusrun, run, under_both

TIMED = ("forward", "backward", "backward_inner", "backward_allreduce", "step")
EVENTS = {"Train/Samples/lr"} | {f"Train/Samples/elapsed_time_ms_{t}" for t in TIMED}


def read_csv(folder):
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, "csv", "job", "*.csv"))):
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        out[os.path.basename(path)] = (rows[0], [(int(s), float(v)) for s, v in rows[1:]])
    return out


READ_TB = """
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1]); acc.Reload()
print(json.dumps({t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"""


def read_tensorboard(folder):
    return json.loads(run([PYTHON, "-c", READ_TB, os.path.join(folder, "tb", "job")], chorus=False))


def read_wandb(folder):
    """Each history row's items, from the offline run's record log: a 7-byte file header,
    then LevelDB-style 32 KiB blocks of records (crc, length, type; full or in pieces),
    each record a wandb_internal Record."""
    from wandb.proto import wandb_internal_pb2 as pb
    [path] = glob.glob(os.path.join(folder, "wandb", "offline-run-*", "run-*.wandb"))
    data = open(path, "rb").read()
    assert data[:4] == b":W&B", data[:7]
    pos, piece, rows = 7, b"", []
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        piece += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or its last piece
            record = pb.Record()
            record.ParseFromString(piece)
            piece = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_monitors_write_what_deepspeed_writes(tmp_path):
    folders, _ = under_both(1, "monitors.py", tmp_path)
    ds, ch = folders["deepspeed"], folders["chorus"]
    want_csv, got_csv = read_csv(ds), read_csv(ch)
    assert sorted(got_csv) == sorted(want_csv) == sorted(e.replace("/", "_") + ".csv" for e in EVENTS)
    for name, (header, rows) in want_csv.items():
        got_header, got_rows = got_csv[name]
        assert got_header == header
        assert [s for s, _ in got_rows] == [s for s, _ in rows] == [8 * k for k in range(1, 7)]
        if name == "Train_Samples_lr.csv":
            assert got_rows == rows and rows[-1][1] == 0.01
        else:  # measured times: positive, each step's its own
            assert all(v > 0 for _, v in got_rows) and len({v for _, v in got_rows}) > 1, (name, got_rows)
    want_tb, got_tb = read_tensorboard(ds), read_tensorboard(ch)
    assert set(got_tb) == set(want_tb) == EVENTS
    assert [tuple(e) for e in got_tb["Train/Samples/lr"]] == [tuple(e) for e in want_tb["Train/Samples/lr"]]
    for tag in EVENTS:
        assert [s for s, _ in got_tb[tag]] == [s for s, _ in want_tb[tag]]
    lr = lambda rows: [r["Train/Samples/lr"] for r in rows if "Train/Samples/lr" in r]  # noqa: E731
    want_wb, got_wb = read_wandb(ds), read_wandb(ch)
    assert lr(got_wb) == lr(want_wb) == [v for _, v in want_csv["Train_Samples_lr.csv"][1]]
    assert {k for r in got_wb for k in r if k.startswith("Train/")} == EVENTS


def test_only_rank_zero_writes(tmp_path):
    chorusrun(2, "monitors.py", tmp_path)
    rows = read_csv(tmp_path)["Train_Samples_lr.csv"][1]
    assert [s for s, _ in rows] == [16 * k for k in range(1, 7)]  # 4 samples x 2 micro-batches x 2 ranks
    assert len(glob.glob(os.path.join(tmp_path, "tb", "job", "events.out.tfevents.*"))) == 1
    assert len(glob.glob(os.path.join(tmp_path, "wandb", "offline-run-*"))) == 1
