"""Draws throughput per configuration from the training benches' JSON: bars per
configuration (and per round, where the bench repeats), for docs/.

    build/venv-tf/bin/python bench/tf_keras_bench.py --json t.json && /usr/bin/python3 bench/plot_throughput.py t.json tf.png
    chorusrun -np 2 python3 examples/pytorch/synthetic_benchmark.py --json s.json && /usr/bin/python3 bench/plot_throughput.py s.json s.png

Reads bench/tf_keras_bench.py's {"rows": [{kind, samples_per_s, round}]} and
examples/pytorch/synthetic_benchmark.py's [{framework, img_per_sec_total, ci}].
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import statistics
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(data):
    """{configuration: [values]}, the unit and a title."""
    if isinstance(data, dict) and "rows" in data:
        out = defaultdict(list)
        for r in data["rows"]:
            out[r["kind"]].append(r["samples_per_s"])
        a = data.get("args", {})
        return out, "samples/s", f"Keras step, {a.get('ranks', '?')} ranks, {a.get('batch', '?')} samples/rank/step"
    out = {r["framework"]: [r["img_per_sec_total"]] for r in data}
    first = data[0]
    return out, "images/s (all ranks)", f"{first['model']}, {first['ranks']} ranks, batch {first['batch_size']}/rank"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json")
    p.add_argument("png")
    args = p.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    values, unit, title = series(data)
    names = list(values)
    fig, ax = plt.subplots(figsize=(1.8 * len(names) + 2, 4))
    medians = [statistics.median(values[n]) for n in names]
    ax.bar(names, medians, color=[f"C{i}" for i in range(len(names))], alpha=0.7, label="median")
    for i, n in enumerate(names):  # every round as a dot
        ax.scatter([i] * len(values[n]), values[n], color="black", s=12, zorder=3)
    for i, m in enumerate(medians):
        ax.annotate(f"{m:.0f}", (i, m), ha="center", va="bottom")
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
