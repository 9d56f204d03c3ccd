"""Markdown tables of chorus-bench --json rows, one per collective: time per path and
chorus's speed-up over Open MPI (MPI's time / chorus's), for docs/performance.md.

    /usr/bin/python3 bench/results_table.py bench/results/current/*.json
"""
import json
import sys


def size(b):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n:
            return f"{b // n} {unit}"
    return f"{b} B"


def main(paths):
    for path in paths:
        with open(path) as f:
            rows = json.load(f)
        op = rows[0]["op"]
        by = {}
        for r in rows:
            by.setdefault(r["bytes"], {})[r["path"]] = r["time_us"]
        kinds = [k for k in ("chorus", "tcp", "mpi") if any(k in v for v in by.values())]
        print(f"\n**{op}**, {rows[0]['ranks']} ranks, {rows[0]['dtype']} (us; median of rounds)\n")
        print("| bytes | " + " | ".join(kinds) + " | chorus speed-up over MPI |")
        print("|---:|" + "---:|" * len(kinds) + "---:|")
        for b in sorted(by):
            t = by[b]
            cells = [f"{t[k]:.1f}" if k in t else "-" for k in kinds]
            ratio = f"{t['mpi'] / t['chorus']:.2f}x" if "mpi" in t and "chorus" in t else "-"
            print(f"| {size(b)} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1:])
