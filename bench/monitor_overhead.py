"""What DeepSpeed's observability sections cost a training step under chorus: the same
ZeRO-2 engine and batches with nothing on, with the csv and TensorBoard monitors (and
wall_clock_breakdown's timings), and with the communication logger, rounds interleaved
so the VM's drift falls on all alike. Run under chorusrun; rank 0 prints the table.

    PYTHONPATH=build/python build/chorusrun -np 2 --python build/venv-torch2/bin/python \\
        bench/monitor_overhead.py --steps 40 --rounds 3
"""
import argparse
import statistics
import tempfile
import time

import torch

import chorus.deepspeed as deepspeed
import chorus.torch as hvd

VARIANTS = {
    "off": {},
    "monitors": {"csv_monitor": {"enabled": True, "job_name": "csv"},
                 "tensorboard": {"enabled": True, "job_name": "tb"}, "wall_clock_breakdown": True},
    "comms_logger": {"comms_logger": {"enabled": True, "prof_all": True}},
}


def engine_for(extra, folder):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
    cfg = {"train_micro_batch_size_per_gpu": 16, "steps_per_print": 10 ** 6,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 2}}
    for key, section in extra.items():
        cfg[key] = dict(section, output_path=folder) if isinstance(section, dict) and "job_name" in section \
            else section
    engine, _, _, _ = deepspeed.initialize(model=model, config=cfg)
    return engine


def ms_per_step(engine, steps):
    x = torch.randn(16, 1024)
    for _ in range(3):  # warm-up
        engine.backward(engine(x).square().mean())
        engine.step()
    hvd.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.backward(engine(x).square().mean())
        engine.step()
    hvd.barrier()
    return (time.perf_counter() - t0) / steps * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    hvd.init()
    folder = tempfile.mkdtemp(prefix="monitor_overhead")
    engines = {name: engine_for(extra, folder) for name, extra in VARIANTS.items()}
    times = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, engine in engines.items():
            from chorus.deepspeed import comm
            comm.configure(engine._raw_config)  # (the logger is process-wide: each engine's own setting)
            times[name].append(ms_per_step(engine, args.steps))
    if hvd.rank() == 0:
        base = statistics.median(times["off"])
        print(f"{'variant':>14} {'ms/step (median)':>17} {'vs off':>7}  rounds")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"{name:>14} {med:>17.2f} {med / base:>7.3f}  {' '.join(f'{t:.1f}' for t in ts)}")


if __name__ == "__main__":
    main()
