"""Autotune against a grid search, on examples/pytorch/synthetic_benchmark.py.

For each model and rank count, whole runs alternate round by round: one per
grid point (fusion threshold x cycle time, the rest at their defaults; the
defaults are one of the points) and one with CHORUS_AUTOTUNE=1 that tunes
during its warm-up batches (the tuner's log must show it froze before timing
starts). Each run's throughput is the benchmark's own timed iterations. The
grid's best point (the highest of many noisy medians, so biased up), the
defaults and autotune then run again, alternating, for --confirm rounds; the
ratios printed (autotune against the best grid point and against the defaults)
are of those medians. Every run goes into the JSON (the rows plot with
bench/plot_throughput.py).

    /usr/bin/python3 bench/autotune_bench.py --ranks 2 4 --models mlp convnet --json bench/results/current/autotune.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("CHORUS_BUILD_DIR", os.path.join(ROOT, "build"))
DEFAULTS = (128 << 20, 1.0)


def run(ranks, model, env_extra, args, log=None):
    """img/s over all ranks of one synthetic_benchmark run with these settings."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"), **env_extra)
        cmd = [os.path.join(BUILD, "chorusrun"), "-np", str(ranks)]
        for k in env_extra:
            cmd += ["-x", k]
        cmd += [sys.executable, os.path.join(ROOT, "examples/pytorch/synthetic_benchmark.py"), "--model", model,
                "--skip-ddp", "--num-warmup-batches", str(args.warmup), "--num-iters", str(args.iters),
                "--num-batches-per-iter", str(args.batches), "--json", out]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
        if log is not None:
            with open(log) as f:
                if not any(line.startswith("best,") for line in f):
                    raise SystemExit(f"autotune did not freeze within {args.warmup} warm-up batches; "
                                     "raise --warmup or lower --samples")
        with open(out) as f:
            return json.load(f)[0]["img_per_sec_total"]


def autotune_env(args, log):
    return {"CHORUS_AUTOTUNE": "1", "CHORUS_AUTOTUNE_LOG": log,
            "CHORUS_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(args.samples),
            "CHORUS_AUTOTUNE_STEPS_PER_SAMPLE": str(args.steps_per_sample), "CHORUS_AUTOTUNE_WARMUP_SAMPLES": "2"}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--models", nargs="+", default=["mlp", "convnet"])
    p.add_argument("--fusion", type=int, nargs="+", default=[1 << 20, 8 << 20, 32 << 20, 128 << 20])
    p.add_argument("--cycle", type=float, nargs="+", default=[0.2, 1.0, 5.0])
    p.add_argument("--rounds", type=int, default=2, help="rounds of the grid search (and autotune beside it)")
    p.add_argument("--confirm", type=int, default=3,
                   help="rounds of the best grid point, the defaults and autotune again, which the ratios use")
    p.add_argument("--warmup", type=int, default=120, help="warm-up batches (autotune tunes during them)")
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--batches", type=int, default=5)
    p.add_argument("--samples", type=int, default=16, help="autotune's scored samples")
    p.add_argument("--steps-per-sample", type=int, default=4)
    p.add_argument("--json")
    args = p.parse_args()
    grid = [(f, c) for f in args.fusion for c in args.cycle]
    if DEFAULTS not in grid:
        grid.append(DEFAULTS)
    rows, summary = [], []
    for model in args.models:
        for ranks in args.ranks:
            got = {}
            for rnd in range(args.rounds):
                for f, c in grid:
                    name = f"grid {f >> 10} KiB {c:g} ms"
                    v = run(ranks, model, {"CHORUS_FUSION_THRESHOLD": str(f), "CHORUS_CYCLE_TIME": str(c)}, args)
                    got.setdefault(name, []).append(v)
                    rows.append({"framework": name, "ranks": ranks, "model": model, "round": rnd,
                                 "batch_size": 32, "img_per_sec_total": v, "ci": 0})
                with tempfile.TemporaryDirectory() as tmp:
                    log = os.path.join(tmp, "autotune.csv")
                    v = run(ranks, model, autotune_env(args, log), args, log=log)
                    with open(log) as f:
                        best = [line.strip() for line in f if line.startswith("best,")][0]
                got.setdefault("autotune", []).append(v)
                rows.append({"framework": "autotune", "ranks": ranks, "model": model, "round": rnd,
                             "batch_size": 32, "img_per_sec_total": v, "ci": 0, "chosen": best})
                print(f"{model} {ranks} ranks round {rnd}: autotune {v:.1f} img/s, chose {best}", flush=True)
            med = {k: statistics.median(v) for k, v in got.items()}
            best_grid = max((k for k in med if k != "autotune"), key=med.get)
            default = f"grid {DEFAULTS[0] >> 10} KiB {DEFAULTS[1]:g} ms"
            # The grid's best is the highest of many noisy medians (biased up): measured
            # again beside autotune and the defaults, alternating, before comparing.
            confirm = {best_grid: [], default: [], "autotune": []}
            settings = {n: {"CHORUS_FUSION_THRESHOLD": str(f), "CHORUS_CYCLE_TIME": str(c)}
                        for f, c in grid for n in [f"grid {f >> 10} KiB {c:g} ms"]}
            for rnd in range(args.confirm):
                for name in confirm:
                    if name == "autotune":
                        with tempfile.TemporaryDirectory() as tmp:
                            log = os.path.join(tmp, "autotune.csv")
                            v = run(ranks, model, autotune_env(args, log), args, log=log)
                    else:
                        v = run(ranks, model, settings[name], args)
                    confirm[name].append(v)
                    rows.append({"framework": name, "ranks": ranks, "model": model, "round": f"confirm {rnd}",
                                 "batch_size": 32, "img_per_sec_total": v, "ci": 0})
            cm = {k: statistics.median(v) for k, v in confirm.items()} if args.confirm else med
            s = {"model": model, "ranks": ranks, "autotune": cm["autotune"], "best_grid": best_grid,
                 "best_grid_value": cm[best_grid], "defaults": cm[default], "grid_search_medians": med,
                 "vs_best_grid": cm["autotune"] / cm[best_grid], "vs_defaults": cm["autotune"] / cm[default]}
            summary.append(s)
            print(f"{model} {ranks} ranks: autotune {s['autotune']:.1f} img/s = {s['vs_best_grid']:.3f}x the best "
                  f"grid point ({best_grid}: {s['best_grid_value']:.1f}), {s['vs_defaults']:.3f}x the defaults "
                  f"({s['defaults']:.1f})", flush=True)
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"args": vars(args), "summary": summary, "rows": rows}, f, indent=1)
        os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
