"""The flops profiler's printout, in DeepSpeed 0.19.8's layout: the summary (with an
engine, its sizes and the latencies of its forward, backward and step timers), the
top modules by parameters, MACs and latency at each depth, and the model tree with
each module's share."""
from collections import defaultdict

from chorus.deepspeed.profiling.flops_profiler.counts import (duration_to_string, flops_to_string, get_module_duration,
                                                              get_module_flops, get_module_macs, macs_to_string,
                                                              number_to_string, params_to_string)


def _line(label, value):
    print(f"{label:<70}  {value:<8}")


def print_summary(prof, profile_step):
    engine, model = prof.ds_engine, prof.model
    flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
    prof.flops, prof.macs, prof.params = flops, macs, params
    mp = engine.mp_world_size if engine is not None else 1
    print()
    print("-" * 26 + " DeepSpeed Flops Profiler " + "-" * 26)
    print(f"Profile Summary at step {profile_step}:")
    print("Terms: dp_size and mp_size are the data- and model-parallel sizes; params counts parameters,\n"
          "MACs multiply-accumulates, flops floating-point operations and FLOPS flops per second; the fwd, bwd and\n"
          "step latencies are the forward pass, the backward pass and the optimizer update, iter latency their sum.\n")
    expert = 0
    if engine is not None:
        _line("world size: ", engine.world_size)
        _line("data parallel size: ", engine.dp_world_size)
        _line("model parallel size: ", engine.mp_world_size)
        _line("batch size per GPU: ", engine.train_micro_batch_size_per_gpu())
        if engine.has_moe_layers:
            etp = engine.mp_world_size if prof.is_expert_tensor_parallelism_enabled() else 1
            _line("expert tensor parallelism enabled: ", int(etp > 1))
            expert = model.__model_expert_params__ * etp
    _line("params per GPU: ", params_to_string(params))
    nonexpert = model.__params__ * mp if engine is not None else 0
    if expert > 0:
        _line("params of model: ", params_to_string(nonexpert + expert))
        _line("   non-expert params of model: ", params_to_string(nonexpert))
        _line("   expert params of model: ", params_to_string(expert))
    else:
        _line("params of model = params per GPU * mp_size: ", params_to_string(nonexpert))
    _line("fwd MACs per GPU: ", macs_to_string(macs))
    _line("fwd flops per GPU: ", number_to_string(flops))
    _line("fwd flops of model = fwd flops per GPU * mp_size: ", number_to_string(flops * (mp or 1)))
    timers = engine.wall_clock_timers_ms() if engine is not None and engine.wall_clock_breakdown() else None
    fwd = timers["forward"] / 1000 if timers else prof.get_total_duration()
    _line("fwd latency: ", duration_to_string(fwd))
    _line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", flops_to_string(flops / fwd))
    if timers:
        bf = 2 + prof.recompute_fwd_factor
        bwd, step = timers["backward"] / 1000, timers["step"] / 1000
        it = fwd + bwd + step
        _line("bwd latency: ", duration_to_string(bwd))
        _line(f"bwd FLOPS per GPU = {bf:g} * fwd flops per GPU / bwd latency: ", flops_to_string(bf * flops / bwd))
        _line(f"fwd+bwd FLOPS per GPU = {bf + 1:g} * fwd flops per GPU / (fwd+bwd latency): ",
              flops_to_string((bf + 1) * flops / (fwd + bwd)))
        _line("step latency: ", duration_to_string(step))
        _line("iter latency: ", duration_to_string(it))
        _line(f"FLOPS per GPU = {bf + 1:g} * fwd flops per GPU / iter latency: ", flops_to_string((bf + 1) * flops / it))
        _line("samples/second: ", round(engine.train_micro_batch_size_per_gpu() * engine.world_size / it, 2))


def print_aggregated(prof, module_depth, top_modules):
    info = defaultdict(lambda: defaultdict(lambda: [0, 0, 0]))  # depth -> class -> [macs, params, duration]

    def walk(module, depth):
        row = info[depth][type(module).__name__]
        row[0] += get_module_macs(module)
        row[1] += module.__params__ + module.__expert_params__
        row[2] += get_module_duration(module)
        for child in module.children():
            walk(child, depth + 1)

    walk(prof.model, 0)
    depth = len(info) - 1 if module_depth == -1 else module_depth
    print()
    print("-" * 29 + " Aggregated Profile per GPU " + "-" * 29)
    print(f"Top {top_modules} modules in terms of params, MACs or fwd latency at different model depths:")
    for d in range(depth):
        rows = info[d]
        k = min(top_modules, len(rows))

        def top(index, fmt):
            best = sorted(rows.items(), key=lambda item: item[1][index], reverse=True)[:k]
            return {name: fmt(v[index]) for name, v in best}

        print(f"depth {d}:")
        print(f"    params      - {top(1, params_to_string)}")
        print(f"    MACs        - {top(0, macs_to_string)}")
        print(f"    fwd latency - {top(2, duration_to_string)}")


def print_detailed(prof):
    total_params, total_macs = prof.get_total_params(), prof.get_total_macs()
    total_duration = prof.get_total_duration()

    def share(value, total):
        return f"{round(100 * value / total, 2):g}" if total else "0"

    def extra(module):
        params = module.__params__ + module.__expert_params__
        macs, duration = get_module_macs(module), get_module_duration(module)
        flops = get_module_flops(module)
        items = [f"{params_to_string(params)} = {share(params, total_params)}% Params",
                 f"{macs_to_string(macs)} = {share(macs, total_macs)}% MACs",
                 f"{duration_to_string(duration)} = {share(duration, total_duration)}% latency",
                 flops_to_string(round(flops / duration, 2) if duration else 0)]
        own = module.original_extra_repr()
        return ", ".join(items + ([own] if own else []))

    def swap(module):
        module.original_extra_repr = module.extra_repr
        module.extra_repr = extra.__get__(module)

    def restore(module):
        module.extra_repr = module.original_extra_repr
        del module.original_extra_repr

    print()
    print("-" * 30 + " Detailed Profile per GPU " + "-" * 30)
    print("After each module's name: its params and their share of the total, its MACs and their share, its\n"
          "fwd latency and its share, and its fwd FLOPS.\n")
    print("Functionals a module calls directly (a loss, an activation) are counted in that module but are not\n"
          "printed as children, so a parent can exceed the sum of its children. FLOPs are a count from the\n"
          "operations' shapes, so the FLOPS derived from them may exceed what the hardware can reach. The top\n"
          "module's latency is measured around its forward and is below the engine's forward latency above.\n")
    prof.model.apply(swap)
    try:
        print(prof.model)
    finally:
        prof.model.apply(restore)
