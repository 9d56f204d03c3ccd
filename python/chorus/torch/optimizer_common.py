"""What both DistributedOptimizers (averaging gradients, Adasum of updates) share."""
import weakref

# Every DistributedOptimizer, so that an elastic reset can drop a failed step's reductions.
_live = weakref.WeakSet()


def reset_all_in_flight():
    for opt in list(_live):
        opt._reset_in_flight()



def parameter_names(named_parameters, all_params):
    """{parameter: name} from model.named_parameters(), checked to cover all_params
    once each; "noname.<i>" in the optimizer's order when none were given."""
    if named_parameters is None:
        return {p: f"noname.{i}" for i, p in enumerate(all_params)}
    named = list(named_parameters)
    if any(not isinstance(p, tuple) for p in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"parameter names must be unique; repeated: {', '.join(dups)}")
    known = {id(p) for _, p in named}
    missing = [i for i, p in enumerate(all_params) if id(p) not in known]
    if missing:
        raise ValueError("named_parameters lacks some of the optimizer's parameters "
                         f"(positions {missing[:5]} in the optimizer's parameter list)")
    return {p: n for n, p in named}


def last_pass(opt, p):
    """Counts a backward pass that produced p's gradient; True when it is the
    backward_passes_per_step-th since the last step, so p's reduction starts now."""
    if opt._handles.get(p, (None, None))[0] is not None and opt._delay[p] <= 0:
        raise AssertionError(
            "gradients were computed more than backward_passes_per_step times before "
            "step(); raise backward_passes_per_step to accumulate gradients locally")
    opt._delay[p] -= 1
    return opt._delay[p] == 0
