"""Draws bus bandwidth against message size, one line per path, from chorus-bench --json rows.

    chorusrun -np 2 chorus-bench --op allreduce -b 8 -e 256M -f 4 --compare tcp,mpi --json rows.json
    /usr/bin/python3 bench/plot_busbw.py rows.json docs/img/allreduce.png

Needs matplotlib (Debian: apt-get install python3-matplotlib); several files' rows are merged
into one JSON array first.
"""
import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


# One colour per path in every panel.
COLORS = {"chorus": "C0", "chorus, chorus outputs": "C4", "chorus, shared inputs": "C3", "tcp": "C1",
          "tcp, chorus outputs": "C5", "mpi": "C2"}


def label(row):
    """The row's path; chorus rows whose outputs chorus allocated (--outputs chorus) or whose
    inputs came from chorus::allocateShared (--inputs chorus) apart."""
    if row["path"] == "mpi":
        return "mpi"
    own = row.get("outputs") == "chorus" and row["op"] != "broadcast"
    shared_in = row.get("inputs") == "chorus"
    return row["path"] + (", chorus outputs" if own else "") + (", shared inputs" if shared_in else "")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="rows written by chorus-bench --json")
    parser.add_argument("png", help="output image")
    args = parser.parse_args()
    with open(args.json) as f:
        rows = json.load(f)
    ops = sorted({r["op"] for r in rows})
    cols = min(3, len(ops))
    nrows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4.5 * nrows), squeeze=False)
    for ax in axes.flat[len(ops):]:
        ax.set_visible(False)
    for ax, op in zip(axes.flat, ops):
        lines = defaultdict(lambda: defaultdict(list))
        for r in rows:
            if r["op"] == op and r["bytes"] > 0:
                lines[label(r)][r["bytes"]].append(r["busbw_gbs"])
        for path, by_size in sorted(lines.items()):
            # A path measured in several merged runs (MPI beside each) is drawn as their mean.
            pts = sorted((b, sum(v) / len(v)) for b, v in by_size.items())
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=path, color=COLORS.get(path))
        best = {}  # the lowest floor time per size, when several runs are merged
        for r in rows:
            if r["op"] == op and r.get("floor_time_us"):
                best[r["bytes"]] = min(best.get(r["bytes"], r["floor_time_us"]), r["floor_time_us"])
        ranks = rows[0]["ranks"]
        floor = sorted((b, 2 * b / t / 1e3 * (ranks - 1) / ranks) for b, t in best.items())
        if floor and op == "allreduce":
            ax.plot([p[0] for p in floor], [p[1] for p in floor], linestyle="--", color="gray",
                    label="memory floor")
        gather = {}  # allgather's own floor (streaming each piece into every place of the output)
        for r in rows:
            if r["op"] == op and r.get("gather_floor_us"):
                gather[r["bytes"]] = min(gather.get(r["bytes"], r["gather_floor_us"]), r["gather_floor_us"])
        if gather:
            pts = sorted((b, b / t / 1e3 * (ranks - 1) / ranks) for b, t in gather.items())
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=":", color="gray", label="gather floor")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{op}, {ranks} ranks, {rows[0]['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
