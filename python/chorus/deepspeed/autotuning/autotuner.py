"""DeepSpeed's autotuner over chorusrun (chorusrun --autotuning tune|run ... script.py ...
--deepspeed_config ds_config.json): it runs the user's script as experiments, each a
chorusrun job whose config the engine reads with autotuning on (the engine profiles
steps start_profile_step..end_profile_step, writes the step's metrics and ends the
job), and keeps the config with the best metric.

As DeepSpeed 0.19.8's: a model-profile run first (parameters, and the activation memory
of one sample); then, for each ZeRO stage the config names ("stage": N, a list, or
"all") whose instantiation memory fits (DeepSpeed's estimate, for Adam), the micro-batch
sizes: the user's (or 1), the largest the memory allows (tried at 105%, 100% and 95%,
else found by bisection, stopping where the metric plateaus), and
num_tuning_micro_batch_sizes between half of it and it. With "fast": false, the stage's
other settings (DeepSpeed's default tuning space, merged with the lists the user gives)
are searched at the best micro-batch size, grid or random order, tuner_num_trials at
most, stopping after tuner_early_stopping experiments without a better metric. The
optimal config goes to results_dir/ds_config_optimal.json (with cmd_optimal.txt and a
summary); with run, the script then trains with it. Memory per rank: the GPU's, or on
a CPU the host's available memory shared by its ranks."""
import copy
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import sys

METRICS = {"throughput": ("throughput", True), "latency": ("latency", False), "flops": ("FLOPS_per_gpu", True)}
SPACES = {  # DeepSpeed's default tuning spaces beyond the stage and the micro-batch size
    0: {},
    1: {"reduce_bucket_size": [5e7, 5e8, 1e9], "allgather_bucket_size": [5e7, 5e8, 1e9]},
    2: {"overlap_comm": [True, False], "reduce_scatter": [False, True], "reduce_bucket_size": [5e7, 5e8, 1e9],
        "allgather_bucket_size": [5e7, 5e8, 1e9], "contiguous_gradients": [False, True]},
    3: {"overlap_comm": [True, False], "reduce_scatter": [False, True], "reduce_bucket_size": [5e7, 5e8, 1e9],
        "allgather_partitions": [True, False], "allgather_bucket_size": [5e7, 5e8, 1e9],
        "contiguous_gradients": [False, True]},
}
PLATEAU = 0.05  # (DeepSpeed's METRIC_PERCENT_DIFF_CONST)
NP_FLAGS = ("-np", "--np", "-n", "--num-proc", "--num_gpus", "--num_procs")


def _fail(msg):
    raise SystemExit(f"chorusrun --autotuning: {msg}")


class Autotuner:
    def __init__(self, chorusrun, launcher_args, command, ranks=None):
        self.chorusrun, self.launcher_args = chorusrun, list(launcher_args)
        if not command:
            _fail("no script given")
        self.command = list(command)
        flags = [i for i, a in enumerate(self.command) if a in ("--deepspeed_config", "--deepspeed")]
        if not flags or flags[-1] + 1 >= len(self.command):
            _fail("the script's arguments give no config (--deepspeed_config PATH or --deepspeed PATH)")
        self.config_at = flags[-1] + 1
        path = self.command[self.config_at]
        try:
            with open(path) as f:
                self.user_config = json.load(f)
        except (OSError, ValueError) as e:
            _fail(f"cannot read the config {path}: {e}")
        at = dict(self.user_config.get("autotuning") or {})
        self.at = at
        name = str(at.get("metric", "throughput")).lower()
        if name not in METRICS:
            _fail(f"'autotuning.metric' {at.get('metric')!r} is not one of throughput, latency, FLOPS")
        self.metric_key, self.higher_better = METRICS[name]
        tuner = str(at.get("tuner_type", "gridsearch"))
        if tuner == "model_based":
            _fail("'autotuning.tuner_type' model_based (DeepSpeed's XGBoost cost model) is not in chorus; use "
                  "gridsearch or random")
        if tuner not in ("gridsearch", "random"):
            _fail(f"'autotuning.tuner_type' {tuner!r} is not one of gridsearch, random, model_based")
        self.results_dir = os.path.abspath(at.get("results_dir") or "autotuning_results")
        self.exps_dir = os.path.abspath(at.get("exps_dir") or "autotuning_exps")
        if at.get("overwrite", True):
            for d in (self.results_dir, self.exps_dir):
                shutil.rmtree(d, ignore_errors=True)
        os.makedirs(self.results_dir, exist_ok=True)
        os.makedirs(self.exps_dir, exist_ok=True)
        self.ranks = ranks or self._ranks()
        self.records = []  # (space, name, config, metric or None)
        self.optimal = None

    # --- settings ---------------------------------------------------------------------------
    def _ranks(self):
        for i, a in enumerate(self.launcher_args):
            if a in NP_FLAGS and i + 1 < len(self.launcher_args):
                return int(self.launcher_args[i + 1])
            if a.startswith("--np="):
                return int(a.split("=", 1)[1])
        return 1

    def _int(self, key, default):
        v = self.at.get(key)
        return default if v is None else int(v)

    def gas(self):
        v = self.user_config.get("gradient_accumulation_steps", 1)
        if v == "auto":
            v = self._from_args("gradient_accumulation_steps") or 1
        return int(v) if isinstance(v, int) or str(v).isdigit() else 1

    def _from_args(self, key):
        arg = (self.at.get("arg_mappings") or {}).get(key)
        if arg and arg in self.command:
            i = self.command.index(arg)
            if i + 1 < len(self.command) and self.command[i + 1].isdigit():
                return int(self.command[i + 1])
        return None

    def stages(self):
        stage = (self.user_config.get("zero_optimization") or {}).get("stage", 0)
        stages = stage if isinstance(stage, list) else [stage]
        return [0, 1, 2, 3] if "all" in stages else sorted(int(s) for s in stages)

    def memory_per_rank(self):
        try:
            import torch
            if torch.cuda.is_available():
                return torch.cuda.get_device_properties(0).total_memory
        except ImportError:
            pass
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024 // max(1, self.ranks)

    def instantiation_memory(self, stage):
        """DeepSpeed's estimate for Adam: fp32 or 16-bit parameters and gradients, the optimizer's states."""
        n = self.model_info.get("num_params") or 0
        half = bool((self.user_config.get("fp16") or {}).get("enabled")) or \
            bool((self.user_config.get("bf16") or {}).get("enabled"))
        params, grads, optim = n * (2 if half else 4), n * (2 if half else 4), n * (16 if half else 8)
        world = self.ranks
        if stage >= 1:
            optim /= world
        if stage >= 2:
            grads /= world
        if stage >= 3:
            params /= world
        return (params + grads + optim) / self._int("mp_size", 1)

    # --- experiments --------------------------------------------------------------------------
    def experiment_config(self, stage, mbs, extra=None):
        cfg = copy.deepcopy(self.user_config)
        cfg.pop("train_batch_size", None)
        cfg["train_micro_batch_size_per_gpu"] = mbs
        cfg["gradient_accumulation_steps"] = self.gas()
        zero = {k: v for k, v in (cfg.get("zero_optimization") or {}).items() if not isinstance(v, list)}
        zero.update(extra or {}, stage=stage)
        cfg["zero_optimization"] = zero
        return cfg

    def _command(self, config_path, cfg):
        args = list(self.command)
        args[self.config_at] = config_path
        for key, arg in (self.at.get("arg_mappings") or {}).items():
            if arg in args and args.index(arg) + 1 < len(args) and key in cfg:
                args[args.index(arg) + 1] = str(cfg[key])
        return [self.chorusrun] + self.launcher_args + args

    def run(self, space, name, cfg, profile_model=False):
        """The experiment's metric, or None when it did not run to its metrics (an error, out of memory)."""
        for s, n, _, metric in self.records:
            if n == name:
                return metric
        where = os.path.join(self.exps_dir, name)
        os.makedirs(where, exist_ok=True)
        cfg = copy.deepcopy(cfg)
        tune = {"enabled": True, "metric_path": os.path.join(where, "metrics.json"),
                "start_profile_step": self._int("start_profile_step", 3),
                "end_profile_step": self._int("end_profile_step", 5)}
        if profile_model:
            tune.update(model_info={"profile": True}, model_info_path=os.path.join(where, "model_info.json"))
        cfg["autotuning"] = tune
        with open(os.path.join(where, "ds_config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        cmd = self._command(os.path.join(where, "ds_config.json"), cfg)
        with open(os.path.join(where, "cmd.txt"), "w") as f:
            f.write(" ".join(cmd) + "\n")
        print(f"autotuning: experiment {name}", flush=True)
        env = dict(os.environ, CHORUS_AUTOTUNING_EXPERIMENT=name)
        with open(os.path.join(where, "stdout.log"), "wb") as out, open(os.path.join(where, "stderr.log"), "wb") as err:
            subprocess.run(cmd, stdout=out, stderr=err, check=False, env=env)
        result = os.path.join(where, "model_info.json" if profile_model else "metrics.json")
        metric = None
        if os.path.exists(result):
            with open(result) as f:
                data = json.load(f)
            metric = data if profile_model else data.get(self.metric_key)
        if not profile_model:
            self.records.append((space, name, cfg, metric))
            print(f"autotuning: {name}: {self.metric_key} = {metric}", flush=True)
        return metric

    def better(self, a, b):
        return b is None or (a is not None and (a > b if self.higher_better else a < b))

    def best(self, space=None):
        best = None
        for record in self.records:
            if (space is None or record[0] == space) and record[3] is not None and \
                    (best is None or self.better(record[3], best[3])):
                best = record
        return best

    # --- the search ---------------------------------------------------------------------------
    def profile_model(self):
        given = self.at.get("model_info") or {}
        cfg = self.experiment_config(3, 1)
        info = self.run("profile", "profile_model_info", cfg, profile_model=True)
        if info is None:
            _fail(f"the model-profile run failed; see {os.path.join(self.exps_dir, 'profile_model_info')}/stderr.log")
        if given.get("num_params"):
            info["num_params"] = given["num_params"]
        self.model_info = info
        return info

    def _mbs_run(self, stage, mbs):
        return self.run(f"z{stage}", f"z{stage}_gas{self.gas()}_tmbspg{mbs}", self.experiment_config(stage, mbs))

    def min_max_mbs(self, stage, calculated_max):
        user = self.user_config.get("train_micro_batch_size_per_gpu")
        start = user if isinstance(user, int) else (self._from_args("train_micro_batch_size_per_gpu") or 1)
        floor = self._int("min_train_micro_batch_size_per_gpu", 1)
        if self._mbs_run(stage, start) is None:
            if start == floor or self._mbs_run(stage, floor) is None:
                return -1, -1
            start = floor
        top = min(calculated_max, self._int("max_train_micro_batch_size_per_gpu", 1024))
        for mbs in (math.ceil(1.05 * top), top, int(0.95 * top)):
            if mbs < start or mbs > self._int("max_train_micro_batch_size_per_gpu", 1024):
                continue
            if self._mbs_run(stage, mbs) is not None:
                return start, mbs
        low, high, last = start, top, self._mbs_run(stage, start)
        while low <= high:  # the largest that runs, unless the metric stops improving first
            mid = (low + high) // 2
            metric = self._mbs_run(stage, mid)
            if metric is None:
                high = mid - 1
                continue
            low = mid + 1
            if last and mid > start and abs(metric - last) / abs(last) < PLATEAU:
                break
            last = metric
        return start, low - 1

    def mbs_list(self, low, high):
        if low <= 0 or high <= 0:
            return []
        low = max(low, high // 2)
        stride = max(1, (high - low) // self._int("num_tuning_micro_batch_sizes", 3))
        max_per_rank = (self._int("max_train_batch_size", 0) // max(1, self.ranks)) or high * self.gas()
        min_gas = max_per_rank // high
        out = [m for m in range(low, high, stride) if max_per_rank // m != min_gas]
        return out + [high]

    def tune_stage(self, stage, activation):
        space = f"z{stage}"
        calculated = int((self.memory - self.instantiation_memory(stage)) // max(1, activation))
        user = self.user_config.get("train_micro_batch_size_per_gpu")
        if isinstance(user, list):
            sizes = [m for m in user if isinstance(m, int)]
        else:
            low, high = self.min_max_mbs(stage, calculated)
            sizes = self.mbs_list(low, high)
        for mbs in sizes:
            self._mbs_run(stage, mbs)
        best = self.best(space)
        if best is None or self.at.get("fast", True):
            return
        self.tune_settings(stage, best[2]["train_micro_batch_size_per_gpu"])

    def tune_settings(self, stage, mbs):
        space = dict(SPACES[stage])
        for k, v in (self.user_config.get("zero_optimization") or {}).items():
            if isinstance(v, list) and k != "stage":
                space[k] = v
        keys = sorted(space)
        combos = [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]
        if str(self.at.get("tuner_type", "gridsearch")) == "random":
            random.Random(0).shuffle(combos)
        stale, best = 0, self.best(f"z{stage}")[3]
        for combo in combos[:self._int("tuner_num_trials", 50)]:
            tag = "_".join(f"{k}{v}" for k, v in combo.items())
            metric = self.run(f"z{stage}", f"z{stage}_tmbspg{mbs}_{tag}", self.experiment_config(stage, mbs, combo))
            if self.better(metric, best):
                best, stale = metric, 0
            else:
                stale += 1
                if stale >= self._int("tuner_early_stopping", 5):
                    break

    def tune(self):
        info = self.profile_model()
        self.memory = self.memory_per_rank()
        activation = info.get("activation_mem_per_gpu") or 1
        print(f"autotuning: {info.get('num_params')} parameters, {activation} bytes of activations per sample, "
              f"{self.memory} bytes per rank", flush=True)
        for stage in self.stages():
            if self.memory > self.instantiation_memory(stage) + activation:
                self.tune_stage(stage, activation)
            else:
                print(f"autotuning: ZeRO stage {stage} does not fit ({self.instantiation_memory(stage):.0f} bytes "
                      "of model state per rank)", flush=True)
        self.write_results()

    def write_results(self):
        best = self.best()
        with open(os.path.join(self.results_dir, "summary.txt"), "w") as f:
            f.write(f"experiment\t{self.metric_key}\n")
            for _, name, _, metric in self.records:
                f.write(f"{name}\t{'failed' if metric is None else metric}\n")
            f.write(f"optimal\t{best[1] if best else 'none'}\n")
        if best is None:
            print("autotuning: no experiment ran to its metrics; no optimal config", flush=True)
            return
        cfg = copy.deepcopy(best[2])
        cfg.pop("autotuning", None)
        path = os.path.join(self.results_dir, "ds_config_optimal.json")
        with open(path + ".tmp", "w") as f:
            json.dump(cfg, f, indent=1)
        os.replace(path + ".tmp", path)
        self.optimal = self._command(path, cfg)
        with open(os.path.join(self.results_dir, "cmd_optimal.txt"), "w") as f:
            f.write(" ".join(self.optimal) + "\n")
        print(f"autotuning: optimal {best[1]} ({self.metric_key} {best[3]}); config in {path}", flush=True)

    def run_after_tuning(self):
        if self.optimal is None:
            return 1
        return subprocess.run(self.optimal, check=False).returncode


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4 or argv[0] not in ("tune", "run") or argv[1] != "--chorusrun" or "--" not in argv:
        _fail("usage: python -m chorus.deepspeed.autotuning tune|run --chorusrun PATH [--ranks N] -- "
              "[launcher options] "
              "script.py ... --deepspeed_config CONFIG")
    mode, chorusrun = argv[0], argv[2]
    ranks = int(argv[argv.index("--ranks") + 1]) if "--ranks" in argv[:argv.index("--")] else None
    rest = argv[argv.index("--") + 1:]
    # The launcher's options come first; the script (the first argument not an option or its value) starts the command.
    # (chorusrun's options that take a value; its parser accepted these arguments already)
    takes_value = {"-np", "--np", "-n", "--num-proc", "-H", "--hosts", "--hostfile", "--python", "-x",
                   "--num_gpus", "--num_procs", "--num_nodes", "--include", "--exclude", "--master_addr",
                   "--master_port", "--start-timeout", "--output-filename", "--log-level", "--bind-to", "-p",
                   "--ssh-port", "-i", "--ssh-identity-file", "--ssh-options", "--network-interface",
                   "--network-prefix", "--store-bind", "--store-port", "--secret", "--job-id", "--mpi-args",
                   "--enable_each_rank_log", "--timeline-filename", "--autotune-log-file", "--autotune-warmup-samples",
                   "--autotune-steps-per-sample", "--autotune-bayes-opt-max-samples",
                   "--autotune-gaussian-process-noise", "--min-np", "--max-np", "--host-discovery-script",
                   "--slots-per-host", "--slots", "--reset-limit", "--blacklist-after-failures", "--elastic-timeout"}
    i = 0
    while i < len(rest) and rest[i].startswith("-") and rest[i] != "--":
        i += 2 if rest[i] in takes_value else 3 if rest[i] == "--blacklist-cooldown-range" else 1
    launcher, command = rest[:i], rest[i + 1:] if i < len(rest) and rest[i] == "--" else rest[i:]
    tuner = Autotuner(chorusrun, launcher, command, ranks)
    tuner.tune()
    if mode == "run":
        return tuner.run_after_tuning()
    return 0 if tuner.optimal is not None else 1
