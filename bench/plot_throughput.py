"""Draws throughput per configuration from the training benches' JSON: bars per
configuration (and per round, where the bench repeats), for docs/.

    build/venv-tf/bin/python bench/tf_keras_bench.py --json t.json && /usr/bin/python3 bench/plot_throughput.py t.json tf.png
    chorusrun -np 2 python3 examples/pytorch/synthetic_benchmark.py --json s.json && /usr/bin/python3 bench/plot_throughput.py s.json s.png

    /usr/bin/python3 bench/autotune_bench.py --json a.json && /usr/bin/python3 bench/plot_throughput.py a.json a.png --model mlp --ranks 2

Reads bench/tf_keras_bench.py's {"rows": [{kind, samples_per_s, round}]},
examples/pytorch/synthetic_benchmark.py's [{framework, img_per_sec_total, ci}] and
bench/autotune_bench.py's {"rows": [{framework, model, ranks, img_per_sec_total, round}]}
(one model and rank count at a time: --model, --ranks).
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import statistics
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(data, model=None, ranks=None):
    """{configuration: [values]}, the unit and a title."""
    if isinstance(data, dict) and data.get("rows") and "framework" in data["rows"][0]:
        rows = [r for r in data["rows"] if (model is None or r["model"] == model) and
                (ranks is None or r["ranks"] == ranks)]
        if not rows:
            raise SystemExit(f"no rows for model {model} at {ranks} ranks")
        out = defaultdict(list)
        for r in rows:
            out[r["framework"]].append(r["img_per_sec_total"])
        return out, "images/s (all ranks)", f"{rows[0]['model']}, {rows[0]['ranks']} ranks: each setting's whole runs"
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
    p.add_argument("--model", help="autotune_bench rows: this model's")
    p.add_argument("--ranks", type=int, help="autotune_bench rows: at this many ranks")
    args = p.parse_args()
    with open(args.json) as f:
        data = json.load(f)
    values, unit, title = series(data, args.model, args.ranks)
    names = list(values)
    fig, ax = plt.subplots(figsize=(min(1.8 * len(names) + 2, 16), 4.5))
    medians = [statistics.median(values[n]) for n in names]
    ax.bar(names, medians, color=[f"C{i}" for i in range(len(names))], alpha=0.7, label="median")
    for i, n in enumerate(names):  # every round as a dot
        ax.scatter([i] * len(values[n]), values[n], color="black", s=12, zorder=3)
    for i, m in enumerate(medians):
        ax.annotate(f"{m:.0f}", (i, m), ha="center", va="bottom")
    if len(names) > 5:
        ax.tick_params(axis="x", labelrotation=35)
        plt.setp(ax.get_xticklabels(), ha="right")
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
