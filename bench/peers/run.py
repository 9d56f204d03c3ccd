"""chorus beside the real Horovod 0.28.1 and DeepSpeed, each in its own processes,
whole runs alternated (order rotated every round) so that the VM's drift hits every
framework alike; medians over the rounds. Writes JSON and one PNG.

    bash bench/peers/run.sh --rounds 3     # all of it: prepare.sh, both halves, report.py
    bash bench/peers/prepare.sh            # or by hand: Horovod and DeepSpeed, cached
    /usr/bin/python3 bench/peers/run.py --json peers.json --png peers.png

Training: chorus (chorusrun), Horovod over gloo and over Open MPI (horovodrun), DDP
(gloo, one process per rank) on Debian's torch, 2 and 4 ranks, three model shapes; and
"local", each rank training alone with no exchange: the ceiling compute sets.
ZeRO: chorus.deepspeed (on Debian's torch and on the torch 2 venv) and DeepSpeed
(torch 2 venv, DS_ACCELERATOR=cpu, gloo), stages 1-3, with and without optimizer
offload, fp32 and bf16. MoE: DeepSpeed's MoE layers at ep 2 x dp 2 under ZeRO-2,
chorus.deepspeed beside DeepSpeed on the torch 2 venv (--only moe --torch2-venv
build/venv-torch2 uses scripts/torch2-venv.sh's DeepSpeed overlay). --quick is the
smallest size (CI runs it with chorus, DDP and chorus.deepspeed only: the peers
need the venvs).
"""
import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEBIAN_PYTHON = "/usr/bin/python3"
TRAIN_FRAMEWORKS = ["chorus", "horovod_gloo", "horovod_mpi", "ddp", "local"]
ZERO_FRAMEWORKS = ["chorus", "chorus_torch2", "deepspeed"]
# Timed steps per run: a few seconds of training each (the wide MLP's step is ~2 s).
STEPS = {"deep_mlp": 60, "wide_mlp": 8, "convnet": 30}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launcher:
    """Builds each framework's command line the way its users launch it."""

    def __init__(self, args):
        self.build = os.path.realpath(args.build_dir)
        self.hvd = os.path.join(os.path.realpath(args.peers_dir), "venv-horovod", "bin")
        self.torch2 = os.path.join(os.path.realpath(args.torch2_venv), "bin", "python")
        self.timeout = args.timeout

    def env(self, chorus=False, **extra):
        """The environment of one job: one torch thread, and chorus on the path only
        for chorus's own runs (the peers import nothing of it)."""
        env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
        env.pop("PYTHONPATH", None)
        if chorus:
            env["PYTHONPATH"] = os.path.join(self.build, "python")
        return env

    def chorusrun(self, n, python, script_args):
        return [[os.path.join(self.build, "chorusrun"), "-np", str(n), python] + script_args], [self.env(chorus=True)]

    def horovodrun(self, n, path, script_args):
        cmd = [os.path.join(self.hvd, "horovodrun"), "--" + path, "-np", str(n), "-H", f"localhost:{n}",
               os.path.join(self.hvd, "python")] + script_args
        return [cmd], [self.env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")]

    def per_rank(self, n, python, script_args, **extra):
        """One process per rank with torch.distributed's env:// variables (what torchrun
        sets; Debian's torch 1.13 torchrun fails on Python 3.11)."""
        env = self.env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(n),
                       LOCAL_WORLD_SIZE=str(n), **extra)
        return [[python] + script_args] * n, [dict(env, RANK=str(r), LOCAL_RANK=str(r)) for r in range(n)]

    def command(self, framework, n, script_args):
        if framework == "chorus":
            return self.chorusrun(n, DEBIAN_PYTHON, script_args)
        if framework == "chorus_torch2":
            return self.chorusrun(n, self.torch2, script_args)
        if framework in ("horovod_gloo", "horovod_mpi"):
            return self.horovodrun(n, framework.split("_")[1], script_args)
        if framework in ("ddp", "local"):
            return self.per_rank(n, DEBIAN_PYTHON, script_args)
        if framework == "deepspeed":
            cmds, envs = self.per_rank(n, self.torch2, script_args, DS_ACCELERATOR="cpu")
            # scripts/torch2-venv.sh keeps the real DeepSpeed in an overlay beside the venv's packages
            overlay = os.path.join(os.path.dirname(os.path.dirname(self.torch2)), "overlays", "deepspeed")
            if os.path.isdir(overlay):
                envs = [dict(e, PYTHONPATH=overlay) for e in envs]
            return cmds, envs
        raise ValueError(framework)

    def run(self, framework, n, script_args):
        """Runs one whole job; returns every rank's PEERS_RESULT, or raises with its output."""
        cmds, envs = self.command(framework, n, script_args)
        where = tempfile.mkdtemp(prefix="chorus-peers-")
        envs = [dict(e, PEERS_RESULT_DIR=where) for e in envs]
        procs = [subprocess.Popen(c, env=e, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True) for c, e in zip(cmds, envs)]
        out, failed, deadline = [], False, time.time() + self.timeout
        for p in procs:
            try:
                text, _ = p.communicate(timeout=max(1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    try:
                        os.killpg(q.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                text, failed = p.communicate()[0] + "\n[timed out]", True
            out.append(text)
            failed = failed or p.returncode != 0
        text = "\n".join(out)
        results = []
        for name in sorted(f for f in os.listdir(where) if f.endswith(".json")):
            with open(os.path.join(where, name)) as f:
                results.append(json.load(f))
        shutil.rmtree(where)
        if failed or len(results) != n:
            raise RuntimeError(f"{framework} x{n} {' '.join(script_args)} failed:\n" + text[-3000:])
        return sorted(results, key=lambda r: r["rank"])


def script_framework(fw):
    """The worker's --framework for a benchmark framework name."""
    return "chorus" if fw.startswith("chorus") else "horovod" if fw.startswith("horovod") else fw


def alternate(launcher, frameworks, n, script_args, rounds, log):
    """{framework: [every rank's result, per run]}: rounds of one whole run each, the
    order rotated every round; a framework that fails is reported and skipped after."""
    runs, errors = {fw: [] for fw in frameworks}, {}
    for rnd in range(rounds):
        shift = rnd % len(frameworks)
        for fw in frameworks[shift:] + frameworks[:shift]:
            if fw in errors:
                continue
            try:
                runs[fw].append(launcher.run(fw, n, script_args + ["--framework", script_framework(fw)]))
            except RuntimeError as e:
                errors[fw] = str(e)
                log(f"  {fw}: FAILED\n{e}")
    return runs, errors


def rows_of(runs, errors, common, value):
    """One row per framework: every run's value, their median, the peak RSS of the
    largest rank per run, and the error if it failed."""
    rows = []
    for fw, fw_runs in runs.items():
        values = [value(r) for r in fw_runs]
        row = dict(common, framework=fw, runs=values,
                   peak_rss_bytes=[max(x["peak_rss_bytes"] for x in r) for r in fw_runs])
        if values:
            row["median"] = statistics.median(values)
            row["median_peak_rss_bytes"] = statistics.median(row["peak_rss_bytes"])
        if fw in errors:
            row["error"] = errors[fw][-2000:]
        rows.append(row)
    return rows


def training(launcher, args, log):
    rows = []
    for n in args.ranks:
        for model in args.models:
            steps = args.steps or STEPS[model]
            script = [os.path.join(HERE, "train.py"), "--model", model, "--steps", str(steps),
                      "--warmup", str(args.warmup or max(2, steps // 4))]
            runs, errors = alternate(launcher, args.frameworks, n, script, args.rounds, log)
            got = rows_of(runs, errors, {"kind": "training", "model": model, "ranks": n, "unit": "samples/s"},
                          lambda r: r[0]["samples_per_sec"])
            log(f"{model} x{n}: " + ", ".join(f"{r['framework']} {r['median']:.1f}" for r in got if "median" in r)
                + " samples/s (median)")
            rows += got
    return rows


def zero(launcher, args, log):
    rows = []
    for dtype in args.zero_dtypes:
        for offload in args.zero_offload:
            for stage in args.zero_stages:
                script = [os.path.join(HERE, "zero.py"), "--stage", str(stage), "--dtype", dtype,
                          "--steps", str(args.zero_steps), "--width", str(args.zero_width),
                          "--depth", str(args.zero_depth)] + (["--offload"] if offload else [])
                runs, errors = alternate(launcher, args.zero_frameworks, args.zero_ranks, script, args.rounds, log)
                got = rows_of(runs, errors, {"kind": "zero", "stage": stage, "offload": offload, "dtype": dtype,
                                             "ranks": args.zero_ranks, "unit": "ms/step"},
                              lambda r: r[0]["ms_per_step"])
                for row in got:  # rank 0's, from the first run
                    fw_runs = runs[row["framework"]]
                    row["losses"] = fw_runs[0][0]["losses"] if fw_runs else None
                log(f"zero stage {stage} {dtype}{' offload' if offload else ''}: " +
                    ", ".join(f"{r['framework']} {r['median']:.1f} ms {r['median_peak_rss_bytes'] / 2**20:.0f} MiB"
                              for r in got if "median" in r))
                rows += got
    return rows


def moe(launcher, args, log):
    """DeepSpeed MoE layers at ep x dp on args.moe_ranks under ZeRO-2: chorus beside DeepSpeed."""
    frameworks = [f for f in args.zero_frameworks if f in ("chorus_torch2", "deepspeed")]
    if not frameworks:
        return []
    script = [os.path.join(HERE, "moe.py"), "--ep", str(args.moe_ep), "--stage", "2", "--steps", str(args.zero_steps)]
    runs, errors = alternate(launcher, frameworks, args.moe_ranks, script, args.rounds, log)
    got = rows_of(runs, errors, {"kind": "moe", "stage": 2, "offload": False, "dtype": "fp32",
                                 "ranks": args.moe_ranks, "ep": args.moe_ep, "unit": "ms/step"},
                  lambda r: max(x["ms_per_step"] for x in r))  # the slowest rank's step
    for row in got:
        fw_runs = runs[row["framework"]]
        row["losses"] = fw_runs[0][0]["losses"] if fw_runs else None
    log(f"moe ep {args.moe_ep} x dp {args.moe_ranks // args.moe_ep}: " +
        ", ".join(f"{r['framework']} {r['median']:.1f} ms" for r in got if "median" in r))
    return got


def ratios(rows):
    """The issue's targets as ratios of medians (> 1 is chorus ahead)."""
    out = []
    by = {}
    for r in rows:
        if "median" in r:
            key = (r["kind"], r.get("model"), r["ranks"], r.get("stage"), r.get("offload"), r.get("dtype"))
            by.setdefault(key, {})[r["framework"]] = r
    for key, fws in by.items():
        kind = key[0]
        if kind == "training" and "chorus" in fws:
            c = fws["chorus"]["median"]
            hvd = [fws[f]["median"] for f in ("horovod_gloo", "horovod_mpi") if f in fws]
            entry = {"kind": kind, "model": key[1], "ranks": key[2]}
            if hvd:
                entry["vs_horovod_best"] = c / max(hvd)
            if "ddp" in fws:
                entry["vs_ddp"] = c / fws["ddp"]["median"]
            if "local" in fws:  # how much of the compute-bound ceiling each framework reaches
                entry["of_ceiling"] = {f: fws[f]["median"] / fws["local"]["median"] for f in fws if f != "local"}
            out.append(entry)
        if kind in ("zero", "moe") and "deepspeed" in fws:
            ds = fws["deepspeed"]
            for fw in ("chorus", "chorus_torch2"):
                if fw not in fws:
                    continue
                c = fws[fw]
                entry = {"kind": kind, "stage": key[3], "offload": key[4], "dtype": key[5], "ranks": key[2],
                         "framework": fw, "step_speed_vs_deepspeed": ds["median"] / c["median"],
                         "rss_vs_deepspeed": c["median_peak_rss_bytes"] / ds["median_peak_rss_bytes"]}
                if c.get("losses") and ds.get("losses"):
                    entry["max_rel_loss_diff"] = max(abs(a - b) / max(abs(b), 1e-12)
                                                     for a, b in zip(c["losses"], ds["losses"]))
                out.append(entry)
    return out


def versions(launcher):
    def ask(python, code, env=None):
        try:
            return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120,
                                  env=env).stdout.strip()
        except OSError:
            return None
    return {"debian_torch": ask(DEBIAN_PYTHON, "import torch; print(torch.__version__)"),
            "horovod": ask(os.path.join(launcher.hvd, "python"), "import horovod; print(horovod.__version__)"),
            "torch2": ask(launcher.torch2, "import torch; print(torch.__version__)"),
            "deepspeed": ask(launcher.torch2, "import deepspeed; print(deepspeed.__version__)",
                             launcher.command("deepspeed", 1, [])[1][0])}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--peers-dir", default=os.environ.get("PEERS_DIR", os.path.join(ROOT, "build", "peers")))
    ap.add_argument("--torch2-venv", default=os.environ.get("TORCH2_VENV",
                                                            os.path.join(ROOT, "build", "venv-torch2.5.1")))
    ap.add_argument("--only", choices=["training", "zero", "moe"], help="one part of the benchmark")
    ap.add_argument("--moe-ranks", type=int, default=4)
    ap.add_argument("--moe-ep", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="whole runs per framework and configuration")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--models", nargs="+", default=["deep_mlp", "wide_mlp", "convnet"])
    ap.add_argument("--frameworks", nargs="+", default=TRAIN_FRAMEWORKS, choices=TRAIN_FRAMEWORKS)
    ap.add_argument("--steps", type=int, help="timed steps per run (default: per model, a few seconds)")
    ap.add_argument("--warmup", type=int, help="untimed steps before them (default: a quarter)")
    ap.add_argument("--zero-frameworks", nargs="+", default=ZERO_FRAMEWORKS, choices=ZERO_FRAMEWORKS)
    ap.add_argument("--zero-ranks", type=int, default=2)
    ap.add_argument("--zero-stages", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--zero-offload", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    ap.add_argument("--zero-dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--zero-steps", type=int, default=20)
    ap.add_argument("--zero-width", type=int, default=1024)
    ap.add_argument("--zero-depth", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="smallest size: 1 round, 2 ranks, few steps")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per whole run")
    ap.add_argument("--json", help="write the results here (atomically)")
    ap.add_argument("--png", help="draw them here")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.ranks, args.steps, args.warmup = 1, [2], 4, 2
        args.zero_steps, args.zero_width, args.zero_depth, args.zero_stages = 3, 256, 2, [1, 3]
        args.zero_offload, args.zero_dtypes = [0], ["fp32"]

    launcher = Launcher(args)
    needs = []  # (what must exist, the frameworks that need it), for the halves that run
    if args.only in (None, "training"):
        needs.append((os.path.join(launcher.hvd, "horovodrun"), [f for f in args.frameworks if "horovod" in f]))
    if args.only != "training":
        needs.append((launcher.torch2, [f for f in args.zero_frameworks if f in ("deepspeed", "chorus_torch2")]))
    for path, who in needs:
        if who and not os.path.exists(path):
            sys.exit(f"run.py: {path} is missing for {', '.join(who)}: run `bash bench/peers/prepare.sh` first, "
                     "or leave those frameworks out (--frameworks / --zero-frameworks)")
    log = lambda s: print(s, flush=True)  # noqa: E731
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": {"cpus": os.cpu_count(),
              "processor": platform.processor() or platform.machine()}, "versions": versions(launcher),
              "command": " ".join([os.path.basename(sys.executable)] + sys.argv), "rows": []}
    log(f"versions: {result['versions']}")
    if args.only in (None, "training"):
        result["rows"] += training(launcher, args, log)
    if args.only in (None, "zero"):
        result["rows"] += zero(launcher, args, log)
    if args.only in (None, "moe"):
        result["rows"] += moe(launcher, args, log)
    result["ratios"] = ratios(result["rows"])
    for r in result["ratios"]:
        log(json.dumps(r))
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.json)
    if args.png:
        from report import draw
        draw(result, args.png)
    failed = [r for r in result["rows"] if "error" in r]
    if failed:
        sys.exit(f"{len(failed)} framework runs failed: " + ", ".join(
            f"{r['framework']} ({r.get('model') or 'zero stage %s' % r.get('stage')})" for r in failed))


if __name__ == "__main__":
    main()
