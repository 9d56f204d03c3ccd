"""bench/peers/run.py's JSON as one PNG (training throughput per model and rank count,
every whole run a dot and the median a bar; ZeRO milliseconds per step and peak RSS
per configuration) and as Markdown tables for docs/peers.md.

    /usr/bin/python3 bench/peers/report.py training.json zero.json --png docs/img/peers.png --markdown
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"chorus": "#1f77b4", "chorus_torch2": "#17becf", "horovod_gloo": "#ff7f0e", "horovod_mpi": "#d62728",
          "ddp": "#2ca02c", "deepspeed": "#9467bd", "local": "#bbbbbb"}


LABELS = {"chorus": "chorus (Debian's torch 1.13)", "chorus_torch2": "chorus (torch 2.5.1)",
          "horovod_gloo": "Horovod 0.28.1, gloo", "horovod_mpi": "Horovod 0.28.1, Open MPI", "ddp": "DDP (gloo)",
          "deepspeed": "DeepSpeed 0.19.8 (torch 2.5.1)", "local": "no exchange (compute ceiling)"}


def panel(ax, groups, frameworks, ylabel, title):
    """groups: [(label, {framework: row})]; bars are medians, dots each run."""
    width = 0.8 / max(1, len(frameworks))
    for i, fw in enumerate(frameworks):
        for g, (_, rows) in enumerate(groups):
            row = rows.get(fw)
            if not row or "median" not in row:
                continue
            x = g + (i - (len(frameworks) - 1) / 2) * width
            ax.bar(x, row["median"], width, color=COLORS.get(fw, "grey"), label=LABELS.get(fw, fw) if g == 0 else None)
            ax.plot([x] * len(row["runs"]), row["runs"], "k.", markersize=3)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([label for label, _ in groups], fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def draw(result, path):
    result = json.loads(json.dumps(result))  # the panels rescale rows in place
    train = [r for r in result["rows"] if r["kind"] == "training"]
    zero = [r for r in result["rows"] if r["kind"] == "zero"]
    panels = [p for p in (train, zero, zero) if p]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, 3.8 * len(panels)), squeeze=False)
    ax = iter(axes[:, 0])
    if train:
        # Each model's throughput relative to its own chorus median, so that shapes share an axis.
        groups = grouped_by(train, lambda r: f"{r['model']}\n{r['ranks']} ranks")
        for _, rows in groups:
            base = rows.get("chorus", {}).get("median")
            for row in rows.values():
                if base and "median" in row:
                    row["runs"] = [v / base for v in row["runs"]]
                    row["median"] = row["median"] / base
        fws = [f for f in COLORS if any(f in rows for _, rows in groups)]
        panel(next(ax), groups, fws, "samples/s relative to chorus",
              "Data-parallel training throughput (higher is better)")
    if zero:
        groups = grouped_by(zero, lambda r: f"stage {r['stage']}\n{r['dtype']}{' offload' if r['offload'] else ''}")
        fws = [f for f in COLORS if any(f in rows for _, rows in groups)]
        panel(next(ax), groups, fws, "ms per step", f"ZeRO, {zero[0]['ranks']} ranks: step time (lower is better)")
        for _, rows in groups:
            for row in rows.values():
                if "median" in row:
                    row["runs"] = [v / 2**20 for v in row["peak_rss_bytes"]]
                    row["median"] = row["median_peak_rss_bytes"] / 2**20
        panel(next(ax), groups, fws, "MiB", "ZeRO: peak RSS of the largest rank (lower is better)")
    fig.suptitle(f"chorus and its peers, {result['date']}, {result['machine']['cpus']} CPUs", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(result):
    """Training: medians in samples/s and chorus's ratios; ZeRO: ms/step, peak RSS per
    rank (MiB), chorus's speed and RSS against DeepSpeed, and the largest relative
    difference of the per-step losses."""
    lines = []
    train = [r for r in result["rows"] if r["kind"] == "training"]
    if train:
        fws = [f for f in COLORS if any(r["framework"] == f for r in train)]
        lines += ["| model | ranks | " + " | ".join(fws) + " | chorus / best Horovod | chorus / DDP |",
                  "|---" * (len(fws) + 4) + "|"]
        for (model, n), rows in grouped_by(train, lambda r: (r["model"], r["ranks"])):
            ratio = next((x for x in result["ratios"] if x["kind"] == "training" and x["model"] == model
                          and x["ranks"] == n), {})
            cells = [f"{rows[f]['median']:.1f}" if "median" in rows.get(f, {}) else "failed" for f in fws]
            lines.append(f"| {model} | {n} | " + " | ".join(cells) +
                         f" | {fmt(ratio.get('vs_horovod_best'))} | {fmt(ratio.get('vs_ddp'))} |")
        lines.append("")
    zero = [r for r in result["rows"] if r["kind"] == "zero"]
    if zero:
        fws = [f for f in COLORS if any(r["framework"] == f for r in zero)]
        lines += ["| stage | dtype | offload | " + " | ".join(f"{f} ms" for f in fws) + " | " +
                  " | ".join(f"{f} MiB" for f in fws) + " | speed vs DeepSpeed | RSS vs DeepSpeed | loss diff |",
                  "|---" * (2 * len(fws) + 6) + "|"]
        for (stage, dtype, off), rows in grouped_by(zero, lambda r: (r["stage"], r["dtype"], r["offload"])):
            ms = [f"{rows[f]['median']:.1f}" if "median" in rows.get(f, {}) else "failed" for f in fws]
            mib = [f"{rows[f]['median_peak_rss_bytes'] / 2**20:.0f}" if "median" in rows.get(f, {}) else "-"
                   for f in fws]
            ratio = {x["framework"]: x for x in result["ratios"] if x["kind"] == "zero" and x["stage"] == stage
                     and x["dtype"] == dtype and x["offload"] == off}
            pick = [ratio[f] for f in ("chorus_torch2", "chorus") if f in ratio]
            r = pick[0] if pick else {}
            loss = f"{r['max_rel_loss_diff']:.1e}" if "max_rel_loss_diff" in r else "-"
            lines.append(f"| {stage} | {dtype} | {'yes' if off else 'no'} | " + " | ".join(ms + mib) +
                         f" | {fmt(r.get('step_speed_vs_deepspeed'))} | {fmt(r.get('rss_vs_deepspeed'))} | {loss} |")
    return "\n".join(lines)


def fmt(x):
    return "-" if x is None else f"{x:.2f}x"


def grouped_by(rows, key):
    groups = {}
    for r in rows:
        groups.setdefault(key(r), {})[r["framework"]] = r
    return list(groups.items())


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="one or more run.py results (e.g. --only training and --only zero)")
    ap.add_argument("--png")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    result = None
    for path in args.json:
        with open(path) as f:
            part = json.load(f)
        if result is None:
            result = part
        else:
            result["rows"] += part["rows"]
            result["ratios"] += part["ratios"]
    if args.png:
        draw(result, args.png)
    if args.markdown:
        print(markdown(result))
