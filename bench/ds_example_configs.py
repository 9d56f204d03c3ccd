"""DeepSpeed's own example configs (DeepSpeedExamples: training/, compression/,
inference/): how many the real DeepSpeed 0.19.8 trains on this CPU, and how many
chorus trains to the same losses.

Each config is prepared as a new user's Hugging Face Trainer run would fill it
("auto" values, a client AdamW when the file has no optimizer; fp16 becomes bf16,
which DeepSpeed's CPU accelerator has; micro batch 4 so the small model fits),
then trained for --steps optimizer steps of a small model on one rank, once under
torchrun with the real DeepSpeed and once under chorusrun with chorus. A config
"trains" when it gives losses; "equal" when chorus's are within 1e-3 relative of
DeepSpeed's at every micro-step. DeepSpeedExamples is read from its git dir at
run time, never copied here.

    /usr/bin/python3 bench/ds_example_configs.py \\
        --examples /work/.mirror/deepspeedai+DeepSpeedExamples/repo --out bench/results/current/ds_example_configs.json
"""
import argparse
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("CHORUS_BUILD_DIR", os.path.join(ROOT, "build"))
DIRS = ("training/", "compression/", "inference/")
# Any of these at the top level makes a dict a DeepSpeed config (HF model configs and tokenizers have none).
DS_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization", "optimizer", "fp16", "bf16",
           "autotuning", "data_efficiency", "gradient_accumulation_steps"}
MICRO = 4
TIMEOUT = 240
TOL = 1e-3
STATUS = len("refuses: ") + 80  # table column: the status and an error's first 80 characters

# One trainer for both runtimes: `import deepspeed` is the real one or chorus's alias, by PYTHONPATH.
TRAINER = r'''
import json, os, sys
cfg_path, out_path = sys.argv[1], sys.argv[2]
result = {}
try:
    import torch
    import deepspeed
    result["deepspeed"] = deepspeed.__file__
    deepspeed.init_distributed()
    with open(cfg_path) as f:
        cfg = json.load(f)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    # No optimizer section: the HF Trainer passes its own AdamW.
    client = None if "optimizer" in cfg else torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=client, config=cfg)
    dtype = torch.bfloat16 if (cfg.get("bf16") or {}).get("enabled") is True else torch.float32
    batch = engine.train_micro_batch_size_per_gpu()
    gen = torch.Generator().manual_seed(1)
    losses = []
    # --steps optimizer steps: with gradient accumulation, that many times its micro-batches.
    for _ in range(@STEPS@ * engine.gradient_accumulation_steps()):
        x = torch.randn(batch, 16, generator=gen).to(engine.device, dtype)
        y = torch.randint(0, 4, (batch,), generator=gen).to(engine.device)
        loss = torch.nn.functional.cross_entropy(engine(x).float(), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    result["losses"] = losses
except BaseException as e:  # DeepSpeed's autotuner may sys.exit; record it like any refusal
    result["error"] = f"{type(e).__name__}: {e}"[:2000]
with open(out_path + ".tmp", "w") as f:
    json.dump(result, f)
os.replace(out_path + ".tmp", out_path)  # whole, even if the interpreter aborts at exit afterwards
'''


def git(repo, *args):
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def collect(repo, only):
    """{path: parsed config} of every DeepSpeed config under DIRS (templates with ${..} do not parse: skipped)."""
    found = {}
    for path in git(repo, "ls-tree", "-r", "--name-only", "HEAD").splitlines():
        if not path.endswith(".json") or not path.startswith(DIRS):
            continue
        try:
            cfg = json.loads(git(repo, "show", f"HEAD:{path}"))
        except (json.JSONDecodeError, subprocess.CalledProcessError):  # templates, absent large blobs
            continue
        if isinstance(cfg, dict) and DS_KEYS & set(cfg) and (only is None or only in path):
            found[path] = cfg
    return found


def drop_auto(d):
    """Removes every remaining "auto" (DeepSpeed then takes its default), at any depth."""
    if isinstance(d, dict):
        for k in [k for k, v in d.items() if v == "auto"]:
            del d[k]
        for v in d.values():
            drop_auto(v)


def prepare(original):
    """The config as the HF Trainer's DeepSpeed integration would hand it over, shrunk to a micro batch of 4."""
    cfg = copy.deepcopy(original)
    if cfg.get("train_micro_batch_size_per_gpu") == "auto":
        cfg["train_micro_batch_size_per_gpu"] = MICRO
    if cfg.get("gradient_accumulation_steps") == "auto":
        cfg["gradient_accumulation_steps"] = 1
    if cfg.get("train_batch_size") == "auto":
        cfg["train_batch_size"] = cfg.get("train_micro_batch_size_per_gpu", MICRO) * \
            cfg.get("gradient_accumulation_steps", 1)  # world size 1
    fills = {"optimizer": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
             "scheduler": {"warmup_min_lr": 0, "warmup_max_lr": 1e-3, "warmup_num_steps": 0, "total_num_steps": 10}}
    for section, values in fills.items():
        params = cfg[section].get("params") if isinstance(cfg.get(section), dict) else None
        for k, v in values.items():
            if isinstance(params, dict) and params.get(k) == "auto":
                params[k] = v
    if cfg.get("gradient_clipping") == "auto":
        cfg["gradient_clipping"] = 1.0
    for section in ("fp16", "bf16"):
        if isinstance(cfg.get(section), dict) and cfg[section].get("enabled") == "auto":
            cfg[section]["enabled"] = False
    drop_auto(cfg)  # zero_optimization.* and any other "auto": DeepSpeed's defaults
    # DeepSpeed's CPU accelerator has no fp16: the user switches to bf16 (fp16's loss-scale keys go with it).
    if isinstance(cfg.get("fp16"), dict) and cfg["fp16"].get("enabled") is True:
        del cfg["fp16"]
        cfg["bf16"] = {**(cfg.get("bf16") if isinstance(cfg.get("bf16"), dict) else {}), "enabled": True}
    cfg["train_micro_batch_size_per_gpu"] = MICRO
    if "train_batch_size" in cfg:
        cfg["train_batch_size"] = MICRO * cfg.get("gradient_accumulation_steps", 1)
    return cfg


def base_env(**extra):
    # No inherited PYTHONPATH, rank or launcher variables: each child sees only its own runtime.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("CHORUS_", "OMPI_", "PMI"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def run_child(cmd, env, cwd, out):
    """The trainer's result, or an error naming a timeout or the exit code and stderr's last lines."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group: a timeout ends torchrun's children too
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"error": f"Timeout: no result in {TIMEOUT} s"}
    if os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
        result["exit_code"] = proc.returncode  # the real DeepSpeed sometimes aborts at exit after writing
        return result
    tail = [line for line in (stderr or stdout).splitlines() if line.strip()][-10:]
    return {"error": f"Exit {proc.returncode}: {tail[-1] if tail else 'no output'}", "exit_code": proc.returncode,
            "stderr_tail": tail}


def check_module(result, marker):
    # A run on the wrong `deepspeed` (alias or overlay misplaced) would compare nothing: count it as an error.
    if "losses" in result and marker not in result.get("deepspeed", ""):
        return {"error": f"WrongModule: deepspeed imported from {result.get('deepspeed')}", **result,
                "losses_ignored": result.pop("losses")}
    return result


def equal(ds, ch):
    a, b = ds.get("losses"), ch.get("losses")
    return bool(a) and b is not None and len(a) == len(b) and all(abs(x - y) <= TOL * abs(x) for x, y in zip(a, b))


def status(r):
    return "trains" if "losses" in r else "refuses: " + r["error"].replace("\n", " ")[:80]


def write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", default="/work/.mirror/deepspeedai+DeepSpeedExamples/repo", help="git dir")
    p.add_argument("--out", default="results.json")
    p.add_argument("--torch2-python", default=os.path.join(BUILD, "venv-torch2", "bin", "python"))
    p.add_argument("--only", help="keep only configs whose path contains this")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    py = args.torch2_python
    overlay = os.path.join(os.path.dirname(os.path.dirname(py)), "overlays", "deepspeed")
    ds_env = base_env(PYTHONPATH=overlay, DS_ACCELERATOR="cpu",
                      TORCH_EXTENSIONS_DIR=os.path.join(BUILD, "torch_extensions"),
                      CXX=os.path.join(ROOT, "scripts", "cxx-nodebug"))  # (as the tests build its ops)
    ch_env = base_env(PYTHONPATH=os.path.join(BUILD, "python"))

    # In the venv `import deepspeed` is chorus's alias; the overlay on PYTHONPATH puts the real one first.
    alias = subprocess.run([py, "-m", "chorus.deepspeed.alias", "install"], env=ch_env, capture_output=True, text=True)
    if alias.returncode != 0:
        sys.exit(f"alias install failed:\n{alias.stdout}{alias.stderr}")

    commit = git(args.examples, "rev-parse", "HEAD").strip()
    configs = collect(args.examples, args.only)
    print(f"found {len(configs)} DeepSpeed configs under {', '.join(DIRS)} in {args.examples} at {commit[:12]}"
          + (f" (matching {args.only!r})" if args.only else ""), flush=True)

    results = {}
    data = {"examples": args.examples, "commit": commit, "steps": args.steps, "only": args.only, "results": results}
    with tempfile.TemporaryDirectory(prefix="ds_examples") as tmp:
        trainer = os.path.join(tmp, "trainer.py")
        with open(trainer, "w") as f:
            f.write(TRAINER.replace("@STEPS@", str(args.steps)))
        width = max([len(k) for k in configs] + [6])
        print(f"{'config':<{width}} | {'DeepSpeed':<{STATUS}} | {'chorus':<{STATUS}} | equal", flush=True)
        for i, (path, original) in enumerate(sorted(configs.items())):
            work = os.path.join(tmp, str(i))  # cwd too: files a config writes (monitors, profiles) land here
            os.makedirs(work)
            cfg = prepare(original)
            cfg_file = os.path.join(work, "config.json")
            write(cfg_file, cfg)
            ds = run_child([py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", trainer,
                            cfg_file, os.path.join(work, "ds.json")], ds_env, work, os.path.join(work, "ds.json"))
            ch = run_child([os.path.join(BUILD, "chorusrun"), "-np", "1", "--python", py, trainer, cfg_file,
                            os.path.join(work, "chorus.json")], ch_env, work, os.path.join(work, "chorus.json"))
            ds, ch = check_module(ds, "/overlays/deepspeed/"), check_module(ch, "chorus")
            results[path] = {"config": cfg, "deepspeed": ds, "chorus": ch, "equal": equal(ds, ch)}
            print(f"{path:<{width}} | {status(ds):<{STATUS}} | {status(ch):<{STATUS}} | "
                  f"{'yes' if results[path]['equal'] else 'no'}", flush=True)
            write(args.out, data)  # after every config: a long run keeps what it has

    ds_trains = [k for k, r in results.items() if "losses" in r["deepspeed"]]
    gaps = {k: results[k]["chorus"]["error"] for k in ds_trains if "losses" not in results[k]["chorus"]}
    data["totals"] = {
        "found": len(configs), "deepspeed_trains": len(ds_trains),
        "chorus_trains": sum("losses" in r["chorus"] for r in results.values()),
        "both_train_equal": sum(r["equal"] for r in results.values()),
        "both_train_differ": [k for k in ds_trains if "losses" in results[k]["chorus"] and not results[k]["equal"]],
        "chorus_refuses_deepspeed_trains": gaps,
        "chorus_trains_deepspeed_refuses": [k for k, r in results.items()
                                            if "losses" in r["chorus"] and "losses" not in r["deepspeed"]]}
    write(args.out, data)
    t = data["totals"]
    print(f"\nfound {t['found']}; DeepSpeed trains {t['deepspeed_trains']}; chorus trains {t['chorus_trains']}; "
          f"both train and equal {t['both_train_equal']}")
    for k in t["both_train_differ"]:
        print(f"  both train, losses differ: {k}: {results[k]['deepspeed']['losses']} vs {results[k]['chorus']['losses']}")
    print(f"chorus refuses where DeepSpeed trains: {len(gaps)}")
    for k, msg in gaps.items():
        print(f"  {k}: {msg.replace(chr(10), ' ')[:300]}")
    print(f"chorus trains where DeepSpeed refuses: {len(t['chorus_trains_deepspeed_refuses'])}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
