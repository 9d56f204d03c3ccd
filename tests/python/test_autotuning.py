"""chorusrun --autotuning run over a DeepSpeed script (workers/autotune_script.py) on 2
ranks, ZeRO stages 0 and 2, micro-batch sizes up to 8 of which 6 fit: the model-profile
run counts the parameters and the activations of a sample; every experiment above 6
fails and every one at or below runs to its metrics; the optimal config is the best
experiment's, written to results_dir; then the script trains with it. With "fast": false the
stage's other settings are searched at the best micro-batch size, within tuner_num_trials
and tuner_early_stopping."""
import json
import os
import subprocess
import sys

from conftest import BUILD, WORKERS


def autotune(tmp_path, mode, stages, fits, **tuning):
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": stages},
              "autotuning": dict({"enabled": True, "start_profile_step": 2, "end_profile_step": 3}, **tuning)}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"), OMP_NUM_THREADS="1")
    proc = subprocess.run([os.path.join(BUILD, "chorusrun"), "-np", "2", "--python", sys.executable, "--autotuning",
                           mode, os.path.join(WORKERS, "autotune_script.py"), "--fits", str(fits),
                           "--deepspeed_config", str(tmp_path / "ds.json")], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:]
    rows = [line.split("\t") for line in (tmp_path / "autotuning_results/summary.txt").read_text().splitlines()[1:]]
    runs = {name: (None if value == "failed" else float(value)) for name, value in rows if name != "optimal"}
    return proc, runs, dict(rows)["optimal"]


def test_autotuning_finds_the_best_config_that_fits_and_trains_with_it(tmp_path):
    proc, runs, optimal = autotune(tmp_path, "run", [0, 2], 6, fast=True, max_train_micro_batch_size_per_gpu=8,
                                   metric="throughput")
    info = json.loads((tmp_path / "autotuning_exps/profile_model_info/model_info.json").read_text())
    assert info["num_params"] == 32 * 64 + 64 + 64 * 4 + 4
    assert info["activation_mem_per_gpu"] > 0
    sizes = {name: int(name.rsplit("tmbspg", 1)[1]) for name in runs}
    assert {name.split("_")[0] for name in runs} == {"z0", "z2"}
    assert any(s > 6 for s in sizes.values()) and any(s == 6 for s in sizes.values())
    for name, metric in runs.items():
        assert (metric is None) == (sizes[name] > 6), (name, metric)
    assert runs[optimal] == max(m for m in runs.values() if m is not None)
    best = json.loads((tmp_path / "autotuning_results/ds_config_optimal.json").read_text())
    assert "autotuning" not in best and best["train_micro_batch_size_per_gpu"] == sizes[optimal]
    assert best["zero_optimization"]["stage"] == int(optimal[1])
    want = f"trained mbs={sizes[optimal]} stage={best['zero_optimization']['stage']}"
    assert proc.stdout.count(want) == 2, proc.stdout[-3000:]


def test_autotuning_searches_the_stages_settings_when_not_fast(tmp_path):
    proc, runs, optimal = autotune(tmp_path, "tune", 1, 3, fast=False, max_train_micro_batch_size_per_gpu=4,
                                   tuner_num_trials=4, tuner_early_stopping=2)
    assert "trained" not in proc.stdout  # (tune only)
    settings = [name for name in runs if "bucket_size" in name]
    best_mbs = max((m, int(name.rsplit("tmbspg", 1)[1])) for name, m in runs.items()
                   if m is not None and "bucket" not in name)[1]
    assert 2 <= len(settings) <= 4 and all(f"tmbspg{best_mbs}_" in name for name in settings), runs
    for name in settings:
        cfg = json.loads((tmp_path / "autotuning_exps" / name / "ds_config.json").read_text())
        assert {"reduce_bucket_size", "allgather_bucket_size"} <= set(cfg["zero_optimization"]), cfg
    assert runs[optimal] == max(m for m in runs.values() if m is not None)


def test_an_experiment_cannot_start_the_autotuner_again(tmp_path):
    """(--autotuning=tune's one-token form is taken out of the experiments' commands too.)"""
    proc = subprocess.run([os.path.join(BUILD, "chorusrun"), "-np", "1", "--autotuning=tune", "x.py",
                           "--deepspeed_config", "c.json"], env=dict(os.environ, CHORUS_AUTOTUNING_EXPERIMENT="z1"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert proc.returncode == 2 and "inside an autotuning experiment (z1)" in proc.stdout, proc.stdout
