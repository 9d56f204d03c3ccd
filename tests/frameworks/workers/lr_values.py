"""Every LR schedule of deepspeed.runtime.lr_schedules, stepped STEPS times, as
JSON on stdout: the lr of each param group (and OneCycle's betas) after
construction and after every step, a resumed copy, and the engine's lr under a
config's "scheduler" section. Runs under whatever `import deepspeed` is: the real
DeepSpeed (the reference) or chorus.deepspeed; the test compares the two.

    lr_values.py OUT.json
"""
import json
import sys

import torch

import deepspeed
from deepspeed.runtime import lr_schedules as ls

STEPS = 300

# (schedule, params, optimizer: "sgd" | "adam", param groups)
CASES = [
    ("WarmupLR", {"warmup_num_steps": 50}, "sgd", 1),  # warmup_max_lr: each group's lr
    ("WarmupLR", {"warmup_min_lr": 0.01, "warmup_max_lr": 0.2, "warmup_num_steps": 40, "warmup_type": "linear"},
     "adam", 2),
    ("WarmupLR", {"warmup_min_lr": [0.0, 0.05], "warmup_max_lr": [0.1, 0.3], "warmup_num_steps": 1}, "sgd", 2),
    ("WarmupDecayLR", {"total_num_steps": 300, "warmup_num_steps": 30}, "sgd", 1),
    ("WarmupDecayLR", {"total_num_steps": 200, "warmup_min_lr": 0.001, "warmup_max_lr": 0.05,
                       "warmup_num_steps": 17, "warmup_type": "linear"}, "adam", 1),
    ("WarmupDecayLR", {"total_num_steps": 10, "warmup_num_steps": 20}, "sgd", 1),  # total below the warmup
    ("WarmupCosineLR", {"total_num_steps": 20, "warmup_num_steps": 5}, "sgd", 1),
    ("WarmupCosineLR", {"total_num_steps": 300, "warmup_num_steps": 20, "warmup_min_ratio": 0.1}, "adam", 2),
    ("WarmupCosineLR", {"total_num_steps": 100, "warmup_num_steps": 9, "cos_min_ratio": 0.05,
                        "warmup_type": "linear"}, "sgd", 1),
    ("WarmupCosineLR", {"total_num_steps": 3, "warmup_num_steps": 5}, "sgd", 1),  # total below the warmup
    ("LRRangeTest", {"lr_range_test_min_lr": 0.01, "lr_range_test_step_size": 3, "lr_range_test_step_rate": 1.0,
                     "lr_range_test_staircase": True}, "sgd", 1),
    ("LRRangeTest", {"lr_range_test_min_lr": [0.001, 0.002], "lr_range_test_step_size": 7,
                     "lr_range_test_step_rate": 0.5}, "adam", 2),
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 4, "decay_step_size": 2,
                  "decay_lr_rate": 0.5}, "sgd", 1),
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 40, "decay_step_size": 10,
                  "decay_lr_rate": 0.1, "decay_mom_rate": 0.05}, "adam", 1),
    ("OneCycle", {"cycle_min_lr": [0.001, 0.01], "cycle_max_lr": [0.01, 0.2], "cycle_first_step_size": 30,
                  "cycle_second_step_size": 50, "cycle_first_stair_count": 4, "cycle_second_stair_count": 5,
                  "decay_step_size": 7, "decay_lr_rate": 0.3, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95},
     "adam", 2),
    ("OneCycle", {"cycle_min_lr": 0.02, "cycle_max_lr": 0.2, "cycle_first_step_size": 25}, "adam", 1),
]

ENGINE_CASES = [
    {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
    {"type": "WarmupDecayLR", "params": {"total_num_steps": 30, "warmup_num_steps": 5, "warmup_max_lr": 0.02}},
    {"type": "WarmupCosineLR", "params": {"total_num_steps": 30, "warmup_num_steps": 6}},
    {"type": "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 8,
                                    "decay_step_size": 3, "decay_lr_rate": 0.2}},
    {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.001, "lr_range_test_step_size": 4}},
    {"type": "WarmupLR", "params": {"warmup_min_lr": [0.001], "warmup_max_lr": [0.03], "warmup_num_steps": 6,
                                    "warmup_type": "linear"}},  # per-group lists
]


def optimizer(kind, groups):
    params = [[torch.nn.Parameter(torch.zeros(2))] for _ in range(groups)]
    group_list = [{"params": p, "lr": 0.1 * (i + 1)} for i, p in enumerate(params)]
    return torch.optim.SGD(group_list, lr=0.1) if kind == "sgd" else torch.optim.Adam(group_list, lr=0.1)


def snapshot(opt):
    return [[g["lr"], list(g["betas"]) if "betas" in g else None] for g in opt.param_groups]


def schedule_values(name, params, kind, groups):
    opt = optimizer(kind, groups)
    sched = getattr(ls, name)(opt, **params)
    out = {"start": snapshot(opt), "steps": []}
    for _ in range(STEPS):
        sched.step()
        out["steps"].append(snapshot(opt) + [list(sched.get_last_lr())])
        if len(out["steps"]) == STEPS // 2:
            saved = sched.state_dict()
    # A schedule restored from the half-way state continues as the original did.
    opt2 = optimizer(kind, groups)
    resumed = getattr(ls, name)(opt2, **params)
    resumed.load_state_dict(saved)
    out["resumed"] = []
    for _ in range(10):
        resumed.step()
        out["resumed"].append(snapshot(opt2))
    # An explicit iteration.
    sched.step(7)
    out["step7"] = snapshot(opt)
    return out


def engine_values(section):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    config = {"train_batch_size": 1, "scheduler": section, "steps_per_print": 10 ** 9}
    engine, eopt, _, sched = deepspeed.initialize(model=model, optimizer=opt, config=config)
    out = {"start": [list(engine.get_lr())], "steps": []}
    x = torch.ones(1, 4)
    for _ in range(25):
        loss = engine(x).sum()
        engine.backward(loss)
        engine.step()
        out["steps"].append([list(engine.get_lr()), [list(g.get("betas", ())) for g in eopt.param_groups]])
    return out


def main():
    result = {"deepspeed": deepspeed.__file__, "schedules": {}, "engine": {}}
    for i, (name, params, kind, groups) in enumerate(CASES):
        result["schedules"][f"{i}:{name}"] = schedule_values(name, params, kind, groups)
    for i, section in enumerate(ENGINE_CASES):
        result["engine"][f"{i}:{section['type']}"] = engine_values(section)
    with open(sys.argv[1], "w") as f:
        json.dump(result, f)
    print("wrote", sys.argv[1], flush=True)


if __name__ == "__main__":
    main()
