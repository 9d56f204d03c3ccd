"""Pipeline parallelism beside pure data parallelism, on one model: samples/s, the
pipeline bubble each stage measured (time waiting for its neighbours, as a
fraction of the 1F1B schedule) against the ideal (p-1)/(m+p-1), and peak memory
per rank (resident set growth from before the model was built) against the
data-parallel run's.

    python3 bench/pipeline_bench.py [--ranks 2 4] [--micro-batches 8] [--steps 6] [--json out.json]

It runs chorusrun itself, one layout at a time; a layout's rank runs
`pipeline_bench.py --worker STAGES`.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(stages, micro, steps, width, layers):
    import torch
    import chorus.deepspeed as deepspeed
    import chorus.torch as hvd
    from chorus.deepspeed.pipe import LayerSpec, PipelineModule

    deepspeed.init_distributed()
    torch.set_num_threads(1)
    base = rss_mib()
    specs = []
    for _ in range(layers):
        specs += [LayerSpec(torch.nn.Linear, width, width), torch.nn.GELU()]
    config = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": micro,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 0}}
    loss_fn = torch.nn.MSELoss()
    if stages == 1:  # pure data parallelism: the whole model on every rank
        model = torch.nn.Sequential(*[s.build() if isinstance(s, LayerSpec) else s for s in specs])
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    else:
        net = PipelineModule(layers=specs, num_stages=stages, loss_fn=loss_fn, partition_method="parameters")
        engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=config)
    g = torch.Generator().manual_seed(hvd.rank())
    batches = [(torch.randn(16, width, generator=g), torch.randn(16, width, generator=g)) for _ in range(micro)]
    bubbles, times = [], []
    for step in range(steps):
        hvd.barrier()
        start = time.perf_counter()
        if stages == 1:
            for x, y in batches:
                loss = loss_fn(engine(x), y)
                engine.backward(loss)
                engine.step()
        else:
            engine.train_batch(iter(batches))
            if step > 0:
                bubbles.append(engine.wait_seconds / engine.batch_seconds)
        hvd.barrier()
        if step > 0:  # the first step warms up
            times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    dp = hvd.size() // stages
    row = {"time_s": sorted(times)[len(times) // 2], "peak_mib": peak,
           "bubble": sum(bubbles) / len(bubbles) if bubbles else 0.0}
    rows = hvd.allgather_object(row)
    if hvd.rank() == 0:
        t = max(r["time_s"] for r in rows)
        out = {"stages": stages, "dp": dp, "ranks": hvd.size(), "micro_batches": micro,
               "samples_per_s": 16 * micro * dp / t, "peak_mib_max": max(r["peak_mib"] for r in rows),
               "bubble_measured": sum(r["bubble"] for r in rows) / len(rows) if stages > 1 else 0.0,
               "bubble_ideal": (stages - 1) / (micro + stages - 1)}
        print("RESULT " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--json")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        return worker(args.worker, args.micro_batches, args.steps, args.width, args.layers)
    env = dict(os.environ, PYTHONPATH=os.path.join(args.build, "python"), OMP_NUM_THREADS="1")
    results = []
    for n in args.ranks:
        for stages in [1] + [p for p in (2, 4, 8) if p <= n and n % p == 0]:
            cmd = [os.path.join(args.build, "chorusrun"), "-np", str(n), sys.executable, os.path.abspath(__file__),
                   "--worker", str(stages), "--micro-batches", str(args.micro_batches), "--steps", str(args.steps),
                   "--width", str(args.width), "--layers", str(args.layers)]
            out = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            line = [ln for ln in out.stdout.splitlines() if "RESULT " in ln]
            if out.returncode or not line:
                raise SystemExit(out.stdout)
            results.append(json.loads(line[0].split("RESULT ", 1)[1]))
    print(f"{'ranks':>5} {'layout':>14} {'samples/s':>10} {'peak MiB':>9} {'vs DP':>6} {'bubble':>7} {'ideal':>6}")
    for r in results:
        dp_row = next(x for x in results if x["ranks"] == r["ranks"] and x["stages"] == 1)
        layout = f"{r['stages']}pp x {r['dp']}dp"
        print(f"{r['ranks']:>5} {layout:>14} {r['samples_per_s']:>10.1f} {r['peak_mib_max']:>9.1f} "
              f"{r['peak_mib_max'] / dp_row['peak_mib_max']:>6.2f} {r['bubble_measured']:>7.3f} {r['bubble_ideal']:>6.3f}")
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(results, f, indent=2)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
